"""The experiment manager in the app (issue 10), with Pilot: queued runs (their place, moving
them, cancelling one that really waits), sweeps (a foldable row, the group screen's table and
heat map, compare labelled by the values), tags, notes, names, archive and delete (a live run
refused), and the bell when a run or a sweep ends.

Everything on disk is made by the real core: runs by RunStore.create and run.update, queue
entries by tuiapp.core.store.queue, sweeps by sweep.plan_sweep/write_group (manager_fixtures.py),
meta.json by the app's own keys. A "live" run is one whose lock this process holds, as its
supervisor would; the cancel flow starts real supervisors (slow tier).
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from manager_fixtures import SWEEP_ID, make_sweep, queued_run
from ui_fixtures import FIXED_NOW, real_runs, screen_text, test_app, wait_for

from tuiapp.core.config.recipe import LoraMethod, Recipe, TrainSpec
from tuiapp.core.lifecycle import service
from tuiapp.core.run_folder import rundir
from tuiapp.core.store import meta, queue
from tuiapp.core.store.runs import Run, RunStore
from tuiapp.ui.groups import GroupRow
from tuiapp.ui.screens.compare import CompareScreen
from tuiapp.ui.screens.confirm import ConfirmScreen
from tuiapp.ui.screens.group import GroupScreen
from tuiapp.ui.screens.help import HelpScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.prompt import PromptScreen
from tuiapp.ui.screens.run_view import RunViewScreen
from tuiapp.ui.widgets.runs_table import RunsTable, cells


def names(app) -> list[str]:
    return [r.title for r in app.screen.query_one(RunsTable).rows]


def notes(app) -> list[str]:
    return [n.message for n in app._notifications]


def waiting_ids(root) -> list[str]:
    return [w.run_id for w in queue.waiting(root)]


async def home_ready(pilot) -> HomeScreen:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, HomeScreen) and pilot.app.screen.summarized,
                   what="history")
    return pilot.app.screen


def live_run(store: RunStore, name: str, status: str = "running") -> Run:
    """A run whose supervisor is alive: this process holds its lock."""
    run = store.create(Recipe(name=name, method=LoraMethod()), lock=True)
    run.update(status=status, started=FIXED_NOW - 30, phase="loading model" if status == "starting" else None,
               phase_since=FIXED_NOW - 20, attempts=rundir.new_attempt(run.record, socket.gethostname(), False,
                                                                        now=FIXED_NOW - 30))
    return run


# ---------------------------------------------------------------- the queue


def test_queued_runs_show_their_place_and_move_in_the_queue(tmp_path):
    root = tmp_path / "runs"
    real_runs(root, ["baseline"])
    store = RunStore(root)
    runs = [queued_run(store, f"wait-{i}", FIXED_NOW + i) for i in range(3)]
    ids = [r.id for r in runs]

    async def scenario():
        app = test_app(root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            home = await home_ready(pilot)
            assert names(app) == ["wait-0", "wait-1", "wait-2", "baseline"]  # queued first, in start order
            text = screen_text(app)
            assert "◌ queued #1" in text and "◌ queued #2" in text and "◌ queued #3" in text
            assert "3 queued" in text
            table = home.query_one(RunsTable)
            await pilot.press("down", "down")  # wait-2, third in line
            assert table.cursor_run_id == ids[2] and "queued #3 in the device queue" in screen_text(app)
            await pilot.press("K")  # one place up
            await wait_for(pilot, lambda: waiting_ids(root) == [ids[0], ids[2], ids[1]], what="moved up on disk")
            await wait_for(pilot, lambda: names(app)[:3] == ["wait-0", "wait-2", "wait-1"], what="moved up on screen")
            assert table.cursor_run_id == ids[2]  # the cursor follows the run
            assert cells(home.model.rows[ids[2]], FIXED_NOW)["status"] == "◌ queued #2"
            await pilot.press("F")  # to the front
            await wait_for(pilot, lambda: waiting_ids(root) == [ids[2], ids[0], ids[1]], what="first on disk")
            await wait_for(pilot, lambda: names(app)[0] == "wait-2", what="first on screen")
            await pilot.press("J")  # one place down
            await wait_for(pilot, lambda: waiting_ids(root) == [ids[0], ids[2], ids[1]], what="moved down on disk")
            await pilot.press("end", "K")  # baseline is not queued: said, nothing moves
            await wait_for(pilot, lambda: any("not waiting in the queue" in n for n in notes(app)), what="the refusal")
            assert waiting_ids(root) == [ids[0], ids[2], ids[1]]
            assert queue.position(root, ids[2]) == 2

    try:
        asyncio.run(scenario())
    finally:
        for run in runs:
            run.release_lock()


def tiny_recipe(name: str, steps: int) -> Recipe:
    return Recipe(name=name, dataset={"name": "demo:facts", "max_samples": 48}, method=LoraMethod(rank=4),
                  train=TrainSpec(max_steps=steps, micro_batch=2, max_seq_len=64, logging_steps=1), launch={"gpus": 1})


@pytest.mark.slow
def test_cancel_a_queued_run_that_really_waits(tmp_path, monkeypatch):
    """A long run holds this machine's only CPU slot; a second run queued behind it really waits
    (its supervisor is up, in the queue). Cancelled from the history: stopped, never started."""
    monkeypatch.setenv("LLMTUI_FORCE_CPU", "1")
    monkeypatch.setenv("LLMTUI_STOP_GRACE_S", "30")
    monkeypatch.setenv(queue.SLOTS_ENV, "1")
    root = tmp_path / "runs"
    store = RunStore(root)
    holder = service.launch(service.plan_launch(tiny_recipe("holder", 2000), store, tmp_path), store)
    try:
        deadline = time.monotonic() + 30
        while holder.id not in queue.claims(root) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert holder.id in queue.claims(root), "the first run never claimed its slot"
        options = service.LaunchOptions(queue=True)
        waiter = service.launch(service.plan_launch(tiny_recipe("waiter", 4), store, tmp_path, options), store)
        deadline = time.monotonic() + 30
        while queue.position(root, waiter.id) != 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert queue.position(root, waiter.id) == 1 and Run(waiter.path).load().status == "queued"

        async def scenario():
            app = test_app(root, tmp_path)
            rings = []
            app.bell = lambda: rings.append(time.monotonic())
            async with app.run_test(size=(100, 30)) as pilot:
                home = await home_ready(pilot)
                table = home.query_one(RunsTable)
                assert table.cursor_run_id == waiter.id  # queued runs come first
                assert "◌ queued #1" in screen_text(app)
                await pilot.press("x")
                await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
                assert "Cancel waiter?" in screen_text(app)
                await pilot.press("y")
                await wait_for(pilot, lambda: home.model.rows[waiter.id].status == "stopped", timeout=60,
                               what="stopped in the history")
                await wait_for(pilot, lambda: any("cancelled, it never started" in n for n in notes(app)),
                               what="the toast")
                assert rings == []  # the user's own cancel rings no bell
                assert home.model.rows[holder.id].status in ("starting", "running")

        asyncio.run(scenario())
        record = Run(waiter.path).load().record
        assert record.status == "stopped" and "never started" in record.reason
        assert not record.argv and not rundir.attempts_of(record)  # no launcher ever ran
        assert waiter.id not in waiting_ids(root) and waiter.id not in queue.claims(root)
    finally:
        service.stop(Run(holder.path).load(), grace_s=10)


# ---------------------------------------------------------------- sweeps


def test_a_sweep_is_one_row_that_unfolds_into_its_runs(runs_root, tmp_path):
    runs = make_sweep(runs_root)  # 2x2: three succeeded, the last (lr 3e-3, rank 8) running

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            home = await home_ready(pilot)
            await wait_for(pilot, lambda: home.model.group_records, what="the sweep's record")
            table = home.query_one(RunsTable)
            group = table.rows[0]
            assert isinstance(group, GroupRow) and group.group_id == SWEEP_ID
            text = screen_text(app)
            assert "▸ tiny-sweep" in text and "▦ 3/4 done" in text
            assert "best 1.1178 · learning_rate=0.003 rank=4" in text  # best eval loss among the four
            assert "lr0.001-rank4" not in text  # folded
            assert "sweep tiny-sweep: 3/4 done · 1 running · best eval loss 1.1178" in text  # the detail line
            assert "11 runs" in text
            await pilot.press("f")
            text = screen_text(app)
            assert "▾ tiny-sweep" in text
            for label in ("└ lr0.001-rank4", "└ lr0.001-rank8", "└ lr0.003-rank4", "└ lr0.003-rank8"):
                assert label in text
            assert [r.id for r in table.rows[1:5]] == [r.id for r in runs]  # in sweep order under it
            await pilot.press("down", "down", "f")  # f on one of its runs folds the sweep
            assert table.cursor_run_id == group.id and "lr0.001-rank4" not in screen_text(app)
            await pilot.press("space")  # marks every run of the sweep
            assert home.model.marked == [r.id for r in runs]
            await pilot.press("c")
            compare = app.screen
            assert isinstance(compare, CompareScreen)
            await wait_for(pilot, lambda: compare.loaded, what="compare")
            assert [r.label for r in compare.runs] == ["learning_rate=0.001 rank=4", "learning_rate=0.001 rank=8",
                                                        "learning_rate=0.003 rank=4", "learning_rate=0.003 rank=8"]

    asyncio.run(scenario())


def test_group_screen_ranks_the_runs_and_draws_a_heat_map(runs_root, tmp_path):
    runs = make_sweep(runs_root)

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await home_ready(pilot)
            await pilot.press("enter")  # on the sweep's row
            screen = app.screen
            assert isinstance(screen, GroupScreen) and screen.group_id == SWEEP_ID
            await wait_for(pilot, lambda: screen.loaded, what="the sweep")
            # ranked by best eval loss: lr 3e-3 rank 4 first; the running one has 12 of 20 steps
            assert [r.id for r in screen.ranked] == [runs[2].id, runs[3].id, runs[1].id, runs[0].id]
            text = screen_text(app)
            assert "sweep tiny-sweep · 3/4 done · ranked by eval loss" in text
            lines = [line.split() for line in text.splitlines()]
            assert ["#", "learning_rate", "rank", "status", "step", "final", "loss", "best", "eval", "▲"] in lines
            assert ["1", "0.003", "4", "✓", "succeeded", "20/20", "1.0178", "1.1178"] in lines
            assert ["2", "0.003", "8", "●", "running", "12/20", "1.1199", "1.3197"] in lines
            assert ["4", "0.001", "4", "✓", "succeeded", "20/20", "1.6540", "1.7540"] in lines
            # the heat map: learning rate down, rank across, darker is better, the best starred
            assert ["rank=4", "rank=8"] in lines
            assert ["learning_rate=0.001", "░░", "1.7540", "▒▒", "1.6206"] in lines
            assert ["learning_rate=0.003", "██", "1.1178★", "▓▓", "1.3197"] in lines
            await pilot.press("c")
            compare = app.screen
            assert isinstance(compare, CompareScreen)
            await wait_for(pilot, lambda: compare.loaded, what="compare")
            assert compare.runs[0].label == "learning_rate=0.003 rank=4"  # best first, named by its values
            chart = compare.query_one("#cmp-chart-loss")
            assert [label for label, _ in chart.series][:2] == ["learning_rate=0.003 rank=4", "learning_rate=0.003 rank=8"]
            await pilot.press("escape")
            assert app.screen is screen
            await pilot.press("down", "enter")  # the second best: its run view
            assert isinstance(app.screen, RunViewScreen) and app.screen.run_id == runs[3].id
            await pilot.press("escape", "escape")
            assert isinstance(app.screen, HomeScreen)

    asyncio.run(scenario())


def test_a_sweep_of_one_key_ranked_by_final_loss_has_no_heat_map(tmp_path):
    root = tmp_path / "runs"
    make_sweep(root, statuses=["succeeded", "failed", "succeeded"], grid={"train.learning_rate": [1e-3, 2e-3, 3e-3]},
               written={2: 6}, metric="loss")

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await home_ready(pilot)
            text = screen_text(app)
            assert "▦ 3/3 done" in text and "best 0.9729 · learning_rate=0.003" in text  # final loss
            app.open_group(SWEEP_ID)
            await wait_for(pilot, lambda: isinstance(app.screen, GroupScreen) and app.screen.loaded, what="group")
            text = screen_text(app)
            assert "ranked by loss" in text and "final loss ▲" in text
            assert "a heat map needs exactly two varied keys; this sweep varies 1" in text
            assert [r.group["values"]["train.learning_rate"] for r in app.screen.ranked] == [3e-3, 1e-3, 2e-3]

    asyncio.run(scenario())


# ---------------------------------------------------------------- tags, notes, names, archive, delete


async def type_in_prompt(pilot, text: str, clear: bool = False) -> None:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, PromptScreen), what="the prompt")
    if clear:
        await pilot.press("ctrl+u")
    await pilot.press(*text, "enter")


@pytest.mark.slow  # ~12 s on 2 cores: types tags, a note and a name into two screens
def test_tag_note_and_rename_from_the_history_and_the_run_view(runs_root, tmp_path):
    baseline = RunStore(runs_root).get("baseline")

    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            home = await home_ready(pilot)
            table = home.query_one(RunsTable)
            table.move_to_id(baseline.id)
            await pilot.press("#")
            await type_in_prompt(pilot, "+base +lr-1e-2")
            await wait_for(pilot, lambda: meta.read_meta(baseline.path)["tags"] == ["base", "lr-1e-2"], what="tags")
            await wait_for(pilot, lambda: "baseline #base #lr…" in screen_text(app), what="tags in the row")
            await pilot.press("#")
            await type_in_prompt(pilot, "-lr-1e-2 no!good")  # one bad tag: nothing changes, the error says why
            await wait_for(pilot, lambda: any("'no!good' is not a valid tag" in n for n in notes(app)), what="error")
            assert meta.read_meta(baseline.path)["tags"] == ["base", "lr-1e-2"] and isinstance(app.screen, HomeScreen)
            await pilot.press("N")
            await type_in_prompt(pilot, "the reference")
            await wait_for(pilot, lambda: meta.read_meta(baseline.path).get("note") == "the reference", what="note")
            await wait_for(pilot, lambda: "the reference" in screen_text(app), what="the note in the detail line")
            await pilot.press("R")
            await wait_for(pilot, lambda: isinstance(app.screen, PromptScreen), what="the prompt")
            assert app.screen.query_one("#prompt-input").value == "baseline"  # the name it has now
            await type_in_prompt(pilot, "reference lr", clear=True)
            await wait_for(pilot, lambda: meta.read_meta(baseline.path).get("display_name") == "reference lr",
                           what="the display name")
            await wait_for(pilot, lambda: "reference lr" in names(app), what="the name in the row")
            assert Run(baseline.path).load().name == "baseline"  # run.json and the folder keep theirs
            await pilot.press("slash", *"tag:base", "enter")
            await wait_for(pilot, lambda: names(app) == ["reference lr"], what="the tag filter")
            await pilot.press("escape")
            await wait_for(pilot, lambda: len(names(app)) == 7, what="all runs again")
            table.move_to_id(baseline.id)
            await pilot.press("enter")
            view = app.screen
            assert isinstance(view, RunViewScreen) and view.sub_title == "reference lr"
            await pilot.press("#")
            await type_in_prompt(pilot, "+kept")
            await wait_for(pilot, lambda: "kept" in meta.read_meta(baseline.path)["tags"], what="tag from the run view")
            await wait_for(pilot, lambda: any("tags: #base #lr-1e-2 #kept" in n for n in notes(app)), what="said")
            await pilot.press("escape")
            await wait_for(pilot, lambda: "#kept" in str(home.query_one("#home-detail").render()), what="the history saw it")

    asyncio.run(scenario())


def test_archive_hides_a_run_until_shown(runs_root, tmp_path):
    sft = RunStore(runs_root).get("sft")

    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            home = await home_ready(pilot)
            table = home.query_one(RunsTable)
            table.move_to_id(sft.id)
            await pilot.press("a")
            await wait_for(pilot, lambda: "sft" not in names(app), what="hidden")
            assert meta.read_meta(sft.path)["archived"] is True
            assert "6 runs" in screen_text(app) and "1 archived hidden (A shows)" in screen_text(app)
            await pilot.press("A")
            assert "sft" in names(app) and "1 archived shown" in screen_text(app)
            table.move_to_id(sft.id)
            await pilot.pause()
            assert "archived" in str(home.query_one("#home-detail").render())
            await pilot.press("a")  # unarchive
            await wait_for(pilot, lambda: meta.read_meta(sft.path)["archived"] is False, what="unarchived")
            await pilot.press("A")
            assert "sft" in names(app) and "archived" not in screen_text(app)

    asyncio.run(scenario())


@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_delete_moves_a_finished_run_to_the_trash_and_refuses_a_live_one(runs_root, tmp_path):
    store = RunStore(runs_root)
    halted = store.get("halted")
    busy = live_run(store, "busy")

    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            home = await home_ready(pilot)
            table = home.query_one(RunsTable)
            table.move_to_id(halted.id)
            await pilot.press("D")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
            assert "Delete halted?" in screen_text(app)
            await pilot.press("y")
            await wait_for(pilot, lambda: "halted" not in names(app), what="gone from the history")
            assert not halted.path.exists() and (meta.trash_dir(runs_root) / halted.id).is_dir()
            table.move_to_id(busy.id)
            await pilot.press("D", "y")
            await wait_for(pilot, lambda: any("a live run cannot be deleted" in n for n in notes(app)), what="refusal")
            assert busy.path.is_dir() and "busy" in names(app) and isinstance(app.screen, HomeScreen)
            await pilot.press("n")  # a key after the refusal: the app is alive and well
            assert type(app.screen).__name__ == "NewExperimentScreen"

    try:
        asyncio.run(scenario())
    finally:
        busy.release_lock()


def test_help_lists_the_manager_keys(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(120, 50)) as pilot:
            await home_ready(pilot)
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
            text = screen_text(app)
            for expected in ("Queue ▲", "Queue ▼", "Queue first", "Stop", "Fold", "Archive", "Archived", "Delete",
                             "Tag", "Note", "Rename", "tag:NAME"):
                assert expected in text, expected

    asyncio.run(scenario())


# ---------------------------------------------------------------- the bell


@pytest.mark.slow  # over ~1.5 s on 2 cores
def test_bell_and_toast_when_a_run_ends_fails_or_hangs_and_when_a_sweep_ends(tmp_path):
    root = tmp_path / "runs"
    store = RunStore(root)
    ending, failing = live_run(store, "ending"), live_run(store, "failing")
    hanging = live_run(store, "hanging", status="starting")
    sweep_runs = make_sweep(root)  # its last run is running

    async def scenario():
        app = test_app(root, tmp_path)  # live: the history polls every 0.3 s
        rings: list[float] = []
        app.bell = lambda: rings.append(time.monotonic())
        async with app.run_test(size=(100, 30)) as pilot:
            await home_ready(pilot)
            await pilot.pause(1.0)
            assert rings == [] and notes(app) == []  # nothing rings for what was already so
            ending.update(status="succeeded", ended=time.time())
            await wait_for(pilot, lambda: any(n.startswith("ending: succeeded") for n in notes(app)), what="success")
            assert len(rings) == 1
            failing.update(status="failed", ended=time.time(), reason="rank 0: RuntimeError: boom")
            await wait_for(pilot, lambda: "failing: failed: rank 0: RuntimeError: boom" in notes(app), what="failure")
            assert [n.severity for n in app._notifications if n.message.startswith("failing")] == ["error"]
            hanging.update(hang=rundir.Hang(phase="loading model", rank=1, since=FIXED_NOW - 900,
                                            message="no progress in 'loading model' for 15 min (rank 1)"))
            await wait_for(pilot, lambda: any("hanging: no progress in 'loading model'" in n for n in notes(app)),
                           what="the hang")
            assert len(rings) == 3
            sweep_runs[-1].update(status="succeeded", ended=time.time())
            await wait_for(pilot, lambda: any(n.startswith("tiny-sweep: 4/4 succeeded") for n in notes(app)),
                           what="the sweep's end")
            assert len(rings) == 4  # one bell for the run and its sweep together
            titles = [n.title for n in app._notifications]
            assert titles == ["Run succeeded", "Run failed", "Run hung", "Run succeeded", "Sweep finished"]

    try:
        asyncio.run(scenario())
    finally:
        for run in (ending, failing, hanging):
            run.release_lock()
