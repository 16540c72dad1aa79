"""Home: the history of every run, live. run.json files are read in a thread worker and arrive in
batches, so the first frame paints at once however many runs there are."""

from __future__ import annotations

import time

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Select, Static
from textual.worker import get_current_worker

from tuiapp.core.rundir import ACTIVE
from tuiapp.ui.history import HistoryLoader, detail_text
from tuiapp.ui.history_model import FLAGGED, HistoryModel
from tuiapp.ui.messages import RunsLoaded, RunsUpdated
from tuiapp.ui.widgets.runs_table import COLUMNS, FIXED, SORTABLE, RunsTable

# a run.json status, or `flagged`: stalled, hung in a start-up phase, or orphaned processes
STATUS_FILTERS = ["", "running", FLAGGED, "starting", "stopping", "succeeded", "failed", "stopped", "created"]
SORT_LABELS = {c.key: c.label for c in FIXED + COLUMNS}


class HomeScreen(Screen):
    AUTO_FOCUS = "RunsTable"
    BINDINGS = [
        Binding("n", "new", "New", tooltip="New experiment"),
        Binding("enter", "open", "Open", tooltip="Open the run under the cursor"),
        Binding("space", "mark", "Mark", tooltip="Mark or unmark the run for comparison"),
        Binding("c", "compare", "Compare", tooltip="Compare the marked runs (2 or more)"),
        Binding("s", "sort", "Sort", tooltip="Sort by the next column"),
        Binding("S", "reverse_sort", "Reverse", tooltip="Reverse the sort order"),
        Binding("slash", "filter", "Filter", tooltip="Filter by free text"),
        Binding("t", "cycle_status", "Status", tooltip="Filter by status (cycles)"),
        Binding("m", "cycle_method", "Method", tooltip="Filter by method (cycles)"),
        Binding("e", "clone", "Clone", tooltip="New experiment from this run's recipe"),
        Binding("escape", "clear_filters", "Clear", tooltip="Clear filters and marks"),
        Binding("q", "app.quit", "Quit", tooltip="Quit (runs keep going)"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.model: HistoryModel | None = None
        self.loaded = False  # every run.json read
        self.summarized = False  # every metrics file read once
        self._methods: list[str] = []

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="home-filters"):
            text = Input(placeholder="/ filter: name, model, dataset…", compact=True, id="filter-text")
            text.tooltip = "Words that must all appear in name, id, method, model, dataset or status"
            yield text
            yield Select([(s, s) for s in STATUS_FILTERS[1:]], prompt="all statuses", compact=True, id="filter-status")
            yield Select([], prompt="all methods", compact=True, id="filter-method")
        yield RunsTable(id="runs")
        yield Static("", id="home-detail", markup=False)
        yield Static("", id="home-status")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.model = HistoryModel(self.app.config.clock)
        self._show_status()
        self.load_history()
        if self.app.config.live:
            self.set_interval(1.0, self._tick)

    # ------------------------------------------------------------ the worker

    @work(thread=True, exclusive=True, group="history")
    def load_history(self) -> None:
        config = self.app.config
        worker = get_current_worker()
        loader = HistoryLoader(config.runs_root)
        rows = []
        for batch in loader.load_infos(loader.scan(), config.batch_size, max_batch=config.batch_size * 16):
            if worker.is_cancelled:
                return
            rows += batch
            self.post_message(RunsLoaded(batch))
        self.post_message(RunsLoaded([], done=True))
        self._summarize(loader, rows, worker, final=True)
        while config.live and not worker.is_cancelled:
            deadline = time.monotonic() + config.history_poll_s
            while time.monotonic() < deadline and not worker.is_cancelled:
                time.sleep(0.05)
            fresh = [r for batch in loader.load_infos(loader.scan(), config.batch_size) for r in batch]
            if fresh:
                self.post_message(RunsLoaded(fresh, done=True))
                self._summarize(loader, fresh, worker)
            changed = loader.poll()
            if changed:
                self.post_message(RunsUpdated(changed))

    def _summarize(self, loader: HistoryLoader, rows, worker, final: bool = False) -> None:
        pending, last = [], time.monotonic()
        for row in rows:
            if worker.is_cancelled:
                return
            pending.append(loader.summarize(row))
            if len(pending) >= 2000 or time.monotonic() - last > 0.25:
                self.post_message(RunsUpdated(pending))
                pending, last = [], time.monotonic()
        self.post_message(RunsUpdated(pending, summaries_done=final))

    # ------------------------------------------------------------ handlers

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        self.model.add(message.rows)
        if message.done:
            self.loaded = True
            self._update_method_options()
        self._show_rows()

    def on_runs_updated(self, message: RunsUpdated) -> None:
        self.model.update(message.rows)
        if message.summaries_done:
            self.summarized = True
        if any(r.method and r.method not in self._methods for r in message.rows):
            self._update_method_options()
        self._show_rows()

    def _update_method_options(self) -> None:
        methods = self.model.methods()
        if methods != self._methods:
            self._methods = methods
            select = self.query_one("#filter-method", Select)
            value = select.value
            select.set_options([(m, m) for m in methods])
            if value in methods:
                select.value = value

    def _show_rows(self) -> None:
        table = self.query_one(RunsTable)
        if self.loaded:
            table.empty_text = "no run matches the filters (esc clears them)" if self.model.rows else "no runs yet: press n for a new experiment"
        table.set_rows(self.model.visible, set(self.model.marked))
        table.set_sort(self.model.sort_key, self.model.sort_reverse)
        self._show_status()
        self._show_detail()

    def _show_detail(self) -> None:
        run_id = self.query_one(RunsTable).cursor_run_id
        row = self.model.rows.get(run_id) if run_id else None
        self.query_one("#home-detail", Static).update(detail_text(row, self.app.config.clock()) if row else "")

    def on_runs_table_highlighted(self, message: RunsTable.Highlighted) -> None:
        self._show_detail()

    def _show_status(self) -> None:
        model = self.model
        if model is None:
            return
        counts = model.counts()
        parts = [f"{len(model.visible)} of {len(model.rows)} runs" if len(model.visible) != len(model.rows) else f"{len(model.rows)} runs"]
        if not self.loaded:
            parts[0] += " (loading…)"
        elif not model.rows:
            parts[0] += f" in {self.app.config.runs_root}"
        for status in ("running", "starting", "stopping", FLAGGED):
            if counts.get(status):
                parts.append(f"{counts[status]} {status}")
        if model.marked:
            parts.append(f"{len(model.marked)} marked (c to compare)")
        if model.sort_key:
            parts.append(f"sorted by {SORT_LABELS[model.sort_key]} {'▼' if model.sort_reverse else '▲'}")
        self.query_one("#home-status", Static).update(" · ".join(parts))

    def _tick(self) -> None:
        if self.model and any(r.status in ACTIVE for r in self.model.rows.values()):
            self.query_one(RunsTable).refresh()  # durations, start-up clocks and stall flags move
            self._show_detail()

    @on(Input.Changed, "#filter-text")
    def text_changed(self, event: Input.Changed) -> None:
        self.model.text_filter = event.value
        self.model.invalidate()
        self._show_rows()

    @on(Input.Submitted, "#filter-text")
    def text_submitted(self) -> None:
        self.query_one(RunsTable).focus()

    @on(Select.Changed, "#filter-status")
    def status_changed(self, event: Select.Changed) -> None:
        self.model.status_filter = "" if event.value is Select.NULL else str(event.value)
        self.model.invalidate()
        self._show_rows()

    @on(Select.Changed, "#filter-method")
    def method_changed(self, event: Select.Changed) -> None:
        self.model.method_filter = "" if event.value is Select.NULL else str(event.value)
        self.model.invalidate()
        self._show_rows()

    def on_runs_table_opened(self, message: RunsTable.Opened) -> None:
        self._open(message.run_id)

    def on_runs_table_header_clicked(self, message: RunsTable.HeaderClicked) -> None:
        self.model.sort_by(message.column)
        self._show_rows()

    # ------------------------------------------------------------ actions

    def _open(self, run_id: str | None) -> None:
        if run_id:
            self.app.open_run(run_id)

    def action_open(self) -> None:
        self._open(self.query_one(RunsTable).cursor_run_id)

    def action_new(self) -> None:
        self.app.open_form()

    def action_mark(self) -> None:
        run_id = self.query_one(RunsTable).cursor_run_id
        if run_id:
            self.model.toggle_mark(run_id)
            self.query_one(RunsTable).action_cursor(1)
            self._show_rows()

    def action_compare(self) -> None:
        marked = list(self.model.marked)
        if len(marked) < 2:
            self.notify("mark two or more runs with space first", title="Compare")
            return
        self.app.open_compare(marked)

    def action_sort(self) -> None:
        keys = [None, *SORTABLE]
        index = keys.index(self.model.sort_key) if self.model.sort_key in keys else 0
        self.model.sort_by(keys[(index + 1) % len(keys)], reverse=False)
        self._show_rows()

    def action_reverse_sort(self) -> None:
        if self.model.sort_key is None:
            self.model.sort_by("started", reverse=True)
        else:
            self.model.sort_by(self.model.sort_key, reverse=not self.model.sort_reverse)
        self._show_rows()

    def action_filter(self) -> None:
        self.query_one("#filter-text", Input).focus()

    def _cycle(self, selector: str, options: list[str]) -> None:
        select = self.query_one(selector, Select)
        current = "" if select.value is Select.NULL else str(select.value)
        choices = ["", *[o for o in options if o]]
        following = choices[(choices.index(current) + 1) % len(choices)] if current in choices else ""
        if following:
            select.value = following
        else:
            select.clear()

    def action_cycle_status(self) -> None:
        self._cycle("#filter-status", STATUS_FILTERS)

    def action_cycle_method(self) -> None:
        self._cycle("#filter-method", self.model.methods())

    def action_clone(self) -> None:
        run_id = self.query_one(RunsTable).cursor_run_id
        if run_id:
            self.app.open_clone(self.model.rows[run_id].path)

    def action_clear_filters(self) -> None:
        if self.focused is self.query_one("#filter-text"):
            self.query_one(RunsTable).focus()
            return
        self.query_one("#filter-text", Input).value = ""
        self.query_one("#filter-status", Select).clear()
        self.query_one("#filter-method", Select).clear()
        self.model.marked.clear()
        self._show_rows()

