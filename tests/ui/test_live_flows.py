"""Flows with real processes: launch a tiny CPU run from the app, quit and reopen while it runs,
stop it from the app (stopping at once, then stopped), resume it (starting with its phase, then
running), and diagnose it (doctor). The real launcher, supervisor, DeepSpeed and trainer; about
30-60 s each.

Run them alone with `pytest tests/ui -m slow`; skip them with `-m "not slow"`.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from ui_fixtures import screen_text, test_app, wait_for

from tuiapp.core.config.recipe import LoraMethod, Recipe, TrainSpec
from tuiapp.core.lifecycle import service
from tuiapp.core.machine.procs import group_processes
from tuiapp.core.prelaunch.door import CHECKING_LINE
from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.metrics import read_jsonl
from tuiapp.core.store.runs import Run, RunStore
from tuiapp.ui.screens.confirm import ConfirmScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.new_experiment import NewExperimentScreen
from tuiapp.ui.screens.report import ReportScreen
from tuiapp.ui.screens.run_view import RunViewScreen

pytestmark = pytest.mark.slow
START_S = 150.0  # DeepSpeed + torch import + the tiny model on a small CPU box


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    monkeypatch.setenv("LLMTUI_FORCE_CPU", "1")
    monkeypatch.setenv("LLMTUI_STOP_GRACE_S", "30")


def tiny_recipe(name: str, steps: int) -> Recipe:
    return Recipe(
        name=name,
        dataset={"name": "demo:facts", "max_samples": 48},
        method=LoraMethod(rank=4),
        train=TrainSpec(max_steps=steps, micro_batch=2, max_seq_len=64, logging_steps=1),
        launch={"gpus": 1},
    )


async def open_run_view(pilot, run_id: str) -> RunViewScreen:
    app = pilot.app
    await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="home")
    app.push_screen(RunViewScreen(run_id))
    await wait_for(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded, what="run view")
    return app.screen


def test_launch_a_tiny_cpu_run_from_the_app(tmp_path):
    root = tmp_path / "runs"

    async def scenario():
        app = test_app(root, tmp_path, system_monitor=True)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            await pilot.press("n")
            form = app.screen
            assert isinstance(form, NewExperimentScreen)
            await wait_for(pilot, lambda: form.last_check is not None, what="check")
            form.query_one("#f-name").focus()
            await pilot.press("home", "ctrl+k", *"from-ui")
            for key, value in {"train.max_steps": "4", "train.micro_batch": "2", "train.max_seq_len": "64",
                               "dataset.max_samples": "32", "launch.gpus": "1", "method.rank": "4"}.items():
                form.set_field(key, value)
            await pilot.pause(0.4)
            verdict = form.query_one("#ne-verdict")  # held: a quick launch may replace the form during the press
            await pilot.press("ctrl+r")
            # the checks before launch say so, with their clock, until the run view opens
            assert str(verdict.render()).startswith(f"{CHECKING_LINE} 0:0")
            launched = lambda: isinstance(app.screen, RunViewScreen)  # noqa: E731
            await wait_for(pilot, lambda: launched() or not form.launching, timeout=60, what="the launch")
            assert launched(), [n.message for n in app._notifications]  # refused: say why
            view = app.screen
            run = Run(root / view.run_id).load()
            assert run.name == "from-ui" and run.record.recipe["train"]["max_steps"] == 4
            await wait_for(pilot, lambda: view.record.status == "succeeded", timeout=START_S, what="success")
            await wait_for(pilot, lambda: len(view.data.loss) == 4, what="every step in the chart")
            assert (run.path / "final").is_dir()
            assert "succeeded" in screen_text(app)

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """One long tiny run shared by the reopen and stop flows; stopped at the end in any case."""
    with pytest.MonkeyPatch.context() as patch:  # module scope: the env is restored after the module
        patch.setenv("LLMTUI_FORCE_CPU", "1")
        patch.setenv("LLMTUI_STOP_GRACE_S", "30")
        root = tmp_path_factory.mktemp("live") / "runs"
        store = RunStore(root)
        run = store.create(tiny_recipe("long-one", 2000))
        service.start_supervisor(run)
        yield run
        service.stop(run, grace_s=10)


def test_quit_and_reopen_the_run_is_still_live(live_run, tmp_path):
    root = live_run.path.parent

    async def first_session():
        app = test_app(root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            view = await open_run_view(pilot, live_run.id)
            await wait_for(pilot, lambda: len(view.data.loss) >= 1, timeout=START_S, what="the first step")
            # the supervisor says running within a second of the first step (it polls the phases)
            await wait_for(pilot, lambda: view.record.status == "running", timeout=10, what="running")
            return len(view.data.loss)
        # leaving the block quits the app

    seen = asyncio.run(first_session())
    run = Run(live_run.path).load().refresh_truth()
    assert run.status == "running" and run.supervisor_alive()

    async def second_session():
        app = test_app(root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="history")
            row = app.screen.model.rows[live_run.id]
            assert row.status == "running"
            assert "running" in screen_text(app)
            await pilot.press("enter")
            view = app.screen
            assert isinstance(view, RunViewScreen) and view.run_id == live_run.id
            await wait_for(pilot, lambda: len(view.data.loss) > seen + 1, timeout=60, what="new steps after reopening")

    asyncio.run(second_session())


def test_stop_from_the_app_then_resume(live_run, tmp_path):
    root = live_run.path.parent

    async def scenario():
        app = test_app(root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            view = await open_run_view(pilot, live_run.id)
            await wait_for(pilot, lambda: view.record.status == "running", timeout=START_S, what="running")
            await wait_for(pilot, lambda: len(view.data.loss) >= 1, timeout=START_S, what="a step")
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
            await pilot.press("y")
            # the badge leaves `running` at once: `stopping`, or already `stopped` (one tiny rank with no
            # launcher checkpoints and exits in under half a second)
            await wait_for(pilot, lambda: "◌ stopping" in screen_text(app) or "■ stopped" in screen_text(app),
                           timeout=2.0, what="stopping at once")
            await wait_for(pilot, lambda: view.record.status == "stopped", timeout=90, what="stopped")
            assert view.check_action("resume", ()) is True and view.check_action("stop", ()) is None
            pgid = Run(live_run.path).load().record.pgid
            await wait_for(pilot, lambda: not group_processes(pgid), timeout=30, what="no process left")
            assert "stopped" in screen_text(app)
            # resume from the checkpoint the stop saved: the same view follows the new attempt
            steps_at_stop = len(view.data.loss)
            await pilot.press("r")
            await wait_for(pilot, lambda: "○ starting · " in screen_text(app), timeout=30, what="starting, its phase")
            assert "● running" not in screen_text(app)
            await wait_for(pilot, lambda: view.record.status == "running", timeout=START_S, what="running again")
            await wait_for(pilot, lambda: len(view.data.loss) > steps_at_stop, timeout=START_S, what="steps after resuming")
            assert rundir.attempt_count(Run(live_run.path).load().record) >= 2
            assert "over " in screen_text(app) and " attempts" in screen_text(app)  # elapsed over every attempt

    asyncio.run(scenario())


def test_doctor_shows_every_rank_of_a_live_run(live_run, tmp_path):
    root = live_run.path.parent

    async def scenario():
        app = test_app(root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            view = await open_run_view(pilot, live_run.id)
            await wait_for(pilot, lambda: view.record.status == "running", timeout=START_S, what="running")
            await pilot.press("d")
            await wait_for(pilot, lambda: isinstance(app.screen, ReportScreen), timeout=60, what="the report")
            text = app.screen.text
            assert f"{live_run.id}: running" in text and "rank 0  pid" in text
            assert "rank 0" in screen_text(app)
            await pilot.press("escape")
            assert app.screen is view

    asyncio.run(scenario())



def test_stop_resume_cycles_from_the_app_never_show_failed(tmp_path):
    """Stop (x, y) and resume (r) from the run view, again and again: at every look the badge and
    run.json say starting, running, stopping or stopped, never failed, while processes live."""
    cycles = int(os.environ.get("LLMTUI_TEST_TUI_CYCLES", "3"))  # 20 before a release
    store = RunStore(tmp_path / "runs")
    run = store.create(tiny_recipe("cycles", 100000))
    service.start_supervisor(run)
    seen: set[str] = set()
    lies: list[str] = []

    def look(app) -> str:
        text = screen_text(app)
        record = Run(run.path).load().refresh_truth().record
        seen.add(record.status)
        if "failed" in text.split("\n", 3)[1] or record.status == "failed":
            lies.append(f"{record.status}: {record.reason}")
        return text

    async def scenario():
        app = test_app(store.root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            view = await open_run_view(pilot, run.id)
            for cycle in range(cycles):
                # odd cycles stop a training run, even ones a run still starting up
                training = cycle % 2 == 1
                wanted = ("running",) if training else ("starting", "running")
                await wait_for(pilot, lambda w=wanted, t=training: look(app) and view.record.status in w
                               and (not t or len(view.data.loss) >= 1),
                               timeout=START_S, what=f"cycle {cycle}: {' or '.join(wanted)}")
                await pilot.press("x")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
                await pilot.press("y")
                # a stop during start-up can be over within a frame: stopped counts too
                await wait_for(pilot, lambda: any(s in look(app) for s in ("◌ stopping", "■ stopped")), timeout=2.0,
                               what=f"cycle {cycle}: stopping at once")
                await wait_for(pilot, lambda: look(app) and view.record.status == "stopped", timeout=90,
                               what=f"cycle {cycle}: stopped")
                await pilot.press("r")
                await wait_for(pilot, lambda: "○ starting" in look(app), timeout=30, what=f"cycle {cycle}: starting")
            await pilot.press("x")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
            await pilot.press("y")
            await wait_for(pilot, lambda: look(app) and view.record.status == "stopped", timeout=90, what="end")

    try:
        asyncio.run(scenario())
    finally:
        service.stop(Run(run.path).load(), grace_s=10)
    assert not lies, lies[:3]
    assert {"starting", "stopped"} <= seen
    # every start is an attempt, or a stop that came before its ranks were launched (no attempt then)
    never_launched = [e for e in read_jsonl(Run(run.path).load().events_path)
                      if e.get("event") == ev.STOPPED and "before its ranks were launched" in str(e.get("reason"))]
    assert rundir.attempt_count(Run(run.path).load().record) + len(never_launched) == cycles + 1
