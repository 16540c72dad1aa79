"""Served models in the TUI: the history marks a served run (⇄, its URL in the detail line, a count
in the status line), V (or the palette's "Served") lists every served model (run, URL, state,
backend), d shows doctor's report on its server, x stops it. With a real `llmtui serve` server of
the tiny SFT run (tests/after_runs.py), and snapshots at 80x24 of a server that is still loading
(a real process that does not answer yet, so the frame is deterministic)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys

import psutil
import pytest
from ui_fixtures import screen_text, test_app, wait_for

from tests.after_runs import sft_run
from tests.e2e.helpers import llmtui
from tuiapp.core.plan import launcher
from tuiapp.core.store import queue, served
from tuiapp.core.store.runs import Run
from tuiapp.ui.screens.confirm import ConfirmScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.report import ReportScreen
from tuiapp.ui.screens.served import ServedScreen
from tuiapp.ui.widgets.runs_table import RunsTable

SFT_FIXTURE = "20260101-000218-sft-f004"


@pytest.fixture
def loading_server(runs_root):
    """A process in its own session recorded as the sft fixture run's server, on a port nothing
    answers on: the TUI sees a live server that is still loading."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                            stdin=subprocess.DEVNULL)
    run_dir = runs_root / SFT_FIXTURE
    served.write_record(run_dir, {"pid": proc.pid, "pgid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(),
                                  "host": "localhost", "port": 9, "backend": "transformers", "model": SFT_FIXTURE,
                                  "target": "final", "auth": False, "gpus": []})
    yield run_dir
    served.stop(run_dir, grace_s=5)
    proc.wait(timeout=10)


async def _history(pilot):
    await wait_for(pilot, lambda: pilot.app.screen.summarized, what="history")
    await wait_for(pilot, lambda: pilot.app.screen.query_one(RunsTable).serving, what="the served marker")
    table = pilot.app.screen.query_one(RunsTable)
    table.move_to_id(SFT_FIXTURE)
    await pilot.pause()


def test_history_marks_a_served_run_80x24(snap_compare, runs_root, tmp_path, loading_server):
    assert snap_compare(test_app(runs_root, tmp_path, live=False), terminal_size=(80, 24), run_before=_history)


def test_served_list_80x24(snap_compare, runs_root, tmp_path, loading_server):
    async def run_before(pilot):
        await _history(pilot)
        await pilot.press("V")
        await wait_for(pilot, lambda: isinstance(pilot.app.screen, ServedScreen) and pilot.app.screen.models,
                       what="the served list")

    assert snap_compare(test_app(runs_root, tmp_path, live=False), terminal_size=(80, 24), run_before=run_before)


def test_x_in_the_served_list_asks_before_it_stops_a_model(runs_root, tmp_path, loading_server):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await _history(pilot)
            await pilot.press("V")
            await wait_for(pilot, lambda: isinstance(app.screen, ServedScreen) and app.screen.models, what="the list")
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
            name = Run(runs_root / SFT_FIXTURE).load().record.name
            assert name != SFT_FIXTURE and f"Stop serving {name}?" in screen_text(app)  # as the list names it
            await pilot.press("n")
            await pilot.pause(0.3)
            assert isinstance(app.screen, ServedScreen) and not app.screen.stopping
            assert served.live_records([loading_server]), "no still serves"
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question again")
            await pilot.press("y")
            await wait_for(pilot, lambda: "no model is served" in screen_text(app), timeout=30, what="the stop")

    asyncio.run(scenario())


def test_served_models_in_the_palette(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(120, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="history")
            await pilot.press("ctrl+p")
            await pilot.press(*"served")
            await wait_for(pilot, lambda: "Served (V)" in screen_text(app), what="the palette's entry")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, ServedScreen) and "no model is served" in
                           screen_text(app), what="an empty list")

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_real_served_run_listed_diagnosed_and_stopped_from_the_tui(tmp_path_factory, tmp_path):
    source = sft_run(tmp_path_factory)
    root = tmp_path / "runs"
    shutil.copytree(source, root / source.name)
    run_dir = root / source.name
    port = launcher.free_port()
    try:
        started = llmtui("serve", run_dir.name, "--port", str(port), runs_dir=root, timeout=300)
        assert started.returncode == 0, started.stdout + started.stderr
        asyncio.run(_real_flow(test_app(root, tmp_path, live=True), run_dir, port))
        assert served.state(served.read_record(run_dir)) == served.STOPPED
        assert served.claim_id(run_dir) not in queue.claims(root)
    finally:
        served.stop(run_dir, grace_s=5)


async def _real_flow(app, run_dir, port: int) -> None:
    url = f"http://localhost:{port}/v1"
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="history")
        await wait_for(pilot, lambda: app.screen.query_one(RunsTable).serving, what="the served marker")
        text = screen_text(app)
        assert "⇄ " in text and "1 serving (V)" in text and f"serving on {url}" in text
        await pilot.press("V")
        screen = app.screen
        assert isinstance(screen, ServedScreen)
        await wait_for(pilot, lambda: screen.models, timeout=20, what="the served list")
        text = screen_text(app)
        name = app.screen.models[0].run_id
        assert name == run_dir.name and url in text and "serving" in text and "transformers" in text
        assert "tiny-sft" in text  # the run's name
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen), timeout=60, what="doctor's report")
        report = app.screen.text
        assert "served model (transformers)" in report and f"serving on {url}" in report
        assert "Thread" in report  # the server's Python stack
        await pilot.press("escape")
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        await pilot.press("y")
        await wait_for(pilot, lambda: "no model is served" in screen_text(app), timeout=60, what="the stop")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.screen.query_one(RunsTable).serving, timeout=20,
                       what="the marker to go")


def test_a_row_says_when_its_server_holds_several_runs():
    from pathlib import Path

    from tuiapp.ui.screens.served import rows_of

    one = served.Served("a", Path("runs/a"), "http://localhost:8001/v1", "serving", "transformers")
    shared = served.Served("b", Path("runs/b"), "http://localhost:8002/v1", "serving", "transformers", shared=("c",))
    assert [row[3] for row in rows_of([one, shared], {})] == ["transformers", "transformers · one base, 2 runs"]
