"""New experiment: a form generated from the recipe schema, validated live with the messages of
`llmtui validate`, a memory estimate, a dataset preview and the TOML; save or launch."""

from __future__ import annotations

from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header, Input, Select, Static, TabbedContent, TabPane

from tuiapp.core.errors import UserError
from tuiapp.core.recipe import METHOD_KINDS, METHOD_MODELS, DatasetSpec, Recipe
from tuiapp.core.runs import RunStore
from tuiapp.ui import actions, formdata
from tuiapp.ui.candidates import DEMO_DATASETS, local_datasets, model_candidates
from tuiapp.ui.messages import ActionFailed, DatasetInspected, ModelsFound, RecipeChecked, RunLaunched
from tuiapp.ui.preview import dataset_preview
from tuiapp.ui.widgets.form import FieldRow, FormSection, read_value, set_value
from tuiapp.ui.worker_errors import reports_errors

CHECK_DELAY_S = 0.25


class NewExperimentScreen(Screen):
    BINDINGS = [
        Binding("ctrl+s", "save", "Save", tooltip="Write recipes/NAME.toml"),
        Binding("ctrl+r", "launch", "Launch", tooltip="Create the run, start it and follow it"),
        Binding("ctrl+o", "toggle_side", "Checks", tooltip="Show the checks, estimate, TOML and data panes"),
        Binding("ctrl+n", "next_tab", "Next tab", tooltip="Next of checks / estimate / TOML / data"),
        Binding("escape", "back", "Back", tooltip="Back to the previous screen"),
    ]

    def __init__(self, recipe: Recipe | None = None, title: str = "New experiment") -> None:
        super().__init__()
        self.kind = recipe.method.kind if recipe else "lora"
        self.values = formdata.values_from_recipe(recipe) if recipe else formdata.default_values(self.kind)
        self.specs = {s.key: s for s in formdata.all_fields(self.kind)}
        self.generation = 0
        self.last_check: RecipeChecked | None = None
        self.saved_path: Path | None = None
        self.launching = False
        self.sub_title = title
        self._timer: Timer | None = None
        self._data_timer: Timer | None = None

    # ------------------------------------------------------------ layout

    def _row(self, key: str, extra=None) -> FieldRow:
        return FieldRow(self.specs[key], self.values.get(key, ""), extra)

    def _rows(self, section: str) -> list[FieldRow]:
        return [self._row(s.key) for s in self.specs.values() if s.section == section and s.key not in ("model.name", "dataset.name")]

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="ne-body"):
            with VerticalScroll(id="ne-form"):
                yield FormSection("Run", *[self._row(k) for k in ("name", "description")])
                pick_model = Select([], prompt="found…", compact=True, id="pick-model", classes="field-pick")
                pick_model.tooltip = "Models found: bundled, earlier runs (run:NAME), the HF cache"
                yield FormSection("Model", self._row("model.name", pick_model), *self._rows("model"))
                datasets = DEMO_DATASETS + local_datasets(self.app.config.base_dir)
                pick_data = Select([(d, d) for d in datasets], prompt="pick…", compact=True, id="pick-data", classes="field-pick")
                pick_data.tooltip = "Demo datasets and files in ./data"
                yield FormSection("Dataset", self._row("dataset.name", pick_data), *self._rows("dataset"))
                kind = Select([(k, k) for k in METHOD_KINDS], value=self.kind, allow_blank=False, compact=True, id="method-kind", classes="field-input")
                kind.tooltip = "\n".join(f"{k}: {METHOD_MODELS[k].model_fields['kind'].description}" for k in METHOD_KINDS)
                with FormSection("Method", id="method-section"):
                    with Horizontal(classes="field-row"):
                        yield Static("kind", classes="field-label")
                        yield kind
                    yield Vertical(*self._rows("method"), id="method-params")
                yield FormSection("Train", *self._rows("train"))
                yield FormSection("Launch", *self._rows("launch"))
                for section in formdata.sections()[len(formdata.SECTIONS):]:  # tables added to the schema
                    yield FormSection(section.capitalize(), *self._rows(section))
            with TabbedContent(id="ne-side"):
                with TabPane("Checks", id="tab-checks"):
                    yield VerticalScroll(Static("checking…", id="ne-checks", markup=False))
                with TabPane("Estimate", id="tab-estimate"):
                    yield VerticalScroll(Static("", id="ne-estimate", markup=False))
                with TabPane("TOML", id="tab-toml"):
                    yield VerticalScroll(Static("", id="ne-toml", markup=False))
                with TabPane("Data", id="tab-data"):
                    yield VerticalScroll(Static("", id="ne-data", markup=False))
        yield Static("", id="ne-verdict", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.find_models()
        self.schedule_check(now=True)
        self.schedule_dataset(now=True)
        self.query_one("#f-name").focus()

    # ------------------------------------------------------------ values

    def collect(self) -> dict[str, str]:
        values = {}
        for key, spec in self.specs.items():
            widgets = self.query(f"#{spec.widget_id}")
            values[key] = read_value(widgets.first()) if widgets else self.values.get(key, "")
        return values

    def set_field(self, key: str, text: str) -> None:
        set_value(self.query_one(f"#{self.specs[key].widget_id}"), text)

    @on(Input.Changed, ".field-input")
    @on(Select.Changed, ".field-input")
    def field_changed(self, event) -> None:
        widget_id = event.control.id or ""
        if widget_id == "method-kind":
            return
        self.schedule_check()
        if widget_id.startswith("f-dataset--"):
            self.schedule_dataset()

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
        self._timer = self.set_timer(0.01 if now else CHECK_DELAY_S, self._start_check)

    def _start_check(self) -> None:
        self.generation += 1
        self.check_recipe(self.collect(), self.kind, self.generation)

    @work(thread=True, exclusive=True, group="check")
    def check_recipe(self, values: dict[str, str], kind: str, generation: int) -> None:
        config = self.app.config
        report = actions.check_form(values, kind, config.runs_root, config.base_dir)
        self.post_message(RecipeChecked(generation, report.check, report.findings, report.has_errors, report.estimate))

    def on_recipe_checked(self, message: RecipeChecked) -> None:
        if message.generation != self.generation:
            return  # a newer check is on its way
        self.last_check = message
        check = message.check
        lines = [f"error: {e}" for e in check.errors]
        if message.findings_text:
            lines.append(message.findings_text)
        name = self.collect().get("name") or "run"
        if not message.has_errors and check.recipe is not None:
            recipe = check.recipe
            lines.append(f"recipes/{name}.toml: ok ({recipe.method.kind} on {recipe.model.name}, data {recipe.dataset.name})")
        self.query_one("#ne-checks", Static).update("\n".join(lines) or "ok")
        self.query_one("#ne-toml", Static).update(check.toml)
        self.query_one("#ne-estimate", Static).update(message.estimate or "(valid recipe needed for an estimate)")
        bad = check.error_keys
        for key, spec in self.specs.items():
            for widget in self.query(f"#{spec.widget_id}"):
                widget.set_class(key in bad, "-invalid")
        verdict = self.query_one("#ne-verdict", Static)
        errors = len(check.errors) + message.findings_text.count("error")
        if message.has_errors:
            first = str(check.errors[0]).splitlines()[0] if check.errors else message.findings_text.splitlines()[0]
            verdict.update(f"✗ {max(errors, 1)} problem(s): {first}")
        else:
            total = next((line.split()[-1] for line in message.estimate.splitlines() if line.strip().startswith("total")), None)
            memory = f" · estimate {total} GB per GPU" if total else ""
            verdict.update(f"✓ valid{memory} — ctrl+s save, ctrl+r launch")
        verdict.set_class(message.has_errors, "-error")

    def schedule_dataset(self, now: bool = False) -> None:
        if self._data_timer is not None:
            self._data_timer.stop()
        self._data_timer = self.set_timer(0.01 if now else CHECK_DELAY_S * 2, lambda: self.inspect_data(self.collect()))

    @work(thread=True, exclusive=True, group="dataset")
    def inspect_data(self, values: dict[str, str]) -> None:
        name = values.get("dataset.name", "")
        data = formdata.build_data(values, self.kind)["dataset"]
        try:
            from tuiapp.core.datasets import inspect_dataset

            info = inspect_dataset(DatasetSpec(**data), base_dir=self.app.config.base_dir, limit=3)
        except UserError as exc:
            self.post_message(DatasetInspected(name, error=str(exc)))
            return
        except Exception as exc:  # a bad value in the form: the checks pane names it
            self.post_message(DatasetInspected(name, error=f"cannot preview: {exc}"))
            return
        self.post_message(DatasetInspected(name, info=info))

    def on_dataset_inspected(self, message: DatasetInspected) -> None:
        self.query_one("#ne-data", Static).update(dataset_preview(message.name, message.info, message.error))

    @work(thread=True, group="models")
    def find_models(self) -> None:
        config = self.app.config
        self.post_message(ModelsFound(model_candidates(RunStore(config.runs_root), config.cache_dirs())))

    def on_models_found(self, message: ModelsFound) -> None:
        self.query_one("#pick-model", Select).set_options([(n, n) for n in message.names])

    # ------------------------------------------------------------ actions

    def _valid_recipe(self) -> Recipe | None:
        values = self.collect()
        check = formdata.check_values(values, self.kind, f"recipes/{values.get('name') or 'run'}.toml")
        if check.errors:
            self.notify("\n".join(str(e) for e in check.errors[:3]), title="Recipe has errors", severity="error")
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
        self.notify(f"saved recipes/{path.name}", title="Saved")

    def action_launch(self) -> None:
        if self.launching:
            return
        recipe = self._valid_recipe()
        if recipe is not None:
            self.launching = True
            self.notify(f"checking and launching {recipe.name}…")
            self.launch(recipe)

    @work(thread=True, exclusive=True, group="launch")
    @reports_errors("launch")
    def launch(self, recipe: Recipe) -> None:
        config = self.app.config
        saved = str(self.saved_path) if self.saved_path else None
        self.post_message(RunLaunched(actions.launch(recipe, config.runs_root, config.base_dir, saved)))

    def on_action_failed(self, message: ActionFailed) -> None:
        """A refused launch (its findings) goes in the checks pane too; the app notifies it."""
        if message.action == "launch":
            self.launching = False
            self.query_one("#ne-checks", Static).update(message.text)

    def on_run_launched(self, message: RunLaunched) -> None:
        self.launching = False
        self.app.open_run(message.run_id, replace=True)

    def action_toggle_side(self) -> None:
        self.toggle_class("-side")

    def action_next_tab(self) -> None:
        tabs = self.query_one("#ne-side", TabbedContent)
        order = ["tab-checks", "tab-estimate", "tab-toml", "tab-data"]
        tabs.active = order[(order.index(tabs.active) + 1) % len(order)] if tabs.active in order else order[0]

    def action_back(self) -> None:
        if self.has_class("-side"):
            self.remove_class("-side")
            return
        self.app.pop_screen()
