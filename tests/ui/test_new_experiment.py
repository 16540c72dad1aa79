"""New-experiment form: fill, validate live, save, switch methods, clone, preview data (Pilot)."""

from __future__ import annotations

import asyncio
import json

import pytest
from textual.command import CommandPalette
from textual.widgets import Select, Static, TabbedContent, TextArea
from textual.widgets._select import SelectCurrent, SelectOverlay
from ui_fixtures import screen_text, test_app, wait_for

from tuiapp.core.config.recipe import load_recipe
from tuiapp.core.prelaunch import door
from tuiapp.core.store.runs import RunStore
from tuiapp.ui.candidates import PRESETS_DIR
from tuiapp.ui.messages import ModelsFound
from tuiapp.ui.screens import new_experiment
from tuiapp.ui.screens.confirm import ConfirmScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.new_experiment import NewExperimentScreen
from tuiapp.ui.widgets.form import FieldRow


async def type_into(pilot, widget_id: str, text: str) -> None:
    """Replace an input's text the way a user does: focus, clear, type."""
    widget = pilot.app.screen.query_one(f"#{widget_id}")
    widget.focus()
    await wait_for(pilot, lambda: pilot.app.focused is widget, what=f"focus on {widget_id}")  # a fresh row mounts first
    await pilot.press("home", "ctrl+k", *text)


async def open_form(pilot):
    app = pilot.app
    await wait_for(pilot, lambda: app.screen.loaded, what="home")
    await pilot.press("n")
    assert isinstance(app.screen, NewExperimentScreen)
    # the models are found once every section is filled: waited for, so that a test's own
    # ModelsFound comes after the form's
    # (the check runs in a worker beside the test's other workers: on 2 busy cores it took over 10 s)
    await wait_for(pilot, lambda: app.screen.last_check is not None and app.screen.filled and app.screen.model_names,
                   timeout=30, what="first check, every section, the models found")
    return app.screen


async def settled(pilot, screen) -> None:
    """Wait for the check of the form as it is now."""
    await pilot.pause(0.35)  # the debounce
    await wait_for(pilot, lambda: not screen.check_pending and screen.last_check is not None
                   and screen.last_check.generation == screen.generation, timeout=30, what="check")


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
            prompts.text = "What is the capital of France?"
            screen.query_one("#f-train--scheduler", Select).value = "linear"
            await settled(pilot, screen)
            verdict = str(screen.query_one("#ne-verdict", Static).render())
            assert "✓ valid" in verdict
            if screen.last_check is not None and screen.last_check.on_cpu:  # a CPU rank's memory: RAM, runtime too
                assert "GB of RAM per rank" in verdict and "estimate 0.0 GB" not in verdict
            await pilot.press("ctrl+s")
            path = tmp_path / "recipes" / "my-exp.toml"
            await wait_for(pilot, path.exists, what="the saved recipe")
            recipe = load_recipe(path)
            assert recipe.name == "my-exp" and recipe.method.kind == "dora" and recipe.method.rank == 4
            assert recipe.train.max_steps == 12 and recipe.train.learning_rate == 5e-4
            assert recipe.train.scheduler == "linear" and recipe.description == "tiny"
            assert recipe.train.sample_prompts == ["What is the capital of France?"]
            findings = door.recipe_findings(recipe, RunStore(tmp_path / "runs"), tmp_path)
            assert not door.has_errors(findings), door.format_findings(findings)
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
            await pilot.pause()
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
            await pilot.press("ctrl+t")
            assert screen.query_one("#ne-side").display and not screen.query_one("#ne-form").display
            await pilot.pause()
            assert "ok" in screen_text(app)
            await pilot.press("escape")
            assert screen.query_one("#ne-form").display
            await pilot.press("escape")
            assert not isinstance(app.screen, NewExperimentScreen)

    asyncio.run(scenario())


SIZES = [(80, 24), (120, 36)]
IDS = ["80x24", "120x36"]


def text_of(screen, selector: str) -> str:
    content = screen.query_one(selector, Static).render()
    return getattr(content, "plain", str(content))


def in_view(screen, widget) -> bool:
    return widget.region.height > 0 and screen.query_one("#ne-form").region.contains_region(widget.region)


@pytest.mark.slow  # the form's Pilot tests take seconds each on 2 busy cores
@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_keyboard_focus_help_line_and_name_message(tmp_path, size):
    """Focus starts on the name, every tab lands on a field that shows, the focused field's label
    is an accent tab and its description is in the help line; a bad name reads as words."""
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=size) as pilot:
            screen = await open_form(pilot)
            await pilot.pause()
            assert app.focused.id == "f-name" and in_view(screen, app.focused)
            assert text_of(screen, "#ne-help").startswith("name — Run name")
            labels = {label.parent.spec.key: label for label in screen.query(".field-label") if hasattr(label.parent, "spec")}
            assert labels["name"].styles.background != labels["description"].styles.background  # the focus ring
            seen = set()
            for _ in range(40):  # the form's fields before the method grew past 20
                await pilot.press("tab")
                focused = app.focused
                assert focused is not None and in_view(screen, focused), (focused, focused.region)
                seen.add(focused.id)
                spec = next((s for s in screen.specs.values() if s.widget_id == focused.id), None)
                if spec is not None:
                    assert text_of(screen, "#ne-help").startswith(f"{spec.key} — ")
            assert {"f-dataset--name", "method-kind", "pick-model"} <= seen
            await type_into(pilot, "f-name", "my run!")
            await settled(pilot, screen)
            verdict = text_of(screen, "#ne-verdict")
            assert "'my run!' is not a valid name" in verdict and "^[" not in text_of(screen, "#ne-checks")
            assert "letters, digits" in text_of(screen, "#ne-checks")

    asyncio.run(scenario())


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_list_fields_take_one_item_per_line_and_evals_hold_out_data(tmp_path, size):
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=size) as pilot:
            screen = await open_form(pilot)
            prompts = screen.query_one("#f-train--sample-prompts", TextArea)
            prompts.focus()
            await pilot.press(*"Hi there", "enter", *"What is 2+2?")
            assert in_view(screen, prompts)
            assert "one item per line" in text_of(screen, "#ne-help")
            await type_into(pilot, "f-method--target-modules", "")  # a TextArea too: one module per line
            targets = screen.query_one("#f-method--target-modules", TextArea)
            targets.text = "q_proj\nv_proj"
            await settled(pilot, screen)
            recipe = screen.last_check.check.recipe
            assert recipe is not None, text_of(screen, "#ne-checks")
            assert recipe.train.sample_prompts == ["Hi there", "What is 2+2?"]
            assert recipe.method.target_modules == ["q_proj", "v_proj"]
            assert recipe.dataset.eval_split == 0.05  # prompts are answered at evals: data is held out
            assert "5% held out for eval" in text_of(screen, "#ne-verdict")
            assert "5% of the training data is held out" in text_of(screen, "#ne-checks")

    asyncio.run(scenario())


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_esc_and_q_ask_before_dropping_edits(tmp_path, size):
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=size) as pilot:
            screen = await open_form(pilot)
            await pilot.press("escape")  # no edits: straight back
            assert isinstance(app.screen, HomeScreen)
            screen = await open_form(pilot)
            await type_into(pilot, "f-name", "edited")
            await pilot.press("escape")
            assert isinstance(app.screen, ConfirmScreen) and "Drop the edits" in screen_text(app)
            await pilot.press("n")
            assert app.screen is screen and screen.collect()["name"] == "edited"
            screen.query_one("#method-kind").focus()  # not a text box: q is the app's quit key
            await pilot.press("q")
            assert isinstance(app.screen, ConfirmScreen) and "Quit and drop the edits" in screen_text(app)
            await pilot.press("n")
            assert app.screen is screen and app.is_running
            await pilot.press("escape", "y")
            assert isinstance(app.screen, HomeScreen)

    asyncio.run(scenario())


@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_ctrl_o_opens_a_recipe_or_preset_by_fuzzy_search(tmp_path, size):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "mine.toml").write_text('name = "mine"\n[model]\nname = "tiny"\n[method]\nkind = "ia3"\n[train]\nmax_steps = 7\n',
                                                    encoding="utf-8")

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=size) as pilot:
            await open_form(pilot)
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="the picker")
            await pilot.press(*"tiny-dpo")
            await wait_for(pilot, lambda: "preset tiny-dpo" in screen_text(app), what="the fuzzy match")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, NewExperimentScreen) and app.screen.sub_title == "preset tiny-dpo",
                           what="the preset in the form")
            form = app.screen
            assert form.kind == "dpo" and form.collect()["name"] == "tiny-dpo"
            await pilot.pause()
            await type_into(pilot, "f-description", "changed")
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="the picker")
            await pilot.press(*"recipes/mine")
            await wait_for(pilot, lambda: "recipes/mine.toml" in screen_text(app), what="the user's recipe")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question about the edits")
            await pilot.press("y")
            await wait_for(pilot, lambda: isinstance(app.screen, NewExperimentScreen) and app.screen.kind == "ia3",
                           what="the recipe in the form")
            assert app.screen.collect()["train.max_steps"] == "7"
            await pilot.press("escape")  # opened, not edited: no question
            assert isinstance(app.screen, HomeScreen)

    asyncio.run(scenario())


@pytest.mark.slow
def test_a_mixture_in_the_form_says_its_sources_and_what_each_holds_out(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "mix.toml").write_text(
        'name = "mix"\n[model]\nname = "tiny"\n[dataset]\n[[dataset.sources]]\nname = "demo:facts"\nweight = 3\n'
        '[[dataset.sources]]\nname = "demo:chat"\n[method]\nkind = "sft"\n[train]\nmax_steps = 7\n',
        encoding="utf-8")

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(120, 36)) as pilot:
            await open_form(pilot)
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="the picker")
            await pilot.press(*"recipes/mix")
            await wait_for(pilot, lambda: "recipes/mix.toml" in screen_text(app), what="the recipe")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, NewExperimentScreen) and app.screen.sub_title
                           and "mix" in app.screen.sub_title, what="the recipe in the form")
            form = app.screen
            await settled(pilot, form)
            assert "data mix(facts:3, chat:1))" in text_of(form, "#ne-checks")
            assert "held out" not in text_of(form, "#ne-verdict")
            await type_into(pilot, "f-train--eval-steps", "5")
            await settled(pilot, form)
            # evals asked for, no source set eval_split: each holds out 5% (the dataset's own split stays 0)
            assert "5% held out for eval per source" in text_of(form, "#ne-verdict")

    asyncio.run(scenario())


@pytest.mark.slow
def test_found_list_filters_as_you_type(tmp_path):
    names = ["tiny", "Qwen/Qwen2.5-0.5B", *(f"run:exp-{i:05d}" for i in range(10_000))]

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_form(pilot)
            screen.post_message(ModelsFound(names))
            await wait_for(pilot, lambda: len(screen.model_names) == len(names), what="the candidates")
            pick = screen.query_one("#pick-model", Select)
            assert len(pick._options) <= 41 and pick.prompt.endswith("of 10002…")  # not 10,000 run: entries
            await type_into(pilot, "f-model--name", "exp-0999")
            await pilot.pause()
            shown = [option[1] for option in pick._options if option[1] is not Select.NULL]
            assert shown[:10] == [f"run:exp-{i:05d}" for i in range(9990, 10_000)]  # containing it, then fuzzy ones
            assert pick.prompt == f"{len(shown)} of 10002…" and len(shown) < 41
            await type_into(pilot, "f-model--name", "qwen")
            await pilot.pause()
            assert [o[1] for o in pick._options if o[1] is not Select.NULL] == ["Qwen/Qwen2.5-0.5B"]

    asyncio.run(scenario())


@pytest.mark.slow  # tokenizes in a child process (torch import): ~10 s on 2 cores; the wide size twice
@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_data_tab_shows_the_examples_as_the_trainer_sees_them(tmp_path, size):
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=size) as pilot:
            screen = await open_form(pilot)
            if size[0] < 120:
                await pilot.press("ctrl+t")
            screen.query_one("#ne-side", TabbedContent).active = "tab-data"
            await wait_for(pilot, lambda: "— example 1" in text_of(screen, "#ne-trainer-view"), timeout=120,
                           what="the chat examples")
            view = screen.query_one("#ne-trainer-view", Static).render()
            assert "⟦<|im_start|>user" in view.plain  # the prompt: masked (-100)
            trained = [view.plain[s.start:s.end] for s in view.spans if "green" in str(s.style)]
            assert any("<|im_end|>" in t for t in trained[1:]) and not any("<|im_start|>user" in t for t in trained)
            if size[0] < 120:
                return  # the pretrain blocks (a second tokenizing child, ~8 s) once, at the wide size
            screen.query_one("#method-kind", Select).value = "pretrain"
            await pilot.pause()
            screen.set_field("dataset.name", "demo:text")
            await wait_for(pilot, lambda: "— block 1" in text_of(screen, "#ne-trainer-view"), timeout=120,
                           what="the pretrain blocks")
            text = text_of(screen, "#ne-trainer-view")
            assert "every token trained" in text and "(all)" in text and "⟦" not in text.split("— block 1")[1]

    asyncio.run(scenario())


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
def test_o_opens_the_picker_where_focus_is_not_typing_text(tmp_path, size):
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=size) as pilot:
            await open_form(pilot)
            app.screen.query_one("#method-kind", Select).focus()
            await pilot.pause()
            await pilot.press("o")
            await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette), what="the picker from a choice")
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, NewExperimentScreen), what="the form again")
            await type_into(pilot, "f-description", "o")
            assert isinstance(app.screen, NewExperimentScreen)
            assert app.screen.collect()["description"].endswith("o")  # in a text field, o is a letter

    asyncio.run(scenario())


@pytest.mark.slow  # over ~5 s on 2 cores
@pytest.mark.parametrize("size,width_class", [((80, 24), "-narrow"), ((120, 36), "-wide")], ids=["80x24", "120x36"])
def test_a_pushed_screen_has_its_width_class_before_its_first_frame(tmp_path, size, width_class):
    """A real terminal sends no resize when a screen is pushed: the form drew its wide layout at 80 columns."""

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen), what="the history")
            form = NewExperimentScreen()
            app.push_screen(form)
            assert form.has_class(width_class) and not form.has_class({"-narrow": "-wide", "-wide": "-narrow"}[width_class])
            await wait_for(pilot, lambda: app.screen is form and form.query("#f-name"), what="the form")

    asyncio.run(scenario())


@pytest.mark.slow  # three forms filled: ~6.5 s
def test_a_form_switched_away_while_its_sections_fill_stops_filling(tmp_path):
    """ctrl+o replaces a form that may still be mounting its lower sections a few rows a frame; the
    old form stops there (it raised NoMatches on its removed section, failing the app)."""
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            await pilot.press("n")
            for name in ("tiny-dpo", "tiny-lora", "tiny-dpo"):
                await app.switch_screen(NewExperimentScreen(load_recipe(PRESETS_DIR / f"{name}.toml"), title=name))
            await wait_for(pilot, lambda: app.screen.filled, timeout=30, what="the last form, every section")
            assert app.screen.kind == "dpo"
            # the exact moment, which a switch hits only now and then: the form is still attached and
            # its sections are being pruned when the next rows come due
            form = app.screen
            section = form.later_sections[-1]
            await form.query_one(f"#section-{section}").remove()
            await form._fill_later_sections([section])
            # a Select mounting as the form is pruned: its label gone before its value is shown
            select = form.query_one("#pick-data", Select)
            await select.query_one(SelectCurrent).query_one("#label").remove()
            closing = form.remove()
            select.value = select._options[-1][1]
            await closing
            assert app.return_code is None  # nothing raised in the app

    asyncio.run(scenario())


@pytest.mark.slow  # a form filled: ~3.5 s
def test_a_form_closing_with_the_app_while_its_sections_fill_stops_filling(tmp_path):
    """The app closing prunes a form's widgets before the form, whose queue still runs what was left
    for after a frame: the model rows' found… list raised NoMatches on its Select's removed overlay."""
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            await pilot.press("n")
            form = app.screen
            await wait_for(pilot, lambda: form.filled and form.model_names, what="every section, the models")
            # the exact moment: the Select's overlay closed, the form marked for pruning, not yet gone
            pick = form.query_one("#pick-model", Select)
            await pick.query_one(SelectOverlay).remove()
            closing = form.remove()  # what closing the app does to each screen on its stack
            assert form.is_attached and form.taken_down
            form._show_found_models()
            await form._fill_later_sections(["model"])
            await closing

    asyncio.run(scenario())


@pytest.mark.slow  # a form filled: ~4 s
def test_keys_typed_as_the_form_opens_land_in_the_name(tmp_path):
    """Only the run's fields are on the form's first frame (the other sections mount a few rows a
    frame after it): keys typed right after n go to the name while they mount, none lost."""
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            await pilot.press("n", *"-abc")
            form = app.screen
            assert isinstance(form, NewExperimentScreen)
            await wait_for(pilot, lambda: form.filled, what="every section")
            assert form.query_one("#f-name").value == "-abc"  # focusing selects the default name: typing replaces it
            assert form.collect()["model.name"] and form.query_one("#method-kind", Select).value == "lora"
            assert all(form.query(f"#{spec.widget_id}") for spec in form.specs.values())

    asyncio.run(scenario())


@pytest.mark.slow  # a form filled after a check: ~4 s
def test_what_comes_before_the_rows_mount_reaches_them(tmp_path, monkeypatch):
    """A value set and the check's verdict on it, before the rows of the model and dataset are
    mounted: both show on them once they are; the models are found once the form is whole (with
    thousands of runs their reading would compete with the fill)."""
    fills = []
    monkeypatch.setattr(NewExperimentScreen, "_fill_later_sections", lambda self, *args: fills.append(args))

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            await pilot.press("n", *"-x")
            form = app.screen
            await wait_for(pilot, lambda: form.last_check is not None, what="first check")
            assert fills and not form.query("#f-model--name") and not form.query("#f-dataset--max-samples")
            assert not form.model_names
            form.set_field("dataset.max_samples", "abc")  # not mounted yet: checked as if typed
            await settled(pilot, form)
            assert "dataset.max_samples" in form.last_check.check.error_keys
            monkeypatch.undo()
            form.call_after_refresh(form._fill_later_sections, *fills[0])
            await wait_for(pilot, lambda: form.filled and form.model_names, what="every section, then the models")
            field = form.query_one("#f-dataset--max-samples")
            assert field.value == "abc" and field.has_class("-invalid")
            assert not form.query_one("#f-dataset--name").has_class("-invalid")
            assert form.query_one("#f-model--name").suggester is not None
            assert str(form.query_one("#pick-model", Select).prompt).startswith("found")
            assert form.query_one("#f-name").value == "-x" and form.has_edits()

    asyncio.run(scenario())


@pytest.mark.slow  # over ~3.5 s on 2 busy cores (9.1 s in the fast tier)
def test_the_rows_wait_while_keys_come(tmp_path, monkeypatch):
    """A key typed while the lower sections mount is shown before more rows mount: the filling
    waits until typing pauses (six rows and their layout took ~0.1 s, the key's frame after them)."""
    monkeypatch.setattr(new_experiment, "TYPING_PAUSE_S", 1.5)  # three times the wait checked below

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            await pilot.press("n", "x")
            form = app.screen
            assert form.last_typed and form.query_one("#f-name").value == "x"
            rows = len(form.query(FieldRow))
            await pilot.pause(0.5)
            assert len(form.query(FieldRow)) == rows and not form.filled  # held while typing
            await wait_for(pilot, lambda: form.filled, what="every section, once typing paused")
            assert all(form.query(f"#{spec.widget_id}") for spec in form.specs.values())
            assert form.query_one("#f-name").value == "x"

    asyncio.run(scenario())
