"""The review's defects of issue 43, each where a user sees it (Pilot, real files and processes)."""

from __future__ import annotations

import asyncio
import time
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
    await wait_for(pilot, lambda: screen.last_check is not None and screen.filled, timeout=90,
                   what=f"first check, every section (check {screen.last_check is not None}, filled {screen.filled})")
    return screen


# ---------------------------------------------------------------- 3: the GRPO data preview


@pytest.mark.slow  # over ~3.5 s on 2 busy cores (10.5 s in the fast tier)
def test_grpo_records_preview_shows_prompts_and_reward_columns_not_a_format_error(tmp_path):
    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_recipe_form(pilot, RECIPES / "tiny-grpo.toml")
            await wait_for(pilot, lambda: "records  1000" in text_of(screen, "#ne-data"), what="the prompts")
            text = text_of(screen, "#ne-data")
            assert "cannot tell the format" not in text and "prompts" in text
            assert "columns  answer, guess, prompt" in text and "user: " in text and "answer: " in text
            # the preset starts from its chain's first step, which this runs folder lacks: said, with the name
            assert "no succeeded run named 'tiny-rl-format'" in text_of(screen, "#ne-verdict")
            checks = text_of(screen, "#ne-checks")  # 11: no file named as if it were written
            assert "fix: train that run first" in checks and "recipes/tiny-grpo.toml:" not in checks

    asyncio.run(scenario())


@pytest.mark.slow  # tokenizes in a child process (torch import): ~15 s on 2 busy cores
def test_grpo_trainer_view_shows_each_prompt_with_its_tokens_not_zero_trained(tmp_path, tmp_path_factory):
    from tests.after_runs import sft_run

    recipe = load_recipe(RECIPES / "tiny-grpo.toml")  # from run:tiny-rl-format: the form resolves it as the launch does
    examples, error = read_trainer_view(recipe.to_toml(), tmp_path, runs_root=tmp_path / "no-runs")
    assert examples is None and "no succeeded run named 'tiny-rl-format'" in error and "fix:" in error
    run = sft_run(tmp_path_factory)  # the session's finished tiny-sft run stands in for the format step
    recipe.model.name = "run:tiny-sft"
    examples, error = read_trainer_view(recipe.to_toml(), tmp_path, runs_root=run.parent)
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


# ---------------------------------------------------------------- the form's labels are whole


@pytest.mark.slow  # a form with every section filled
def test_every_field_label_shows_its_whole_name_at_80x24(tmp_path):
    """The labels longer than the label column (max_position_embeddings, early_stopping_*,
    vllm_gpu_memory_utilization...) were cut with an ellipsis: each shows whole."""
    from textual.widgets import Label

    from tuiapp.ui.widgets.form import LABEL_WIDTH, FieldRow

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_recipe_form(pilot, RECIPES / "tiny-grpo.toml")
            rows = list(screen.query(FieldRow))
            long = [row for row in rows if len(row.spec.name) > LABEL_WIDTH]
            assert {"vllm_gpu_memory_utilization", "max_position_embeddings"} <= {row.spec.name for row in long}
            for row in rows:
                label = row.query_one(Label)
                assert label.outer_size.width > len(row.spec.name) or (
                    len(row.spec.name) <= LABEL_WIDTH and label.outer_size.width == LABEL_WIDTH), row.spec.name

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


# ---------------------------------------------------------------- 8, 11: the Export dialog at 80x24


def test_export_dialog_at_80x24_names_the_run_keeps_its_keys_and_speaks_of_its_fields(runs_root, tmp_path):
    from test_evaluate_export import _home
    from ui_fixtures import REAL_IDS

    from tuiapp.ui.screens.export import ExportScreen

    run_id = REAL_IDS["sft"]
    (runs_root / run_id / "final").mkdir()

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await _home(pilot, run_id)
            await pilot.press("X")
            await wait_for(pilot, lambda: isinstance(app.screen, ExportScreen), what="the form")
            form = app.screen
            await pilot.pause()
            assert "Export sft" in screen_text(app) and f"Export {run_id}" not in screen_text(app)
            form.query_one("#export-ollama").value = "mine"  # an Ollama name without GGUF types
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: not form.running and "✗" in text_of(form, "#tool-error"), what="the refusal")
            refusal = text_of(form, "#tool-error")
            assert "--" not in refusal and "the ollama field" in refusal and "the gguf field" in refusal, refusal
            form.show_result((str(tmp_path / "exports" / "x"), [f"model-{i:05d}-of-00030.safetensors" for i in range(30)]))
            await pilot.pause()
            lines = screen_text(app).splitlines()
            assert any("esc closes" in line for line in lines)  # the dialog's own keys stay on screen
            assert "Export sft" in "".join(lines)
            assert "▄" not in lines[-1] and "▀" not in lines[0]  # the dialog leaves the top and bottom lines
            # the history behind stays in place: its header on the first line, its footer on the last
            # (a padded modal screen drew it one line down, its footer and status line gone)
            assert "llmtui" in lines[0] and "Quit" in lines[-1], (lines[0], lines[-1])
            assert all(line.rstrip()[-1:] == "█" for line in lines[1:-1])  # no table digit beside the border

    asyncio.run(scenario())


# ---------------------------------------------------------------- 11: the form's errors


def test_form_errors_have_no_pydantic_prefix_and_no_unsaved_file():
    from tuiapp.ui import formdata

    values = formdata.default_values("lora")
    values["dataset.eval_split"] = "2"
    check = formdata.check_values(values, "lora", "recipes/run.toml")
    (error,) = check.errors
    shown = formdata.form_error(error)
    assert shown.startswith("dataset.eval_split: eval_split as a fraction must be between 0 and 0.5"), shown
    assert "Value error" not in str(error) and "recipes/run.toml" not in shown


# ---------------------------------------------------------------- 10: docs/tui.md's key tables


def test_the_key_tables_of_docs_tui_name_the_pane_keys_the_screens_bind():
    from tuiapp.ui.screens.compare import CompareScreen
    from tuiapp.ui.screens.run_view import RunViewScreen

    docs = (Path(__file__).resolve().parents[2] / "docs" / "tui.md").read_text(encoding="utf-8")
    for screen in (CompareScreen, RunViewScreen):
        digits = sorted(int(b.key) for b in screen.BINDINGS if b.key.isdigit() and b.action.startswith("pane("))
        assert f"| `1`-`{digits[-1]}`" in docs, (screen.__name__, digits[-1])
    assert "`1`-`6`" not in docs  # the six panes of an older app
    assert "\n7. **Generations**" not in docs  # one numbered pane 7 (Markdown renumbered a second to 8)


# ---------------------------------------------------------------- 12: text cut at 80 columns


def test_placeholders_fit_80_columns():
    from tuiapp.ui.generations import GenerationBrowser, generation_lines
    from tuiapp.ui.screens.chat import INPUT_HINTS, input_hint

    lines = generation_lines(GenerationBrowser(), 76)
    assert len(lines) > 1 and all(len(line.plain) <= 76 for line in lines)
    assert " ".join(line.plain for line in lines).endswith("(method.log_completions = false writes none)")
    assert len(input_hint(80)) <= 74 and input_hint(200) == INPUT_HINTS[0]


def test_help_wraps_each_description_under_itself_at_80x24(runs_root, tmp_path):
    from tuiapp.ui.screens.help import KEY_WIDTH, HelpScreen

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            await pilot.press("question_mark")
            await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
            await pilot.pause()
            text = app.screen.query_one("#help-text", Static).render()
            plain = getattr(text, "plain", str(text)).splitlines()
            assert max(len(line) for line in plain) <= 70
            continued = [line for line in plain if line.startswith(" " * KEY_WIDTH)]
            assert continued and all(line[KEY_WIDTH] != " " for line in continued)
            frame = screen_text(app).splitlines()
            assert not any(line.strip("│ ").startswith(("a run", "the run")) for line in frame)  # no ragged wrap

    asyncio.run(scenario())


# ---------------------------------------------------------------- 13: toasts at 80x24


def test_a_toast_at_80x24_is_compact_and_leaves_the_names_and_the_status_line(runs_root, tmp_path):
    from textual.widgets._toast import Toast

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            app.notify("stopped serving 20260101-000218-sft-f004 on http://localhost:8000/v1", title="Served models")
            await wait_for(pilot, lambda: app.screen.query(Toast), what="the toast")
            await pilot.pause()
            region = app.screen.query_one(Toast).region
            assert region.width <= 44 and region.x > 30 and region.height <= 4  # title + text, no blank lines
            assert region.bottom <= 24 - 3  # the status line and the footer stay
            frame = screen_text(app).splitlines()
            assert "7 runs" in frame[-2] and frame[4].startswith("  live ")  # the status line, the names

    asyncio.run(scenario())


# ---------------------------------------------------------------- 6: the data preview's wait has a clock


def test_the_trainer_view_says_how_long_it_has_waited():
    waiting = trainer_view_text("sft", None, elapsed_s=83.4).plain
    assert "tokenizing the first examples… 1:23" in waiting and "processor" in waiting
    assert "1:23" not in trainer_view_text("sft", None).plain


# ---------------------------------------------------------------- 1 (title): compare's loading state fits


def test_compare_title_puts_the_loading_count_first_so_120_columns_show_it(runs_root, tmp_path):
    from test_compare import open_compare

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_compare(pilot, runs_root, ["baseline", "high-lr", "sft"])
            title = text_of(screen, "#cmp-title")
            assert title.startswith("3 runs by step") and "loading" not in title
            screen.loaded, screen.runs = False, screen.runs[:1]  # as while the other two are read
            screen._show_title()
            await pilot.pause()
            line = next(line for line in screen_text(app).splitlines() if "runs by step" in line)
            assert line.strip().startswith("loading 1/3 runs… · 3 runs by step")

    asyncio.run(scenario())


# ---------------------------------------------------------------- 5: the history's idle polls


def test_the_history_polls_a_share_of_its_finished_runs_in_turn(tmp_path):
    """With thousands of finished runs each poll stats a bounded share of them (every one in turn),
    not all of them every 2 s (12-19 % of a core idle with 5,000 runs)."""
    import os

    from ui_fixtures import synthetic_run

    from tuiapp.ui.history import POLL_SHARE, HistoryLoader, Rotation

    rotation = Rotation()
    many = list(range(10_000))
    shares = [rotation.take(many) for _ in range(10_000 // POLL_SHARE)]
    assert POLL_SHARE <= 1000 and all(len(share) == POLL_SHARE for share in shares)
    assert sorted(i for share in shares for i in share) == many  # each run once in ten polls
    assert Rotation(3).take([1, 2]) == [1, 2]  # a short list is taken whole

    root = tmp_path / "runs"
    runs = [synthetic_run(root, f"done-{i}", index=i, steps=4, eval_every=0, samples=False) for i in range(7)]
    loader = HistoryLoader(root)
    for batch in loader.load_infos(loader.scan(), 10):
        for row in batch:
            loader.summarize(row)
    assert not loader.active and loader.poll() == []
    loader.rotation = Rotation(3)
    later = runs[0].path.stat().st_mtime + 60
    for run in runs:  # each run.json rewritten (a resume, a tag from the CLI)
        os.utime(run.path / "run.json", (later, later))
    seen = []
    for _ in range(3):
        changed = loader.poll()
        assert len(changed) <= 3, [row.id for row in changed]  # a share per poll
        seen += [row.id for row in changed]
    assert sorted(seen) == sorted(run.path.name for run in runs)  # each one within 7/3 polls

    # new run folders: the runs folder is listed again only when its mtime moved (or moved < 1 s ago)
    listings = []
    run_names = loader.store.run_names
    loader.store.run_names = lambda: listings.append(1) or run_names()  # counts the real listings
    past = time.time() - 30
    os.utime(root, (past, past))
    assert loader.scan() == [] and loader.scan() == [] and loader.scan() == []
    assert len(listings) == 1  # listed once; then its unchanged mtime says nothing is new
    fresh = synthetic_run(root, "fresh", index=9, steps=2, eval_every=0, samples=False)
    assert loader.scan() == [fresh.path.name] and len(listings) == 2  # a new folder moved the mtime


# ---------------------------------------------------------------- 2: n -> the form, its models from the history


def test_the_forms_run_models_come_from_the_history_rows():
    from tuiapp.ui.candidates import model_candidates, run_models_of

    assert run_models_of([]) == []
    assert model_candidates(None, [], [])[1:] == []  # the rows given: no run folder is read (no store)


@pytest.mark.slow  # a form filled: ~4 s on 2 busy cores
def test_n_opens_the_form_before_it_looks_for_models_then_lists_the_historys_runs(runs_root, tmp_path):
    """The run:NAME models are looked for once the form is whole, from the history's rows (with
    5,000 runs every run.json was read again as the form opened: 2.5-3.2 s to take keys)."""
    from ui_fixtures import REAL_IDS

    (runs_root / REAL_IDS["baseline"] / "final").mkdir()

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            await pilot.press("n")
            await wait_for(pilot, lambda: isinstance(app.screen, NewExperimentScreen), what="the form")
            form = app.screen
            await pilot.press(*"abc")
            looked = []  # the models' worker (which reads the run folders) while the sections mount
            while not form.filled:
                looked += [w.name for w in app.workers if w.node is form and w.group == "models"]
                looked += ["names"] if form.model_names else []
                await pilot.pause(0.01)
            assert not looked, looked  # started once the form is whole, not as it opens
            assert form.query_one("#f-name").value.endswith("abc")
            await wait_for(pilot, lambda: form.model_names, timeout=30, what="the models")
            runs = [name for name in form.model_names if name.startswith("run:")]
            assert runs == ["run:baseline"], form.model_names  # succeeded with a final model

    asyncio.run(scenario())


# ---------------------------------------------------------------- 12: the chat's title and input at 80 columns


def test_the_chat_title_is_one_line_and_the_input_hint_and_keys_fit_80_columns(runs_root, tmp_path):
    from textual.widgets import Input
    from ui_fixtures import REAL_IDS

    from tuiapp.core.config.recipe import GenerateSpec
    from tuiapp.ui.screens.chat import INPUT_HINTS, ChatScreen, input_hint

    event = {"event": "ready", "target": {"label": "final", "step": 40, "kind": "full", "method": "sft",
                                          "base": "/models/tiny-base"},
             "settings": {**GenerateSpec().model_dump(), "system": "You answer in one short sentence."}}

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            app.open_chat(REAL_IDS["sft"])
            await wait_for(pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen.failed, what="no final")
            screen = app.screen
            screen.failed = None  # as if its server had loaded: the server's ready event
            screen.post_message(ChatScreen.Ready(event))
            await wait_for(pilot, lambda: screen.ready, what="ready")
            await pilot.pause()
            lines = screen_text(app).splitlines()
            title = next(i for i, line in enumerate(lines) if line.lstrip().startswith("sft · final (step 40)"))
            assert lines[title].rstrip().endswith("…") and len(lines[title].rstrip()) <= 80
            assert lines[title + 1].lstrip().startswith("╭")  # the column's border: no second title line
            field = screen.query_one("#chat-input", Input)
            assert field.placeholder == input_hint(80) and field.placeholder != INPUT_HINTS[0]
            assert field.placeholder in screen_text(app)  # whole, inside the input's box
            footer = lines[-1].rstrip()  # whole keys, esc first: it was cut off, a stray 'H' after the palette
            assert footer.endswith("^p palette") and "esc Back" in footer, footer
            await pilot.resize_terminal(160, 36)
            await wait_for(pilot, lambda: field.placeholder == INPUT_HINTS[0], what="the whole hint when wide")

    asyncio.run(scenario())


@pytest.mark.slow  # tokenizes in a child process (torch import): ~10 s on 2 busy cores
def test_the_data_tab_shows_the_wait_for_the_trainers_view_ticking(tmp_path):
    """The data tab's wait for the trainer's view (a VLM's processor: a minute or more) shows a
    clock that moves on screen, then the examples replace it."""
    import re

    from textual.widgets import TabbedContent

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_recipe_form(pilot, RECIPES / "tiny-sft.toml")
            await pilot.press("ctrl+t")  # the side panel at 80 columns
            screen.query_one("#ne-side", TabbedContent).active = "tab-data"
            clocks = set()

            def seen() -> bool:
                text = text_of(screen, "#ne-trainer-view")
                clocks.update(re.findall(r"tokenizing the first examples… (\d+:\d\d)", text))
                return "— example 1" in text

            await wait_for(pilot, seen, timeout=120, what="the examples")
            assert len(clocks) >= 2 and "0:01" in clocks, clocks  # it ticked while it waited

    asyncio.run(scenario())
