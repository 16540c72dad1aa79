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
from tuiapp.core import launcher

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
        if "tuiapp.entry" in cmd and str(runs_dir) in cmd:
            found.append(process)
    return found


@pytest.mark.slow
def test_a_run_launched_in_the_browser_outlives_the_closed_tab(runs_dir):
    port = launcher.free_port()
    server = subprocess.Popen([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs_dir), "serve-ui", "--port",
                               str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        async def tab() -> None:
            async with aiohttp.ClientSession() as http:
                deadline = time.monotonic() + 60
                while True:  # the server is up once its page answers
                    try:
                        async with http.get(f"http://localhost:{port}/") as page:
                            assert page.status == 200 and f"ws://localhost:{port}/ws" in await page.text()
                            break
                    except aiohttp.ClientConnectionError:
                        assert time.monotonic() < deadline and server.poll() is None, server.stdout.read()
                        await asyncio.sleep(0.2)
                async with http.ws_connect(f"http://localhost:{port}/ws?width=80&height=24") as ws:
                    browser = Browser(ws)
                    await browser.until(lambda t: "no runs yet" in t, 60, "the empty history")
                    assert len(tui_processes(runs_dir)) == 1  # this tab's own TUI
                    await browser.keys("n")
                    await browser.until(lambda t: "New experiment" in t, 30, "the new-experiment form")
                    await browser.keys("\x12")  # ctrl+r: launch with the defaults (the tiny model, demo data)
                    await browser.until(lambda t: "running" in t.split("New experiment")[-1], 240, "the run's badge")

        asyncio.run(tab())
        run_dir = only_run(runs_dir)
        assert run_info(run_dir)["status"] == "running"
        wait_for(lambda: not tui_processes(runs_dir), timeout=30, interval=0.2, what="the closed tab's TUI to exit")
        time.sleep(2)
        assert run_info(run_dir)["status"] == "running"  # training goes on without the tab
        steps = len((run_dir / "metrics.jsonl").read_text().splitlines())
        wait_for(lambda: len((run_dir / "metrics.jsonl").read_text().splitlines()) > steps, timeout=60,
                 what="new steps after the tab closed")
        assert llmtui("stop", run_dir.name, runs_dir=runs_dir, timeout=120).returncode == 0
        assert server.poll() is None  # one tab closing leaves the server serving
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        output = server.communicate(timeout=30)[0]
    assert server.returncode == 0, output


@pytest.mark.parametrize("args, needles", [
    (["--port", "70000"], ["--port 70000", "1 to 65535"]),
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
