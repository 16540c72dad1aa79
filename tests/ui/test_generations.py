"""Online RL runs (grpo, rloo) in the TUI: the run view's Generations pane (each logged step's
prompts, completions and every reward's score; [ / ] browse the steps, the newest is followed
while the run lives) and the history's reward column. The run folders are written in the
trainer's format (rl_fixtures.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from rl_fixtures import PROMPTS, generation_row, rl_run
from test_run_view import open_run
from ui_fixtures import screen_text, synthetic_run, test_app, wait_for

from tests.e2e.helpers import llmtui, only_run
from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.completions import Generation, completions_path, parse_generation
from tuiapp.core.run_folder.metrics import JsonlWriter, read_jsonl
from tuiapp.ui.generations import GenerationBrowser, completion_lines, generation_lines
from tuiapp.ui.history import HistoryLoader, LiveSummary
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.widgets.generations import GenerationsView
from tuiapp.ui.widgets.pane_deck import PaneDeck
from tuiapp.ui.widgets.runs_table import cells


def generations(step: int, count: int = 2) -> list[Generation]:
    return [parse_generation(generation_row(step, 0, i)) for i in range(count)]


def test_the_browser_keeps_the_latest_steps_and_follows_the_newest():
    browser = GenerationBrowser(max_steps=3, max_per_step=2)
    assert browser.current is None and not browser.move(-1)
    browser.add(generations(1, count=5) + generations(2))
    assert browser.current == (2, "train") and browser.following and len(browser.steps[(1, "train")]) == 2
    assert browser.move(-1) and browser.current == (1, "train") and not browser.following
    browser.add(generations(3))
    assert browser.current == (1, "train")  # a new step does not move a step the user picked
    browser.add(generations(4) + [parse_generation(generation_row(4, 0, 0, split="eval"))])
    assert browser.keys == [(3, "train"), (4, "train"), (4, "eval")] and browser.dropped == 2  # bounded
    assert browser.current == (3, "train")  # the picked step was dropped: the oldest kept
    assert browser.move(1) and browser.current == (4, "train") and not browser.following
    assert browser.move(1) and browser.following and not browser.move(1)  # the newest: followed again


def test_lines_fit_the_width():
    lines = completion_lines("word " * 100, 30)
    assert len(lines) == 3 and lines[-1].endswith("…") and all(len(line) <= 30 for line in lines)
    assert completion_lines("a\n\nb", 30) == ["a", "", "b"]
    browser = GenerationBrowser()
    assert "no generations logged yet" in generation_lines(browser, 76)[0].plain
    browser.add(generations(7))
    text = [line.plain for line in generation_lines(browser, 76)]
    assert text[0].startswith("step 7 · 1/1 kept · 2 generations · following")
    assert text[1] == "mean total 1.12 · format 0.62 · answer 0.50"
    assert text[2] == "▸ " + PROMPTS[0]
    assert text[3] == "  total 2.00 · format 1.00 · answer 1.00 · adv +1.50 · 1 tok" and text[4] == "    5"
    assert text[5].endswith("12 tok clipped") and text[6:8] == ["    the answer might be 8 or so", "    or not"]
    long = parse_generation({**generation_row(8, 0, 0), "prompt": "How many? " * 30, "completion": "x" * 500})
    browser.add([long])
    text = [line.plain for line in generation_lines(browser, 40)]
    assert all(len(line) <= 40 for line in text) and text[2].endswith("…")  # the prompt: one line
    assert text[4:] == ["    " + "x" * 36] * 2 + ["    " + "x" * 35 + "…"]  # a completion: three lines at most


def test_the_generations_pane_at_80x24_browses_steps_and_follows_new_ones(tmp_path):
    root = tmp_path / "runs"
    run = rl_run(root, "tiny-grpo", steps=5, status="running")

    async def scenario():
        app = test_app(root, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            view = await open_run(pilot, run.id)
            shown = view.query_one(GenerationsView)
            await wait_for(pilot, lambda: view.generations.current == (5, "train"), what="the generations")
            assert "7 Generations" in screen_text(app)
            await pilot.press("7")
            assert view.query_one(PaneDeck).active_id == "pane-generations"
            text = screen_text(app)
            assert "step 5 · 5/5 kept · 8 generations · following" in text
            assert "mean total 0.69 · format 0.44 · answer 0.25" in text
            assert "▸ What is 2 + 3? Reply with the number only." in text
            assert "total 2.00 · format 1.00 · answer 1.00 · adv +1.50 · 1 tok" in text
            assert "[ Prev step ] Next step" in text  # the footer leads with them while the pane shows
            assert max(len(line.rstrip()) for line in text.splitlines()) <= 80
            await pilot.press("left_square_bracket", "left_square_bracket")
            assert "step 3 · 3/5 kept" in shown.plain and "might be 4 or so" in shown.plain
            with JsonlWriter(completions_path(run.path)) as writer:  # step 6 is scored
                writer.write({**generation_row(6, 1, 0), "completion": "3 (step six)"})
            await wait_for(pilot, lambda: (6, "train") in view.generations.steps, what="step 6")
            assert "step 3 · 3/6 kept" in shown.plain  # browsing: it stays on step 3
            await pilot.press("right_square_bracket", "right_square_bracket", "right_square_bracket")
            assert view.generations.following
            await pilot.pause(0.1)
            assert "step 6 · 6/6 kept · 1 generations · following" in screen_text(app)
            assert "3 (step six)" in screen_text(app)
            with JsonlWriter(completions_path(run.path)) as writer:  # following: step 7 shows as it comes
                writer.write(generation_row(7, 0, 0))
            await wait_for(pilot, lambda: "step 7 · 7/7 kept" in shown.plain, what="step 7 followed")

    asyncio.run(scenario())


def test_a_resume_that_rewrites_the_file_shows_it_afresh(tmp_path):
    root = tmp_path / "runs"
    run = rl_run(root, "tiny-rloo", method="rloo", steps=4, status="running")

    async def scenario():
        app = test_app(root, tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            view = await open_run(pilot, run.id)
            await wait_for(pilot, lambda: len(view.generations.steps) == 4, what="4 steps")
            text = completions_path(run.path).read_text().splitlines(keepends=True)
            atomic_write_text(completions_path(run.path), "".join(text[:16]))  # trim_completions to step 2
            await wait_for(pilot, lambda: view.generations.keys == [(1, "train"), (2, "train")], what="the rewrite")

    asyncio.run(scenario())


def test_other_methods_have_no_generations_pane_nor_step_keys(tmp_path):
    root = tmp_path / "runs"
    run = synthetic_run(root, "sft-run", method="sft")

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            view = await open_run(pilot, run.id)
            assert not view.query(GenerationsView) and "Generations" not in screen_text(app)
            await pilot.press("right_square_bracket", "7")
            assert view.query_one(PaneDeck).active_id == "pane-loss"
            assert "Next step" not in screen_text(app)

    asyncio.run(scenario())


def test_the_history_shows_the_recent_reward_of_rl_runs_only(tmp_path):
    root = tmp_path / "runs"
    rewards = [0.0] * 18 + [1.0, 2.0]  # the last 10% of 20 steps: 1.0 and 2.0
    rl_run(root, "grpo-run", steps=20, rewards=rewards, index=1)
    rl_run(root, "rloo-live", method="rloo", steps=4, status="running", index=2)
    synthetic_run(root, "sft-run", method="sft", index=3)
    loader = HistoryLoader(root)
    rows = {r.name: loader.summarize(r) for batch in loader.load_infos(loader.scan(), 10) for r in batch}
    assert rows["grpo-run"].reward == 1.5 and rows["sft-run"].reward is None
    assert rows["rloo-live"].reward == 0.8  # a live run's LiveSummary: its last row of 4 (0.2 * step)
    assert cells(rows["grpo-run"], 0)["reward"] == "1.500" and cells(rows["sft-run"], 0)["reward"] == ""
    live = LiveSummary()
    live.add([{"step": s, "reward": r} for s, r in enumerate(rewards, 1)])
    assert live.apply(rows["grpo-run"]).reward == 1.5 and live.apply(rows["sft-run"]).reward is None

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(160, 30)) as pilot:
            home = app.screen
            await wait_for(pilot, lambda: isinstance(home, HomeScreen) and home.loaded and all(
                r.summarized for r in home.model.rows.values()), what="the history")
            lines = screen_text(app).splitlines()
            header = next(line for line in lines if "acc/margin" in line)
            column = header.index("   reward") + len("   reward")
            assert next(line for line in lines if "grpo-run" in line)[column - 5:column] == "1.500"
            assert next(line for line in lines if "rloo-live" in line)[column - 5:column] == "0.800"
            assert next(line for line in lines if "sft-run" in line)[column - 9:column].strip() == ""
            home.model.sort_by("reward", reverse=True)
            assert [r.name for r in home.model.visible] == ["grpo-run", "rloo-live", "sft-run"]  # blanks last

    asyncio.run(scenario())


@pytest.mark.slow  # a real tiny GRPO run: ~15 s on 2 cores
def test_a_real_grpo_run_in_the_generations_pane_and_the_history(tmp_path, monkeypatch):
    """The trainer's own completions.jsonl and metrics.jsonl (tiny-grpo, 3 steps of 16 completions):
    the pane shows step 3's 16 generations, the mean total is the step's `reward` metric, and the
    history's reward is the answer reward (the task's) of the last step (10% of 3 rows rounds up to 1)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    root = tmp_path / "runs"
    llmtui("run", "recipes/tiny-grpo.toml", "--set", "train.max_steps=3", "--set", "train.save_steps=0",
           "--set", "model.name=tiny", "--set", "train.micro_batch=16", "--set", "train.eval_steps=0",
           "--set", "train.eval_on_start=false", runs_dir=root, timeout=600, check=True)
    run = only_run(root)
    last = [r for r in read_jsonl(run / "metrics.jsonl") if "reward" in r][-1]
    written = [json.loads(line) for line in completions_path(run).read_text().splitlines()]

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            view = await open_run(pilot, run.name)
            await wait_for(pilot, lambda: view.generations.current == (3, "train"), what="step 3")
            await pilot.press("7")
            shown = view.query_one(GenerationsView).plain
            assert "step 3 · 3/3 kept · 16 generations · following" in shown
            assert f"mean total {last['reward']:.2f} · answer " in shown and " · format " in shown
            prompt = next(w["prompt"] for w in written if w["step"] == 3)
            assert "▸ " + prompt[:40] in shown
            await pilot.press("left_square_bracket")
            assert "step 2 · 2/3 kept · 16 generations" in view.query_one(GenerationsView).plain
            app.pop_screen()
            home = app.screen
            await wait_for(pilot, lambda: all(r.summarized for r in home.model.rows.values()), what="history")
            assert home.model.rows[run.name].reward == last["rewards/answer/mean"]  # the task's reward, not the total

    asyncio.run(scenario())
