"""The review's defects of issue 43, each where a user sees it (Pilot, real files and processes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.widgets import Static
from ui_fixtures import screen_text, test_app, wait_for

from tuiapp.core.config.recipe import load_recipe
from tuiapp.ui.preview import read_trainer_view, trainer_view_text
from tuiapp.ui.screens.new_experiment import NewExperimentScreen

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def text_of(screen, selector: str) -> str:
    content = screen.query_one(selector, Static).render()
    return getattr(content, "plain", str(content))


async def open_recipe_form(pilot, recipe_path: Path) -> NewExperimentScreen:
    app = pilot.app
    await wait_for(pilot, lambda: app.screen.loaded, what="home")
    screen = NewExperimentScreen(load_recipe(recipe_path), title=recipe_path.name)
    await app.push_screen(screen)
    await wait_for(pilot, lambda: screen.last_check is not None and screen.filled, timeout=30,
                   what=f"first check, every section (check {screen.last_check is not None}, filled {screen.filled})")
    return screen


# ---------------------------------------------------------------- 3: the GRPO data preview


def test_grpo_records_preview_shows_prompts_and_reward_columns_not_a_format_error(tmp_path):
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_recipe_form(pilot, RECIPES / "tiny-grpo.toml")
            await wait_for(pilot, lambda: "records  1000" in text_of(screen, "#ne-data"), what="the prompts")
            text = text_of(screen, "#ne-data")
            assert "cannot tell the format" not in text and "prompts" in text
            assert "columns  answer, prompt" in text and "user: " in text and "answer: " in text
            assert "✓ valid" in text_of(screen, "#ne-verdict")

    asyncio.run(scenario())


@pytest.mark.slow  # tokenizes in a child process (torch import): ~15 s on 2 busy cores
def test_grpo_trainer_view_shows_each_prompt_with_its_tokens_not_zero_trained(tmp_path):
    recipe = load_recipe(RECIPES / "tiny-grpo.toml")
    examples, error = read_trainer_view(recipe.to_toml(), tmp_path)
    assert error is None and examples
    text = trainer_view_text("grpo", examples).plain
    assert "0 tokens, 0 trained" not in text
    assert f"— prompt 1 · {len(examples[0]['input_ids'])} tokens; the policy writes the completions" in text
    assert "<|im_start|>assistant" in text and "columns: answer=" in text


# ---------------------------------------------------------------- 4: ctrl+o on a fresh form


@pytest.mark.slow  # three forms filled: ~8 s on 2 busy cores
def test_ctrl_o_on_an_unedited_form_opens_the_choice_without_asking(tmp_path):
    from textual.command import CommandPalette

    from tuiapp.ui.screens.confirm import ConfirmScreen

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            await pilot.press("n", "ctrl+o", *"tiny-dpo")  # typed at once, as the form still fills
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette)
                           and "preset tiny-dpo" in screen_text(app), what="the picker's match")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, NewExperimentScreen) and app.screen.kind == "dpo",
                           what="the preset in the form")
            form = app.screen
            await wait_for(pilot, lambda: form.filled and form.last_check is not None, timeout=30, what="filled")
            assert not form.has_edits()
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="the picker")
            await pilot.press(*"tiny-grpo")
            await wait_for(pilot, lambda: "preset tiny-grpo" in screen_text(app), what="the fuzzy match")
            await pilot.press("enter")
            await wait_for(pilot, lambda: not isinstance(app.screen, CommandPalette), what="the choice")
            assert not isinstance(app.screen, ConfirmScreen)
            await wait_for(pilot, lambda: isinstance(app.screen, NewExperimentScreen) and app.screen.kind == "grpo",
                           what="the grpo preset in the form")

    asyncio.run(scenario())


# ---------------------------------------------------------------- 14: the history's reward of a GRPO run


def test_the_reward_column_shows_the_answer_reward_not_the_total(tmp_path):
    from rl_fixtures import rl_run

    from tuiapp.core.store.runs import Run
    from tuiapp.ui.history import HistoryLoader, LiveSummary
    from tuiapp.ui.primary_reward import primary_reward_key
    from tuiapp.ui.widgets.runs_table import cells

    root = tmp_path / "runs"
    rewards = [0.0] * 18 + [1.0, 2.0]  # totals; each of format and answer logs half of it
    run = rl_run(root, "grpo-run", steps=20, rewards=rewards, index=1)
    plain = rl_run(root, "no-answer", steps=20, rewards=rewards, index=2)
    for target, kinds in ((run, [{"kind": "format", "pattern": "x"}, {"kind": "answer", "column": "answer"}]),
                          (plain, [{"kind": "format", "pattern": "x"}])):
        loaded = Run(target.path).load()
        recipe = dict(loaded.record.recipe)
        recipe["method"] = {**recipe["method"], "rewards": kinds}
        loaded.record.set(recipe=recipe)
        loaded.save()
    loader = HistoryLoader(root)
    rows = {r.name: loader.summarize(r) for batch in loader.load_infos(loader.scan(), 10) for r in batch}
    assert rows["grpo-run"].reward_key == "rewards/answer/mean" and rows["grpo-run"].reward == 0.75
    assert rows["no-answer"].reward_key == "reward" and rows["no-answer"].reward == 1.5  # the total
    assert cells(rows["grpo-run"], 0)["reward"] == "0.750"
    live = LiveSummary()
    live.add([{"step": s, "reward": r, "rewards/answer/mean": r / 2} for s, r in enumerate(rewards, 1)])
    assert live.apply(rows["grpo-run"]).reward == 0.75 and live.apply(rows["no-answer"]).reward == 1.5
    # a reward flagged primary wins; a named one logs under its name; a python one under its function
    assert primary_reward_key({"method": {"rewards": [{"kind": "answer"}, {"kind": "length", "primary": True}]}}) \
        == "rewards/length/mean"
    assert primary_reward_key({"method": {"rewards": [{"kind": "answer", "name": "right"}]}}) == "rewards/right/mean"
    assert primary_reward_key({"method": {"rewards": [{"kind": "python", "function": "r.py:score", "primary": True}]}}) \
        == "rewards/score/mean"
    assert primary_reward_key(None) == "reward"
