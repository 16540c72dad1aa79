"""New experiment: a form generated from the recipe schema, validated live with the messages of
`llmtui validate`, a memory estimate, a dataset preview (as the trainer sees it) and the TOML;
open a recipe or preset, save or launch.

Keyboard first: the focused field's description is always in the help line under the form,
enter moves to the next field, esc asks before it drops edits, and ctrl+o opens any recipe."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.command import SimpleCommand
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.suggester import SuggestFromList
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Input, Select, Static, TabbedContent, TabPane, TextArea

from tuiapp.core.common.errors import UserError
from tuiapp.core.common.methods import is_rl
from tuiapp.core.config.recipe import AUTO_EVAL_SPLIT, METHOD_KINDS, METHOD_MODELS, DatasetSpec, Recipe, load_recipe
from tuiapp.core.store.runs import RunStore
from tuiapp.ui import actions, formdata
from tuiapp.ui.candidates import (
    DEMO_DATASETS,
    RecipeChoice,
    filter_models,
    local_datasets,
    model_candidates,
    recipe_choices,
)
from tuiapp.ui.footer_keys import footer_by_priority, plural
from tuiapp.ui.messages import ActionFailed, DatasetInspected, DryStepped, ModelsFound, RecipeChecked, RunLaunched
from tuiapp.ui.preview import dataset_preview, read_trainer_view, rl_dataset_info, trainer_view_text
from tuiapp.ui.widgets.example_images import ExampleImages
from tuiapp.ui.widgets.form import FieldRow, FieldSelect, FormSection, being_removed, field_help, read_value, set_value
from tuiapp.ui.widgets.header import AppHeader
from tuiapp.ui.widgets.key_footer import KeyFooter
from tuiapp.ui.worker_errors import reports_errors

CHECK_DELAY_S = 0.25
FILL_ROWS = 6  # fields mounted per frame after the first (~30 ms each)
TYPING_PAUSE_S = 0.15  # the filling waits while keys come: a key typed is shown before more rows mount
TRAINER_VIEW_DELAY_S = 1.0  # the trainer's view costs a child process: only once typing pauses
PICK_HELP = {
    "pick-model": "Models found here: the bundled one, the HF cache's, run:NAME of succeeded runs. Typing in "
                  "the model box filters this list.",
    "pick-data": "Demo datasets and the data files in ./data.",
    "method-kind": "The training method; its own fields follow. " + " · ".join(
        f"{k}: {METHOD_MODELS[k].model_fields['kind'].description}" for k in METHOD_KINDS[:4]) + " …",
}


class TrainerViewRead(Message):
    """The examples as the trainer tokenizes them for a recipe (or why not)."""

    def __init__(self, toml: str, kind: str, examples: list[dict] | None, error: str | None) -> None:
        super().__init__()
        self.toml = toml
        self.kind = kind
        self.examples = examples
        self.error = error


class NewExperimentScreen(Screen):
    BINDINGS = [
        Binding("ctrl+s", "save", "Save", tooltip="Write recipes/NAME.toml"),
        Binding("ctrl+r", "launch", "Launch", tooltip="Create the run, start it and follow it"),
        Binding("ctrl+o", "open_recipe", "Open", tooltip="Open a recipe of recipes/ or a preset (fuzzy search) "
                "into the form"),
        Binding("o", "open_recipe", "Open", show=False),  # where focus is not typing text (a choice, a tab)
        Binding("ctrl+g", "dry_step", "Dry step", tooltip="One real training step on a shrunken copy of the model, "
                "as launch takes first (a child process; its verdict is cached)"),
        Binding("ctrl+t", "toggle_side", "Checks", tooltip="Show the checks, estimate, TOML and data panes"),
        Binding("ctrl+n", "next_tab", "Next tab", tooltip="Next of checks / estimate / TOML / data"),
        Binding("escape", "back", "Back", tooltip="Back to the previous screen (asks first when there are edits)"),
    ]
    FOOTER_PRIORITY = ["save", "launch", "open_recipe", "back", "help", "toggle_side", "next_tab", "dry_step"]
    AUTO_FOCUS = "#f-name"  # not the first focusable (the form's scroll): its focus restyled every field in it

    def __init__(self, recipe: Recipe | None = None, title: str = "New experiment") -> None:
        super().__init__()
        self.kind = recipe.method.kind if recipe else "lora"
        self.values = formdata.values_from_recipe(recipe) if recipe else formdata.default_values(self.kind)
        self.specs = {s.key: s for s in formdata.all_fields(self.kind)}
        self.generation = 0
        self.last_check: RecipeChecked | None = None
        self.saved_path: Path | None = None
        self.launching = False
        self._launch_clock: tuple[float, Timer] | None = None  # the launch's start and its verdict-line timer
        self.dry_running = False  # ctrl+g's dry step is running
        self.sub_title = title
        self.model_names: list[str] = []
        self.pristine: tuple[str, dict[str, str]] | None = None  # the form as opened or last saved
        self.trainer_view: TrainerViewRead | None = None
        self._timer: Timer | None = None
        self.check_pending = False  # a check is scheduled and has not started yet
        self._check_running = False  # one check at a time: parallel ones fight over the GIL (3 took 13 s each)
        self._recheck = False  # values changed while a check ran: check again when it is back
        self._data_timer: Timer | None = None
        self._view_timer: Timer | None = None
        self._view_clock: Timer | None = None  # ticks while the trainer's view is being read
        self._view_started: float | None = None
        self._last_form_focus: Widget | None = None
        self.later_sections = ("train", "launch", *formdata.sections()[len(formdata.SECTIONS):])
        # every section but the run's is mounted after the first frame, a few rows per frame: the form
        # takes keys at once (the model's, dataset's and method's ~120 widgets took ~0.3 s before it)
        self.fill_sections = ("model", "dataset", "method", *self.later_sections)
        self.filled = False  # every section's fields are mounted
        self.last_typed = 0.0  # monotonic time of the last edit of a focused field
        self.resumed = False  # shown once: a later resume (back from a dialog) restyles as usual

    @property
    def active_bindings(self):
        return footer_by_priority(self.app, super().active_bindings, self.FOOTER_PRIORITY, self.size.width)

    # ------------------------------------------------------------ layout

    def _row(self, key: str, extra=None) -> FieldRow:
        return FieldRow(self.specs[key], self.values.get(key, ""), extra)

    def _rows(self, section: str) -> list[FieldRow]:
        return [self._row(s.key) for s in self.specs.values() if s.section == section and s.key not in ("model.name", "dataset.name")]

    def _filling(self, section: str) -> list[Widget]:
        """What a section holds, mounted after the first frame: its rows (the model's and the
        dataset's first with their found…/pick… lists); the method's kind and its fields at once."""
        if section == "model":
            pick_model = FieldSelect([], prompt="found…", compact=True, id="pick-model", classes="field-pick")
            pick_model.tooltip = PICK_HELP["pick-model"]
            return [self._row("model.name", pick_model), *self._rows("model")]
        if section == "dataset":
            datasets = DEMO_DATASETS + local_datasets(self.app.config.base_dir)
            pick_data = FieldSelect([(d, d) for d in datasets], prompt="pick…", compact=True, id="pick-data",
                                    classes="field-pick")
            pick_data.tooltip = PICK_HELP["pick-data"]
            return [self._row("dataset.name", pick_data), *self._rows("dataset")]
        if section == "method":  # one piece: a kind changed meanwhile would meet half its fields
            kind = FieldSelect([(k, k) for k in METHOD_KINDS], value=self.kind, allow_blank=False, compact=True,
                               id="method-kind", classes="field-input")
            kind.tooltip = "\n".join(f"{k}: {METHOD_MODELS[k].model_fields['kind'].description}" for k in METHOD_KINDS)
            return [Horizontal(Static("kind", classes="field-label"), kind, classes="field-row"),
                    Vertical(*self._rows("method"), id="method-params")]
        return list(self._rows(section))

    def compose(self) -> ComposeResult:
        yield AppHeader()
        with Horizontal(id="ne-body"):
            with VerticalScroll(id="ne-form"):
                yield FormSection("Run", *[self._row(k) for k in ("name", "description")])
                for section in self.fill_sections:  # empty on the first frame: filled right after it
                    yield FormSection(section.capitalize(), id=f"section-{section}")
            with TabbedContent(id="ne-side"):
                with TabPane("Checks", id="tab-checks"):
                    yield VerticalScroll(Static("checking…", id="ne-checks", markup=False))
                with TabPane("Estimate", id="tab-estimate"):
                    yield VerticalScroll(Static("", id="ne-estimate", markup=False))
                with TabPane("TOML", id="tab-toml"):
                    yield VerticalScroll(Static("", id="ne-toml", markup=False))
                with TabPane("Data", id="tab-data"):
                    with VerticalScroll():
                        yield Static("", id="ne-trainer-view", markup=False)
                        yield ExampleImages(id="ne-examples")  # image chats: their images beside the turns
                        yield Static("", id="ne-data", markup=False)
        yield Static("", id="ne-help", markup=False)
        yield Static("", id="ne-verdict", markup=False)
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.pristine = (self.kind, self.collect())  # fields not mounted yet read as self.values
        self.schedule_check(now=True)
        self.schedule_dataset(now=True)
        self.query_one("#f-name").focus()
        self.call_after_refresh(self._fill_later_sections, list(self.fill_sections))

    async def _fill_later_sections(self, sections: list[str], rows: list[Widget] | None = None) -> None:
        """The sections after the run's, FILL_ROWS fields per frame once the form is on screen, so
        the form takes keys at once (their ~400 widgets took ~0.8 s before the first frame, and a
        whole section at once ~0.1 s, a key typed meanwhile waiting for it)."""
        if self.taken_down:
            return  # closed while it filled
        typing = self.last_typed + TYPING_PAUSE_S - time.monotonic()
        if typing > 0:  # a key's frame first, then the rows (mounting six and laying them out: ~0.1 s)
            self.set_timer(typing, partial(self._fill_later_sections, sections, rows))
            return
        if not rows:
            if not sections:
                self.filled = True
                # the models found (run:NAME of every succeeded run) once the form is whole: with
                # thousands of runs their reading no longer competes with the fill and the keys
                self.find_models(self._known_runs())
                return
            rows = self._filling(sections[0])
        chunk, rows = rows[:FILL_ROWS], rows[FILL_ROWS:]
        section = self.query(f"#section-{sections[0]}")
        if not section:
            return  # the screen is being taken down (ctrl+o switched to another form): its sections are gone
        await section.first().mount_all(chunk)
        if self.taken_down:
            return  # closed while these mounted
        if sections[0] == "model":
            self._show_found_models()  # found before its box was there
        if self.last_check is not None:  # a check that came back before these fields were there
            bad = self.last_check.check.error_keys
            for row in chunk:
                for field in [row] if isinstance(row, FieldRow) else row.query(FieldRow):
                    for widget in field.query(".field-input"):
                        widget.set_class(field.spec.key in bad, "-invalid")
        self.call_after_refresh(self._fill_later_sections, sections if rows else sections[1:], rows)

    @property
    def taken_down(self) -> bool:
        """Popped, replaced or the app closing: a screen's widgets are pruned before the screen, its
        own queue still running the callbacks left for after a frame (a Select then lacks its overlay)."""
        return being_removed(self)

    def _on_screen_resume(self, event: events.ScreenResume) -> None:
        if not self.resumed:  # its widgets were styled as they mounted: not all of them again at once
            self.resumed = True
            event.refresh_styles = False
        super()._on_screen_resume(event)

    def on_resize(self) -> None:
        self.refresh_bindings()

    # ------------------------------------------------------------ focus: help line, enter, visible focus

    def on_descendant_focus(self, event: events.DescendantFocus) -> None:
        widget = event.widget
        if self.query_one("#ne-form") in widget.ancestors:
            self._last_form_focus = widget
            widget.scroll_visible(animate=False)  # never a focused field below the fold
        self.query_one("#ne-help", Static).update(self.help_for(widget))

    def help_for(self, widget: Widget) -> str:
        """The help line of a widget: its field's description, default and how to fill it."""
        widget_id = widget.id or ""
        if widget_id in PICK_HELP:
            return PICK_HELP[widget_id]
        for spec in self.specs.values():
            if spec.widget_id == widget_id:
                return field_help(spec)
        return "tab / shift+tab: next / previous field · ctrl+o open a recipe · ? every key"

    @on(Input.Submitted, ".field-input")
    def next_field(self) -> None:
        self.focus_next()

    # ------------------------------------------------------------ values

    def _field_widgets(self) -> dict[str, Widget]:
        """The form's widgets by id, in one walk of the form (a query by id per field walked the
        whole screen once per field: ~100 fields x ~600 widgets, most of the form's first second)."""
        return {w.id: w for w in self.query_one("#ne-form").walk_children(Widget) if w.id}

    def collect(self) -> dict[str, str]:
        values = {}
        widgets = self._field_widgets()
        for key, spec in self.specs.items():
            widget = widgets.get(spec.widget_id)
            values[key] = read_value(widget) if widget is not None else self.values.get(key, "")
        return values

    def set_field(self, key: str, text: str) -> None:
        """Set a field's text; one not mounted yet is mounted with it (and checked as if typed)."""
        widget = self.query(f"#{self.specs[key].widget_id}")
        if widget:
            set_value(widget.first(), text)
            return
        self.values[key] = text
        self.schedule_check()
        if key.startswith("dataset."):
            self.schedule_dataset()

    def has_edits(self) -> bool:
        """Whether the form differs from the recipe it opened with (or last saved)."""
        return self.pristine is not None and (self.kind, self.collect()) != self.pristine

    def quit_question(self) -> str | None:
        """The question the app asks before q quits from here (None: quit at once)."""
        return "Quit and drop the edits of this form?" if self.has_edits() else None

    @on(Input.Changed, ".field-input")
    @on(Select.Changed, ".field-input")
    @on(TextArea.Changed, ".field-input")
    def field_changed(self, event) -> None:
        widget_id = event.control.id or ""
        if widget_id == "method-kind":
            return
        if event.control.has_focus:
            self.last_typed = time.monotonic()
            if isinstance(event.control, TextArea):
                event.control.scroll_visible(animate=False)  # a list that grew a line stays in view
        self.schedule_check()
        if widget_id.startswith("f-dataset--"):
            self.schedule_dataset()
        if widget_id == self.specs["model.name"].widget_id:
            self.show_models(read_value(event.control))
        self.schedule_trainer_view()

    @on(Select.Changed, "#method-kind")
    async def kind_changed(self, event: Select.Changed) -> None:
        if event.value == self.kind or event.value is Select.NULL:
            return
        self.values.update(self.collect())
        self.kind = str(event.value)
        defaults = formdata.default_values(self.kind)
        self.specs = {s.key: s for s in formdata.all_fields(self.kind)}
        for key in self.specs:
            if key.startswith("method.") and key not in self.values:
                self.values[key] = defaults[key]
        params = self.query_one("#method-params")
        await params.remove_children()
        await params.mount_all(self._rows("method"))
        self.schedule_check()
        self.schedule_trainer_view()

    @on(Select.Changed, "#pick-model")
    def model_picked(self, event: Select.Changed) -> None:
        if event.value is not Select.NULL:
            self.set_field("model.name", str(event.value))

    @on(Select.Changed, "#pick-data")
    def data_picked(self, event: Select.Changed) -> None:
        if event.value is not Select.NULL:
            self.set_field("dataset.name", str(event.value))

    # ------------------------------------------------------------ checking (in workers)

    def schedule_check(self, now: bool = False) -> None:
        if self._timer is not None:
            self._timer.stop()
        self.check_pending = True
        self._timer = self.set_timer(0.01 if now else CHECK_DELAY_S, self._start_check)

    def _start_check(self) -> None:
        if self._check_running:
            self._recheck = True  # check_pending stays true until that check starts
            return
        self._check_running = True
        self.check_pending = False
        self.generation += 1
        self.check_recipe(self.collect(), self.kind, self.generation)

    @work(thread=True, exclusive=True, group="check")
    def check_recipe(self, values: dict[str, str], kind: str, generation: int) -> None:
        config = self.app.config
        report = actions.check_form(values, kind, config.runs_root, config.base_dir)
        self.post_message(RecipeChecked(generation, report.check, report.findings, report.has_errors, report.estimate,
                                        finding_errors=report.finding_errors, on_cpu=report.on_cpu,
                                        memory_bytes=report.memory_bytes, dry=report.dry))

    def on_recipe_checked(self, message: RecipeChecked) -> None:
        self._check_running = False
        if self._recheck and not self.taken_down:
            self._recheck = False
            self._start_check()  # this answer is for older values
            return
        if message.generation != self.generation or self.taken_down:
            return  # a newer check is on its way, or the form is closing
        self.last_check = message
        check = message.check
        lines = [f"error: {formdata.form_error(e)}" for e in check.errors]
        if message.findings_text:
            lines.append(message.findings_text)
        name = self.collect().get("name") or "run"
        if not message.has_errors and check.recipe is not None:
            recipe = check.recipe
            lines.append(f"recipe ok ({recipe.method.kind} on {recipe.model.name}, data {recipe.dataset.label}); "
                         f"ctrl+s writes recipes/{name}.toml")  # not written yet: no file to point at
        self.query_one("#ne-checks", Static).update("\n".join(lines) or "ok")
        self.query_one("#ne-toml", Static).update(check.toml)
        self.query_one("#ne-estimate", Static).update(message.estimate or "(valid recipe needed for an estimate)")
        bad = check.error_keys
        widgets = self._field_widgets()
        for key, spec in self.specs.items():
            if spec.widget_id in widgets:
                widgets[spec.widget_id].set_class(key in bad, "-invalid")
        verdict = self.query_one("#ne-verdict", Static)
        errors = len(check.errors) + message.finding_errors  # as the Checks pane counts them
        if message.has_errors:
            first = str(check.errors[0]).splitlines()[0] if check.errors else message.findings_text.splitlines()[0]
            verdict.update(f"✗ {plural(max(errors, 1), 'error')}: {first}")
        else:
            total = message.memory_bytes / 1e9  # a CPU rank's memory is RAM: its runtime and model
            per = "of RAM per rank" if message.on_cpu else "per GPU"
            memory = f" · estimate {total:.1f} GB {per}" if message.memory_bytes else ""
            held = ""
            dataset = check.recipe.dataset if check.recipe is not None else None
            if dataset is not None and dataset.eval_split_auto:
                # a mixture holds out AUTO_EVAL_SPLIT of each source that set no eval_split of its own
                share = AUTO_EVAL_SPLIT if dataset.sources else dataset.eval_split
                held = f" · {share:.0%} held out for eval" + (" per source" if dataset.sources else "")
            dry = self._dry_note(message.dry)  # with it the line would wrap at 80 columns: the footer has the keys
            verdict.update(f"✓ valid{memory}{held}{dry}" + ("" if dry else " — ctrl+s save, ctrl+r launch"))
        verdict.set_class(message.has_errors, "-error")

    def _dry_note(self, state: str) -> str:
        if self.dry_running:
            return " · dry step running…"
        return {"passed": " · dry step passed", "not run": " · ctrl+g dry step",
                "no verdict": " · dry step gave no verdict (ctrl+g again)"}.get(state, "")

    # ------------------------------------------------------------ the dry step (ctrl+g)

    def action_dry_step(self) -> None:
        if self.dry_running:
            return
        recipe = self._valid_recipe()
        if recipe is None:
            return
        state = self.last_check.dry if self.last_check is not None else ""
        if state in ("off", "n/a"):
            self.notify("the dry step is off (LLMTUI_DRY_STEP=0)" if state == "off" else
                        "no dry step for this model: its config is not here (an adapter, or not downloaded yet)",
                        severity="warning")
            return
        self.dry_running = True
        self.notify("dry step: one training step on a shrunken copy of the model…")
        self.schedule_check(now=True)  # the verdict line says it runs
        self.run_dry_step(recipe)

    @work(thread=True, exclusive=True, group="dry")
    @reports_errors("dry step")
    def run_dry_step(self, recipe: Recipe) -> None:
        config = self.app.config
        self.post_message(DryStepped(*actions.dry_step(recipe, config.runs_root, config.base_dir)))

    def on_dry_stepped(self, message: DryStepped) -> None:
        self.dry_running = False
        if self.taken_down:
            return
        if message.state == "failed":
            self.notify(message.findings_text, title="The dry step failed", severity="error")
            self.query_one("#ne-side", TabbedContent).active = "tab-checks"
        else:
            self.notify(f"dry step: {message.state}" + (f"\n{message.findings_text}" if message.findings_text else ""))
        self.schedule_check(now=True)  # the cached verdict, read by the check

    def schedule_dataset(self, now: bool = False) -> None:
        if self._data_timer is not None:
            self._data_timer.stop()
        self._data_timer = self.set_timer(0.01 if now else CHECK_DELAY_S * 2, lambda: self.inspect_data(self.collect()))

    @work(thread=True, exclusive=True, group="dataset")
    def inspect_data(self, values: dict[str, str]) -> None:
        name = values.get("dataset.name", "")
        data = formdata.build_data(values, self.kind)["dataset"]
        try:
            from tuiapp.core.data.datasets import inspect_dataset

            if is_rl(self.kind):  # prompts and reward columns: no chat format to detect
                info = rl_dataset_info(DatasetSpec(**data), self.app.config.base_dir)
            else:
                info = inspect_dataset(DatasetSpec(**data), base_dir=self.app.config.base_dir, limit=3)
        except UserError as exc:
            self.post_message(DatasetInspected(name, error=str(exc)))
            return
        except Exception as exc:  # a bad value in the form: the checks pane names it
            self.post_message(DatasetInspected(name, error=f"cannot preview: {exc}"))
            return
        self.post_message(DatasetInspected(name, info=info))

    def on_dataset_inspected(self, message: DatasetInspected) -> None:
        if self.taken_down:
            return
        text = dataset_preview(message.name, message.info, message.error)
        self.query_one("#ne-data", Static).update("records as read (before tokenizing)\n" + text)

    # ------------------------------------------------------------ the data as the trainer sees it

    def _data_tab_shown(self) -> bool:
        side = self.query_one("#ne-side", TabbedContent)
        return side.active == "tab-data" and side.display and self.query_one("#ne-body").display

    def schedule_trainer_view(self, now: bool = False) -> None:
        """Tokenize the first examples again (in a child process) when the data tab shows."""
        if not self._data_tab_shown():
            return
        if self._view_timer is not None:
            self._view_timer.stop()
        self._view_timer = self.set_timer(0.01 if now else TRAINER_VIEW_DELAY_S, self._start_trainer_view)

    def _start_trainer_view(self) -> None:
        check = formdata.check_values(self.collect(), self.kind)
        view = self.query_one("#ne-trainer-view", Static)
        if check.recipe is None:
            view.update(trainer_view_text(self.kind, None, "(a valid recipe is needed: see the checks)"))
            return
        toml = check.recipe.to_toml()
        if self.trainer_view is not None and self.trainer_view.toml == toml:
            return
        view.update(trainer_view_text(self.kind, None))
        self.query_one("#ne-examples", ExampleImages).show(self.kind, None)
        self._view_started = time.monotonic()
        if self._view_clock is None:  # the wait's clock (a vision model's processor takes a minute or more)
            self._view_clock = self.set_interval(1.0, self._tick_trainer_view)
        self._view_clock.resume()
        self.read_trainer_view(toml, self.kind)

    def _tick_trainer_view(self) -> None:
        if self.taken_down or self._view_started is None:
            if self._view_clock is not None:
                self._view_clock.pause()
            return
        elapsed = time.monotonic() - self._view_started
        self.query_one("#ne-trainer-view", Static).update(trainer_view_text(self.kind, None, elapsed_s=elapsed))

    @work(thread=True, exclusive=True, group="trainer-view")
    def read_trainer_view(self, toml: str, kind: str) -> None:
        examples, error = read_trainer_view(toml, self.app.config.base_dir, runs_root=self.app.config.runs_root)
        self.post_message(TrainerViewRead(toml, kind, examples, error))

    def on_trainer_view_read(self, message: TrainerViewRead) -> None:
        if self.taken_down:
            return
        self._view_started = None  # the clock stops at its next tick
        self.trainer_view = message if message.error is None else None
        self.query_one("#ne-trainer-view", Static).update(trainer_view_text(message.kind, message.examples, message.error))
        self.query_one("#ne-examples", ExampleImages).show(message.kind, None if message.error else message.examples)

    @on(TabbedContent.TabActivated, "#ne-side")
    def tab_activated(self) -> None:
        self.schedule_trainer_view(now=True)

    # ------------------------------------------------------------ models found (filtered as you type)

    def _known_runs(self) -> list[tuple[str, str, Path]] | None:
        """(name, status, folder) of every run the history below has read, or None (not all
        read yet, or no history): then the worker reads the run folders itself."""
        for screen in self.app.screen_stack:
            rows = getattr(getattr(screen, "model", None), "rows", None)
            if isinstance(rows, dict) and getattr(screen, "loaded", False):
                return [(row.name, row.status, row.path) for row in rows.values()]
        return None

    @work(thread=True, group="models")
    def find_models(self, runs: list[tuple[str, str, Path]] | None = None) -> None:
        config = self.app.config
        self.post_message(ModelsFound(model_candidates(RunStore(config.runs_root), config.cache_dirs(), runs)))

    def on_models_found(self, message: ModelsFound) -> None:
        self.model_names = message.names
        self._show_found_models()

    def _show_found_models(self) -> None:
        """The model box's suggestions and found… list, once both the names and the box are there."""
        box = self.query(f"#{self.specs['model.name'].widget_id}")
        if not self.model_names or not box:
            return
        box = box.first(Input)
        box.suggester = SuggestFromList(self.model_names, case_sensitive=False)
        self.show_models(box.value)

    def show_models(self, text: str) -> None:
        """The found… list: the candidates that match the model box's text."""
        if not self.model_names or self.taken_down:
            return
        shown = filter_models(self.model_names, text)
        pick = self.query_one("#pick-model", Select)
        if pick.expanded:
            return
        pick.set_options([(n, n) for n in shown])
        total = len(self.model_names)
        pick.prompt = f"found {len(shown)}…" if len(shown) == total else f"{len(shown)} of {total}…"

    # ------------------------------------------------------------ open a recipe or preset

    def action_open_recipe(self) -> None:
        choices = recipe_choices(self.app.config.recipes_dir)
        if not choices:
            self.notify("no recipes in recipes/ and no presets", title="Open")
            return
        commands = [SimpleCommand(c.label, lambda c=c: self._open_choice(c), c.about) for c in choices]
        self.app.search_commands(commands, placeholder="Open a recipe or preset: type to filter…")

    def _open_choice(self, choice: RecipeChoice) -> None:
        try:
            recipe = load_recipe(choice.path)
        except UserError as exc:
            self.notify(str(exc), title=f"Cannot open {choice.label}", severity="error", markup=False)
            return

        def swap(yes: bool | None = True) -> None:
            if yes:
                self.app.switch_screen(NewExperimentScreen(recipe, title=choice.label))

        if self.has_edits():
            self.app.confirm(f"Open {choice.label} and drop the edits of this form?", "", swap)
        else:
            swap()

    # ------------------------------------------------------------ actions

    def _valid_recipe(self) -> Recipe | None:
        values = self.collect()
        check = formdata.check_values(values, self.kind, f"recipes/{values.get('name') or 'run'}.toml")
        if check.errors:
            self.notify("\n".join(formdata.form_error(e) for e in check.errors[:3]), title="Recipe has errors",
                        severity="error")
            self.query_one("#ne-side", TabbedContent).active = "tab-checks"
            return None
        return check.recipe

    def action_save(self) -> None:
        recipe = self._valid_recipe()
        if recipe is None:
            return
        path = self.app.config.recipes_dir / f"{recipe.name}.toml"
        if path.exists():
            def replace(yes: bool | None) -> None:
                if yes:
                    self._write(path, recipe)

            self.app.confirm(f"Replace recipes/{path.name}?", "", replace)
        else:
            self._write(path, recipe)

    def _write(self, path: Path, recipe: Recipe) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(recipe.to_toml(), encoding="utf-8")
        except OSError as exc:
            self.notify(str(exc), title="Could not save", severity="error")
            return
        self.saved_path = path
        self.pristine = (self.kind, self.collect())
        self.notify(f"saved recipes/{path.name}", title="Saved")

    def action_launch(self) -> None:
        if self.launching:
            return
        recipe = self._valid_recipe()
        if recipe is not None:
            self.launching = True
            self._launch_clock = (time.monotonic(), self.set_interval(1.0, self._show_launching))
            self._show_launching()
            self.launch(recipe)

    def _show_launching(self) -> None:
        """The verdict line while the launch's checks run (its dry step may take a minute): what, and for how long."""
        from tuiapp.core.prelaunch.door import CHECKING_LINE  # here: the form opens without the checks' modules
        from tuiapp.core.run_folder.runstate import fmt_clock

        if self.launching and self._launch_clock is not None:
            seconds = time.monotonic() - self._launch_clock[0]
            self.query_one("#ne-verdict", Static).update(f"{CHECKING_LINE} {fmt_clock(seconds)}")

    def _launch_ended(self) -> None:
        self.launching = False
        if self._launch_clock is not None:
            self._launch_clock[1].stop()
            self._launch_clock = None

    @work(thread=True, exclusive=True, group="launch")
    @reports_errors("launch")
    def launch(self, recipe: Recipe) -> None:
        config = self.app.config
        saved = str(self.saved_path) if self.saved_path else None
        self.post_message(RunLaunched(actions.launch(recipe, config.runs_root, config.base_dir, saved)))

    def on_action_failed(self, message: ActionFailed) -> None:
        """A refused launch (its findings) goes in the checks pane too; the app notifies it."""
        if message.action == "dry step":
            self.dry_running = False
            self.schedule_check(now=True)
        if message.action == "launch":
            self._launch_ended()
            self.query_one("#ne-checks", Static).update(message.text)
            first = message.text.strip().splitlines()[0] if message.text.strip() else "see the checks pane"
            verdict = self.query_one("#ne-verdict", Static)
            verdict.update(f"✗ launch refused: {first}")
            verdict.set_class(True, "-error")

    def on_run_launched(self, message: RunLaunched) -> None:
        self._launch_ended()
        self.app.open_run(message.run_id, replace=True)

    def action_toggle_side(self) -> None:
        """Show or hide the side panes (narrow: instead of the form); focus stays on what shows."""
        self.toggle_class("-side")
        self.call_after_refresh(self._focus_shown)

    def _focus_shown(self) -> None:
        """Keep the focus on a widget that shows: the side's tabs when they replace the form,
        else the form field focused last."""
        form = self.query_one("#ne-form")
        if not form.display:
            self.query_one("#ne-side Tabs").focus()
        elif self.focused is None or form not in self.focused.ancestors:
            (self._last_form_focus or self.query_one("#f-name")).focus()
        self.schedule_trainer_view(now=True)

    def action_next_tab(self) -> None:
        tabs = self.query_one("#ne-side", TabbedContent)
        order = ["tab-checks", "tab-estimate", "tab-toml", "tab-data"]
        tabs.active = order[(order.index(tabs.active) + 1) % len(order)] if tabs.active in order else order[0]

    def action_back(self) -> None:
        if self.has_class("-side") and not self.query_one("#ne-form").display:
            self.remove_class("-side")
            self.call_after_refresh(self._focus_shown)
            return
        if self.has_class("-side"):
            self.remove_class("-side")
            return
        if self.has_edits():
            def leave(yes: bool | None) -> None:
                if yes:
                    self.app.pop_screen()

            self.app.confirm("Drop the edits of this form?", "esc again keeps them; ctrl+s saves them first", leave)
            return
        self.app.pop_screen()

