"""A status that never lies (issue 9), as the TUI shows it: start-up phases with a clock, hangs,
orphans and stops flagged, attempts summed, root causes as reasons, and every refusal of the
run service shown without ending the app (Pilot).

Run folders come from the real code (RunStore.create, run.update with run.json's real fields,
rundir's attempt helpers, runs.root_cause on events the trainer's format) or are copies of the
recorded fixtures; a live run is a run whose lock a process really holds, or a real process
group. The real tiny runs (doctor on a live run, stop → stopping → stopped) are in
test_live_flows.py.
"""

from __future__ import annotations

import ast
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ui_fixtures import FIXED_NOW, REAL_IDS, screen_text, test_app, wait_for

from tuiapp.core.config.recipe import LoraMethod, Recipe
from tuiapp.core.machine import runlock
from tuiapp.core.machine.procs import group_processes
from tuiapp.core.plan import slurm
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.progress import fmt_time
from tuiapp.core.run_folder.rundir import RunRecord
from tuiapp.core.run_folder.runstate import status_of
from tuiapp.core.store.runs import Run, RunStore, failure_reason, root_cause
from tuiapp.ui.history import HistoryLoader
from tuiapp.ui.history_model import HistoryModel
from tuiapp.ui.screens.compare import CompareScreen
from tuiapp.ui.screens.confirm import ConfirmScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.run_view import RunViewScreen
from tuiapp.ui.widgets.runs_table import RunsTable, cells

SCREENS = Path(__file__).resolve().parents[2] / "tuiapp" / "ui" / "screens"


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


async def open_run(pilot, run_id: str) -> RunViewScreen:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="home")
    app.open_run(run_id)
    await wait_for(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded, what="run view")
    return app.screen


def home_row(app, run_id: str):
    return app.screen.model.rows[run_id]


@pytest.fixture
def store(tmp_path) -> RunStore:
    return RunStore(tmp_path / "runs")


def starting_run(store: RunStore, name: str, phase: str, since: float, **extra) -> Run:
    """A run in start-up whose supervisor is alive (this process holds the run's lock, as the
    supervisor would): refresh_truth keeps it starting."""
    run = store.create(Recipe(name=name, method=LoraMethod()), lock=True)
    attempts = rundir.new_attempt(run.record, socket.gethostname(), False, now=since - 5)
    run.update(status="starting", phase=phase, phase_since=since, started=since - 5, attempts=attempts, **extra)
    return run


# ---------------------------------------------------------------- starting, hung, orphaned


def test_starting_shows_its_phase_and_a_clock_not_running(store, tmp_path):
    run = starting_run(store, "warming", "loading model", FIXED_NOW - 42)
    hung = starting_run(store, "wedged", "joining ranks", FIXED_NOW - 1000, hang=rundir.Hang(
        phase="joining ranks", rank=1, since=FIXED_NOW - 1000,
        message="hung in 'joining ranks': rank 1 has made no progress for 1000s"))
    try:
        async def scenario():
            app = test_app(store.root, tmp_path)
            async with app.run_test(size=(80, 24)) as pilot:
                await wait_for(pilot, lambda: app.screen.summarized, what="history")
                rows = {r.name: r for r in app.screen.query_one(RunsTable).rows}
                assert cells(rows["warming"], FIXED_NOW)["status"] == "○ starting 0:42"
                assert cells(rows["wedged"], FIXED_NOW)["status"] == "! hung 16:40"
                text = screen_text(app)
                assert "○ starting 0:42" in text and "! hung 16:40" in text and "running" not in text
                assert "2 runs · 2 starting · 1 flagged" in text
                await pilot.press("t", "t")  # status filter: flagged
                await pilot.pause()
                assert [r.name for r in app.screen.query_one(RunsTable).rows] == ["wedged"]
                assert "hung in 'joining ranks': rank 1" in screen_text(app)  # the detail line
                await pilot.press("escape")
                await pilot.pause()

                view = await open_run(pilot, run.id)
                await wait_for(pilot, lambda: view.record.status == "starting", what="status")
                text = screen_text(app)
                assert "○ starting · loading model 0:42" in text and "running" not in text
                assert "ETA" not in text
                await pilot.press("escape")
                view = await open_run(pilot, hung.id)
                await wait_for(pilot, lambda: view.record.hang, what="the hang")
                text = screen_text(app)
                assert "! hung · joining ranks 16:40" in text
                assert "rank 1 has made no progress for 1000s" in text
                assert view.check_action("doctor", ()) is True

        asyncio.run(scenario())
    finally:
        run.release_lock()
        hung.release_lock()
    assert Run(run.path).load().status == "starting"  # the UI never wrote run.json


def test_orphaned_ranks_are_flagged_not_failed_nor_running(store, tmp_path):
    run = store.create(Recipe(name="orphan", method=LoraMethod()))
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        os.close(runlock.acquire(rundir.lock_path(run.path)))  # the supervisor held it, and died
        run.update(status="running", pid=rank.pid, pgid=rank.pid, started=FIXED_NOW - 100,
                   attempts=rundir.new_attempt(run.record, socket.gethostname(), False, now=FIXED_NOW - 100))

        async def scenario():
            app = test_app(store.root, tmp_path, live=False)
            async with app.run_test(size=(80, 24)) as pilot:
                await wait_for(pilot, lambda: app.screen.summarized, what="history")
                row = home_row(app, run.id)
                assert row.orphans and cells(row, FIXED_NOW)["status"] == "! orphaned"
                text = screen_text(app)
                assert "remain: x stops them" in text and "failed" not in text and "● running" not in text
                view = await open_run(pilot, run.id)
                await wait_for(pilot, lambda: view.record.orphans, what="orphans")
                assert "! orphaned processes" in screen_text(app)
                assert view.check_action("stop", ()) is True

        asyncio.run(scenario())
        assert Run(run.path).load().status == "running"  # never called failed while a rank lives
    finally:
        rank.kill()
        rank.wait()


# ---------------------------------------------------------------- stop


@pytest.mark.slow  # over ~5 s on 2 cores
def test_stop_says_stopping_at_once_and_the_final_status_after(store, tmp_path):
    """A real process group that takes 2 s to end after SIGTERM, as ranks finishing a step do."""
    run = store.create(Recipe(name="slow-exit", method=LoraMethod()))
    ready = tmp_path / "ready"
    code = ("import pathlib, signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: (time.sleep(2), sys.exit(0)))\n"
            f"pathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)")
    process = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:  # its SIGTERM handler is set
        time.sleep(0.05)
    try:
        run.update(status="running", pid=process.pid, pgid=process.pid, started=FIXED_NOW - 60,
                   attempts=rundir.new_attempt(run.record, socket.gethostname(), False, now=FIXED_NOW - 60))

        async def scenario():
            app = test_app(store.root, tmp_path)
            async with app.run_test(size=(80, 24)) as pilot:
                view = await open_run(pilot, run.id)
                await pilot.press("x")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
                confirmed = time.monotonic()
                await pilot.press("y")
                # shown while the stop is under way (the process takes 2 s to end), not after it
                await wait_for(pilot, lambda: "◌ stopping" in screen_text(app), timeout=1.8, what="stopping")
                assert time.monotonic() - confirmed < 1.8 and group_processes(process.pid)  # still ending
                assert view.check_action("stop", ()) is None  # no second stop while one is under way
                await wait_for(pilot, lambda: not view.stopping, timeout=30, what="the stop")
                assert not group_processes(process.pid)
                assert "stopping" not in screen_text(app)

        asyncio.run(scenario())
    finally:
        process.kill()
        process.wait()


def test_stop_of_a_run_supervised_on_another_host_shows_the_error_and_the_app_lives(runs_root, tmp_path):
    """The recorded `live` run: running, supervised on fixture-host. service.stop refuses it;
    the app used to exit with WorkerFailed."""
    run_id = RunStore(runs_root).get("live").id

    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            view = await open_run(pilot, run_id)
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
            await pilot.press("y")
            await wait_for(pilot, lambda: any("supervised on fixture-host" in n for n in notes(app)), what="the error")
            assert f"llmtui stop {run_id}` on fixture-host" in notes(app)[-1]
            await wait_for(pilot, lambda: not view.stopping, what="stopping undone")
            assert app.is_running and app.screen is view
            assert "● running" in screen_text(app) and view.check_action("stop", ()) is True
            await pilot.press("escape")  # still navigable
            assert isinstance(app.screen, HomeScreen)

    asyncio.run(scenario())
    assert Run(runs_root / run_id).load().status == "running"


# ---------------------------------------------------------------- resume


@pytest.mark.skipif(shutil.which("sbatch") is not None, reason="SLURM is installed: resume would really submit")
def test_resume_of_a_slurm_run_goes_through_the_service_and_shows_its_error(store, tmp_path):
    """A SLURM run that timed out: resume resubmits its batch script (here: no sbatch, a clear
    error); it used to restart the run as a local run on the login node."""
    run = store.create(Recipe(name="on-slurm", method=LoraMethod()))
    attempts = rundir.new_attempt(run.record, "node-a", False, now=FIXED_NOW - 600)
    run.update(status="running", node_mode="slurm", nnodes=1, strategy="deepspeed", slurm={"nodes": 1, "time": "00:10:00"},
               slurm_job="4242", slurm_submitted=FIXED_NOW - 620, started=FIXED_NOW - 600, attempts=attempts)
    run.update(status="failed", slurm_state="TIMEOUT", ended=FIXED_NOW - 5, reason="the SLURM job 4242 ended: TIMEOUT",
               attempts=rundir.close_attempt(run.record, "failed", "TIMEOUT", now=FIXED_NOW - 5))

    async def scenario():
        app = test_app(store.root, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            view = await open_run(pilot, run.id)
            assert view.check_action("resume", ()) is True
            await pilot.press("r")
            await wait_for(pilot, lambda: any("sbatch is not installed" in n for n in notes(app)), what="the error")
            assert app.is_running and app.screen is view
            await wait_for(pilot, lambda: "not resubmitted" in str(view.record.reason), what="the new reason")
            assert "✗ failed" in screen_text(app)

    asyncio.run(scenario())
    record = Run(run.path).load().record
    assert record.status == "failed" and record.node_mode == "slurm"
    assert not (run.path / "supervisor.log").exists() and not record.pid  # no local supervisor
    assert runlock.held(rundir.lock_path(run.path)) is not True
    assert "--resume" in (run.path / slurm.SCRIPT_NAME).read_text(encoding="utf-8")  # resubmitted as it ran


# ---------------------------------------------------------------- attempts and root causes


def three_attempts(root: Path) -> Run:
    """The recorded `halted` run (stopped), as if resumed twice: 100 s, 60 s and 75 s."""
    run = Run(root / REAL_IDS["halted"]).load()
    first = run.record.started
    record = rundir.RunRecord()
    for start, length in ((first, 100), (first + 400, 60), (first + 900, 75)):
        record.attempts = rundir.new_attempt(record, "fixture-host", resumed=start != first, now=start)
        record.attempts = rundir.close_attempt(record, "stopped", "stopped on request", now=start + length)
    run.update(attempts=record.attempts, started=first + 900, ended=first + 975, resumed=True)
    return run


def test_attempts_count_and_summed_time_in_history_run_view_and_compare(runs_root, tmp_path):
    run = three_attempts(runs_root)
    first = rundir.first_started(run.record)
    baseline = RunStore(runs_root).get("baseline").id

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(160, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="history")
            row = home_row(app, run.id)
            assert row.attempt_count == 3 and row.started == first
            assert cells(row, FIXED_NOW)["duration"] == "3m55s ×3"
            assert cells(row, FIXED_NOW)["started"] == fmt_time(first)
            assert "3m55s ×3" in screen_text(app)
            await open_run(pilot, run.id)
            assert "took 3m55s over 3 attempts" in screen_text(app)
            await pilot.press("escape")
            await pilot.resize_terminal(100, 30)  # narrow: one pane at a time
            app.open_compare([run.id, baseline])
            await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded, what="compare")
            await pilot.press("7")  # the summary pane
            await pilot.pause()
            assert "3m55s ×3" in screen_text(app)

    asyncio.run(scenario())


def crash_with_its_root_cause(root: Path) -> Run:
    """The recorded `crashed` run (2 ranks, rank 1 SIGKILLed; rank 0 then wrote a real error
    event, gloo's 'Connection reset by peer'), with `error` and `reason` as the supervisor now
    records them."""
    run = Run(root / REAL_IDS["crashed"]).load()
    run.update(error=root_cause(run.path, run.record.started), reason=failure_reason(run.path, since=run.record.started))
    return run


def test_a_failed_run_shows_its_root_cause_in_the_run_view_and_history(runs_root, tmp_path):
    run = crash_with_its_root_cause(runs_root)
    error = run.record.error
    assert error["rank"] == 0 and "RuntimeError: [/__w/pytorch" in f"{error['type']}: {error['message']}"
    cause = "rank 0: " + (f"{error['type']}: " if error["type"] else "") + error["message"]  # type: an older event

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="history")
            await pilot.press("down")  # live, then crashed
            await pilot.pause()
            assert f"✗ crashed: {cause[:40]}" in screen_text(app)  # the detail line, literally
            view = await open_run(pilot, run.id)
            await wait_for(pilot, lambda: view.record.error, what="the error")
            text = screen_text(app)
            assert "error: rank 0 · log: ranks/20260101000347_rank0.log" in text
            squeezed = "".join(text.split())  # the message wraps at 80 columns
            assert "".join(error["message"][:80].split()) in squeezed  # brackets shown as they are

    asyncio.run(scenario())


def test_status_view_of_every_status():
    now = 1000.0
    assert status_of(RunRecord(status="running"), now).badge == "● running"
    assert status_of(RunRecord(status="running"), now, stopping=True).badge == "◌ stopping"
    assert status_of(RunRecord(status="stopping", stop_requested=995.0), now).badge == "◌ stopping 0:05"
    assert status_of(RunRecord(status="starting"), now).badge == "○ starting · launching"
    assert status_of(RunRecord(status="starting", phase="tokenizing", phase_since=now - 3725), now).badge == \
        "○ starting · tokenizing 1:02:05"
    assert status_of(RunRecord(status="failed", orphans=True), now).key == "failed"  # only active runs
    assert status_of(RunRecord(status="stopped"), now, stopping=True).key == "stopped"
    stalled = status_of(RunRecord(status="running"), now, step_times=[10.0, 20.0, 30.0])
    assert stalled.flagged and stalled.hint.startswith("stalled: no step for 16m10s")


def test_a_resume_shows_starting_before_its_supervisor_records_the_attempt():
    """Between `r` and the supervisor's first write, run.json says starting (the service's write)
    while its last attempt is the stopped one: its old steps are not this start's, so the run
    shows its phase, never `running` or `stalled` (the old steps are minutes old)."""
    now = 1000.0
    stopped = [{"number": 1, "started": 10.0, "ended": 40.0, "outcome": "stopped"}]
    old_steps = [20.0, 25.0, 30.0, 35.0]
    view = status_of(RunRecord(status="starting", phase="launching", phase_since=now - 1, attempts=stopped),
                     now, step_times=old_steps)
    assert view.badge == "○ starting · launching 0:01" and not view.flagged
    resumed = [*stopped, {"number": 2, "started": now - 30}]
    counting = status_of(RunRecord(status="starting", phase="loading model", attempts=resumed), now,
                         step_times=[*old_steps, now - 2, now - 1])
    assert counting.key == "running"  # the new attempt's steps count: it trains


def test_history_loader_reports_a_phase_change_of_a_starting_run(store):
    run = starting_run(store, "warming", "importing", FIXED_NOW - 10)
    try:
        loader = HistoryLoader(store.root)
        model = HistoryModel(lambda: FIXED_NOW)
        model.add([loader.summarize(r) for batch in loader.load_infos(loader.scan(), 10) for r in batch])
        assert model.rows[run.id].phase == "importing"
        run.update(phase="loading model", phase_since=FIXED_NOW - 2)
        changed = loader.poll()
        assert [r.phase for r in changed] == ["loading model"]  # the status did not change, the phase did
    finally:
        run.release_lock()


# ---------------------------------------------------------------- doctor and navigation


def test_doctor_of_a_run_with_no_live_rank_here_is_an_error_not_a_crash(runs_root, tmp_path):
    halted, live = RunStore(runs_root).get("halted").id, RunStore(runs_root).get("live").id

    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            view = await open_run(pilot, halted)
            assert view.check_action("doctor", ()) is None  # a stopped run has nothing to diagnose
            await pilot.press("escape")
            view = await open_run(pilot, live)  # running, but on fixture-host
            assert view.check_action("doctor", ()) is True
            await pilot.press("d")
            await wait_for(pilot, lambda: any("no live rank on this machine" in n for n in notes(app)), what="error")
            assert app.is_running and app.screen is view and not view.diagnosing

    asyncio.run(scenario())


def test_no_screen_module_imports_another():
    """The app owns navigation (LlmtuiApp.open_*): screens never import each other, even inside
    a function (an import-linter contract says the same)."""
    screens = {p.stem for p in SCREENS.glob("*.py") if p.stem != "__init__"}
    for path in SCREENS.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name.startswith("tuiapp.ui.screens."):
                    other = name.split(".")[3]
                    assert other not in screens, f"{path.name} imports {name}"
