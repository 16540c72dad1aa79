"""`llmtui serve-ui`: the real textual-serve server, a browser's websocket (aiohttp's client), the
real TUI behind it. A run launched from the browser outlives the closed tab."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time

import aiohttp
import psutil
import pytest

from tests.e2e.helpers import ROOT, llmtui, only_run, run_info, wait_for
from tuiapp.cli.serve_ui import host_name, refusal
from tuiapp.core.plan import launcher

ESCAPES = re.compile(r"\x1b\[[0-9;?<>=]*[ -/]*[@-~]|\x1b[()][A-Z0-9]|\x1b[=>]")


class Browser:
    """One tab: the websocket, and the screen's text so far (escape sequences removed)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self.text = ""

    async def until(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self.text):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {what}; the screen's last text: {self.text[-800:]!r}")
            try:
                message = await self.ws.receive(timeout=min(left, 1.0))
            except asyncio.TimeoutError:
                continue
            if message.type == aiohttp.WSMsgType.BINARY:
                self.text += ESCAPES.sub("", message.data.decode("utf-8", "replace"))
            elif message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                raise AssertionError(f"the server closed the tab while waiting for {what}: {self.text[-800:]!r}")

    async def keys(self, text: str) -> None:
        await self.ws.send_json(["stdin", text])


def tui_processes(runs_dir) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmd = process.info.get("cmdline") or []
        if "tuiapp.cli" in cmd and "serve-ui" not in cmd and str(runs_dir) in cmd:
            found.append(process)
    return found


def start_server(runs_dir, *extra: str) -> tuple[subprocess.Popen, int, str]:
    """`llmtui serve-ui` on a free port; (process, port, the token its printed URL carries)."""
    port = launcher.free_port()
    server = subprocess.Popen([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs_dir), "serve-ui", "--port",
                               str(port), *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    line = server.stdout.readline()
    match = re.search(rf"http://localhost:{port}/\?token=([A-Za-z0-9_-]+)", line)
    assert match, line + (server.stdout.read() if server.poll() is not None else "")
    return server, port, match.group(1)


async def wait_up(http: aiohttp.ClientSession, server: subprocess.Popen, port: int, token: str) -> str:
    """The page's HTML, once the server answers."""
    deadline = time.monotonic() + 60
    while True:
        try:
            async with http.get(f"http://localhost:{port}/?token={token}") as page:
                assert page.status == 200, await page.text()
                return await page.text()
        except aiohttp.ClientConnectionError:
            assert time.monotonic() < deadline and server.poll() is None, server.stdout.read()
            await asyncio.sleep(0.2)


def end_server(server: subprocess.Popen) -> str:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
    return server.communicate(timeout=30)[0]


@pytest.mark.slow
def test_a_run_launched_in_the_browser_outlives_the_closed_tab(runs_dir):
    server, port, token = start_server(runs_dir)
    try:
        async def tab() -> None:
            async with aiohttp.ClientSession() as http:
                html = await wait_up(http, server, port, token)
                assert f"ws://localhost:{port}/ws/{token}" in html
                async with http.ws_connect(f"http://localhost:{port}/ws/{token}?width=80&height=24",
                                           origin=f"http://localhost:{port}") as ws:
                    browser = Browser(ws)
                    await browser.until(lambda t: "no runs yet" in t, 60, "the empty history")
                    assert len(tui_processes(runs_dir)) == 1  # this tab's own TUI
                    await browser.keys("n")
                    await browser.until(lambda t: "New experiment" in t, 30, "the new-experiment form")
                    await browser.keys("\x12")  # ctrl+r: launch with the defaults (the tiny model, demo data)
                    await browser.until(lambda t: "running" in t.split("New experiment")[-1], 240, "the run's badge")

        asyncio.run(tab())
        run_dir = only_run(runs_dir)
        # the badge reads running once steps count; run.json follows at the supervisor's next watch
        wait_for(lambda: run_info(run_dir)["status"] == "running", timeout=60, what="run.json's running")
        wait_for(lambda: not tui_processes(runs_dir), timeout=30, interval=0.2, what="the closed tab's TUI to exit")
        time.sleep(2)
        assert run_info(run_dir)["status"] == "running"  # training goes on without the tab
        steps = len((run_dir / "metrics.jsonl").read_text().splitlines())
        wait_for(lambda: len((run_dir / "metrics.jsonl").read_text().splitlines()) > steps, timeout=60,
                 what="new steps after the tab closed")
        assert llmtui("stop", run_dir.name, runs_dir=runs_dir, timeout=120).returncode == 0
        assert server.poll() is None  # one tab closing leaves the server serving
    finally:
        output = end_server(server)
    assert server.returncode == 0, output


@pytest.mark.parametrize("args, needles", [
    (["--port", "70000"], ["--port: 70000", "1 to 65535"]),
    (["--host", "nosuch.invalid"], ["--host nosuch.invalid", "localhost"]),
    (["--port", "{busy}"], ["cannot listen on localhost:", "another --port"]),
])
def test_bad_address_is_a_clear_error_before_serving(tmp_path, args, needles):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        args = [a.replace("{busy}", str(busy.getsockname()[1])) for a in args]
        result = llmtui("serve-ui", *args, runs_dir=tmp_path, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "Serving" not in result.stdout
    for needle in needles:
        assert needle in result.stderr, result.stderr


# ---------------------------------------------------------------- who may drive the page


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    server, port, token = start_server(tmp_path_factory.mktemp("runs"))

    async def up() -> None:
        async with aiohttp.ClientSession() as http:
            await wait_up(http, server, port, token)

    asyncio.run(up())
    yield port, token
    end_server(server)


def _get(url: str, headers: dict | None = None) -> tuple[int, str]:
    async def go():
        async with aiohttp.ClientSession() as http, http.get(url, headers=headers or {}) as response:
            return response.status, await response.text()

    return asyncio.run(go())


def _ws_status(url: str, headers: dict | None = None) -> int:
    """101 when the WebSocket opens (then closed at once), else the HTTP status of the refusal."""
    async def go():
        async with aiohttp.ClientSession() as http:
            try:
                async with http.ws_connect(url, headers=headers or {}):
                    return 101
            except aiohttp.WSServerHandshakeError as exc:
                return exc.status

    return asyncio.run(go())


def test_the_printed_url_opens_the_page_and_its_websocket(served):
    port, token = served
    status, html = _get(f"http://localhost:{port}/?token={token}")
    assert status == 200 and f"ws://localhost:{port}/ws/{token}" in html
    own = {"Origin": f"http://localhost:{port}"}
    assert _ws_status(f"http://localhost:{port}/ws/{token}?width=80&height=24", own) == 101
    assert _ws_status(f"http://127.0.0.1:{port}/ws/{token}", {"Origin": f"http://127.0.0.1:{port}"}) == 101


@pytest.mark.parametrize("what", ["no token", "wrong token", "token of the right length"])
def test_the_page_and_the_websocket_refuse_a_missing_or_wrong_token(served, what):
    port, token = served
    given = {"no token": "", "wrong token": "guess", "token of the right length": "A" * len(token)}[what]
    status, body = _get(f"http://localhost:{port}/" + (f"?token={given}" if given else ""))
    assert status == 403 and "token" in body
    assert _ws_status(f"http://localhost:{port}/ws/{given}") in (403, 404)
    assert _ws_status(f"http://localhost:{port}/ws") == 404  # textual-serve's own tokenless path is gone


def test_a_page_of_another_origin_cannot_open_the_websocket(served):
    port, token = served
    for origin in ("http://evil.example.com", f"http://evil.example.com:{port}", "null",
                   f"http://localhost:{port + 1}"):
        assert _ws_status(f"http://localhost:{port}/ws/{token}", {"Origin": origin}) == 403, origin
    status, body = _get(f"http://localhost:{port}/?token={token}", {"Origin": "http://evil.example.com"})
    assert status == 403 and "Origin" in body


def test_dns_rebinding_a_foreign_host_header_is_refused(served):
    port, token = served
    for host in (f"evil.example.com:{port}", "evil.example.com", f"localhost.evil.example.com:{port}"):
        status, body = _get(f"http://127.0.0.1:{port}/?token={token}", {"Host": host})
        assert status == 403 and "Host" in body, host
        origin = {"Host": host, "Origin": f"http://{host}"}
        assert _ws_status(f"http://127.0.0.1:{port}/ws/{token}", origin) == 403, host


def test_listening_beyond_loopback_needs_allow_remote(tmp_path):
    result = llmtui("serve-ui", "--host", "0.0.0.0", "--port", str(launcher.free_port()), runs_dir=tmp_path, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--allow-remote" in result.stderr and "ssh -L" in result.stderr and "Serving" not in result.stdout


@pytest.mark.parametrize("header, name", [("localhost:8000", "localhost"), ("[::1]:8000", "::1"), ("::1", "::1"),
                                          ("Example.COM", "example.com")])
def test_host_names_are_read_from_the_host_header(header, name):
    assert host_name(header) == name


def test_refusal_rules_without_a_server():
    class Request:
        def __init__(self, path, host="localhost:8000", headers=None, query=None):
            self.path, self.host, self.headers, self.query = path, host, headers or {}, query or {}

    allowed = {"localhost", "127.0.0.1", "::1"}
    assert refusal(Request("/", query={"token": "t0k"}), allowed, "t0k") is None
    assert refusal(Request("/static/js/textual.js"), allowed, "t0k") is None  # public files, Host still checked
    assert "Host" in refusal(Request("/static/js/textual.js", host="evil.example:80"), allowed, "t0k")
    assert "token" in refusal(Request("/ws/nope"), allowed, "t0k")
    assert refusal(Request("/ws/t0k", headers={"Origin": "http://localhost:8000"}), allowed, "t0k") is None
