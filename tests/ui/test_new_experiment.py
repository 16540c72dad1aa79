"""New-experiment form: fill, validate live, save, switch methods, clone, preview data (Pilot)."""

from __future__ import annotations

import asyncio
import json

import pytest
from textual.widgets import Select, Static
from ui_fixtures import screen_text, test_app, wait_for

from tuiapp.core import checks
from tuiapp.core.recipe import load_recipe
from tuiapp.core.runs import RunStore
from tuiapp.ui.screens.confirm import ConfirmScreen
from tuiapp.ui.screens.new_experiment import NewExperimentScreen


async def type_into(pilot, widget_id: str, text: str) -> None:
    """Replace an input's text the way a user does: focus, clear, type."""
    widget = pilot.app.screen.query_one(f"#{widget_id}")
    widget.focus()
    await pilot.press("home", "ctrl+k", *text)


async def open_form(pilot):
    app = pilot.app
    await wait_for(pilot, lambda: app.screen.loaded, what="home")
    await pilot.press("n")
    assert isinstance(app.screen, NewExperimentScreen)
    await wait_for(pilot, lambda: app.screen.last_check is not None, what="first check")
    return app.screen


async def settled(pilot, screen) -> None:
    """Wait for the check of the form as it is now."""
    await pilot.pause(0.35)  # the debounce
    generation = screen.generation
    await wait_for(pilot, lambda: screen.last_check is not None and screen.last_check.generation == generation and screen.generation == generation, what="check")


@pytest.mark.slow  # types a dozen fields key by key: ~9 s on 2 cores
def test_fill_form_and_save_gives_a_valid_recipe(tmp_path):
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await open_form(pilot)
            await type_into(pilot, "f-name", "my-exp")
            await type_into(pilot, "f-description", "tiny")
            screen.query_one("#method-kind", Select).value = "dora"
            await pilot.pause()
            await wait_for(pilot, lambda: screen.query("#f-method--rank"), what="dora fields")
            await type_into(pilot, "f-method--rank", "4")
            await type_into(pilot, "f-train--max-steps", "12")
            await type_into(pilot, "f-train--learning-rate", "5e-4")
            await type_into(pilot, "f-train--max-seq-len", "64")
            prompts = screen.query_one("#f-train--sample-prompts")  # long text: pasted, not typed
            prompts.value = '["What is the capital of France?"]'
            screen.query_one("#f-train--scheduler", Select).value = "linear"
            await settled(pilot, screen)
            assert "✓ valid" in str(screen.query_one("#ne-verdict", Static).render())
            await pilot.press("ctrl+s")
            path = tmp_path / "recipes" / "my-exp.toml"
            await wait_for(pilot, path.exists, what="the saved recipe")
            recipe = load_recipe(path)
            assert recipe.name == "my-exp" and recipe.method.kind == "dora" and recipe.method.rank == 4
            assert recipe.train.max_steps == 12 and recipe.train.learning_rate == 5e-4
            assert recipe.train.scheduler == "linear" and recipe.description == "tiny"
            assert recipe.train.sample_prompts == ["What is the capital of France?"]
            findings = checks.static_findings(recipe, RunStore(tmp_path / "runs"), tmp_path)
            assert not checks.has_errors(findings), checks.format_findings(findings)
            # saving again asks before replacing the file
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="confirm")
            await pilot.press("y")
            assert isinstance(app.screen, NewExperimentScreen)

    asyncio.run(scenario())


@pytest.mark.slow  # ~7 s on 2 cores
def test_invalid_values_show_validate_messages_and_block_save(tmp_path):
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await open_form(pilot)
            await type_into(pilot, "f-train--learning-rate", "fast")
            await type_into(pilot, "f-dataset--name", "demo:fatcs")
            await settled(pilot, screen)
            checks_text = str(screen.query_one("#ne-checks", Static).render())
            assert "train.learning_rate: Input should be a valid number" in checks_text
            assert screen.query_one("#f-train--learning-rate").has_class("-invalid")
            assert "✗" in str(screen.query_one("#ne-verdict", Static).render())
            await pilot.press("ctrl+s")
            assert not (tmp_path / "recipes").exists()
            await type_into(pilot, "f-train--learning-rate", "0.001")
            await settled(pilot, screen)
            checks_text = str(screen.query_one("#ne-checks", Static).render())
            assert "unknown demo dataset 'demo:fatcs'" in checks_text and "demo:facts" in checks_text
            assert not screen.query_one("#f-train--learning-rate").has_class("-invalid")

    asyncio.run(scenario())


@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_estimate_toml_and_dataset_preview(tmp_path):
    (tmp_path / "data").mkdir()
    rows = [{"instruction": f"Say {i}", "output": f"{i}"} for i in range(7)]
    (tmp_path / "data" / "mine.jsonl").write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(160, 48)) as pilot:
            screen = await open_form(pilot)
            await wait_for(pilot, lambda: "alpaca" in str(screen.query_one("#ne-data", Static).render()), what="demo preview")
            assert "[train]" in str(screen.query_one("#ne-toml", Static).render())
            assert str(screen.query_one("#ne-estimate", Static).render()).strip()
            screen.query_one("#pick-data", Select).value = "data/mine.jsonl"
            await wait_for(pilot, lambda: "Say 0" in str(screen.query_one("#ne-data", Static).render()), what="file preview")
            preview = str(screen.query_one("#ne-data", Static).render())
            assert "records  7" in preview and "alpaca" in preview
            await pilot.press("ctrl+n")
            assert screen.query_one("#ne-side").active == "tab-estimate"

    asyncio.run(scenario())


@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_clone_prefills_the_form(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="home")
            await pilot.press("end", "up", "e")  # the second oldest run: baseline
            assert isinstance(app.screen, NewExperimentScreen)
            values = app.screen.collect()
            assert values["name"] == "baseline" and values["train.max_steps"] == "40"
            assert values["train.learning_rate"] == "0.01" and values["train.eval_steps"] == "10"
            await pilot.press("escape")
            assert not isinstance(app.screen, NewExperimentScreen)

    asyncio.run(scenario())


@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_narrow_form_toggles_the_side_panes(tmp_path):
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_form(pilot)
            assert not screen.query_one("#ne-side").display
            await pilot.press("ctrl+o")
            assert screen.query_one("#ne-side").display and not screen.query_one("#ne-form").display
            await pilot.pause()
            assert "ok" in screen_text(app)
            await pilot.press("escape")
            assert screen.query_one("#ne-form").display
            await pilot.press("escape")
            assert not isinstance(app.screen, NewExperimentScreen)

    asyncio.run(scenario())
