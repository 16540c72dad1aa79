"""Home: the history of every run, live. run.json files are read in a thread worker and arrive in
batches, so the first frame paints at once however many runs there are.

Sweeps fold into one line each (f unfolds, enter opens the group screen); queued runs show their
place and move with K/J/F; tags, notes, names, archive and delete act on the cursor's run
(tuiapp.ui.manage_keys). A run that ends, fails or hangs, and a sweep that ends, ring
the bell (tuiapp.ui.alerts)."""

from __future__ import annotations

import importlib
import threading
import time
from dataclasses import replace
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Input, Select, Static
from textual.worker import get_current_worker

from tuiapp.core.run_folder import evals
from tuiapp.core.run_folder.rundata import needs_columns, numpy_module
from tuiapp.core.run_folder.rundir import ACTIVE, RunDir
from tuiapp.core.store import served
from tuiapp.ui.after_training import AfterWatch
from tuiapp.ui.alerts import run_alerts, sweep_alerts
from tuiapp.ui.columns_pool import build_all
from tuiapp.ui.footer_keys import footer_by_priority, plural
from tuiapp.ui.groups import GroupRow, read_groups
from tuiapp.ui.history import HistoryLoader, Rotation, RunRow, detail_text, with_meta
from tuiapp.ui.history_model import FLAGGED, HistoryModel
from tuiapp.ui.manage_keys import HISTORY_BINDINGS, META_BINDINGS, HistoryManageActions, Target
from tuiapp.ui.messages import (
    AfterTrainingRead,
    ColumnsProgress,
    GroupsRead,
    QueueReordered,
    RunMetaChanged,
    RunsLoaded,
    RunsRemoved,
    RunStopped,
    RunStopping,
    RunsUpdated,
    ServingChanged,
)
from tuiapp.ui.widgets.header import AppHeader
from tuiapp.ui.widgets.key_footer import KeyFooter
from tuiapp.ui.widgets.runs_table import COLUMNS, FIXED, SORTABLE, RunsTable

# a run.json status, or `flagged`: stalled, hung in a start-up phase, or orphaned processes
STATUS_FILTERS = ["", "running", FLAGGED, "queued", "starting", "stopping", "succeeded", "failed", "stopped", "created"]
SORT_LABELS = {c.key: c.label for c in FIXED + COLUMNS}


def warm_up_charts() -> None:
    """numpy and the chart widgets, imported while the history is idle: the run view and compare
    draw with them, and their first open no longer pays ~0.2 s of imports on the UI thread."""
    numpy_module()
    importlib.import_module("tuiapp.ui.widgets.charts")


def warm_up_form() -> None:
    """The new-experiment form's modules (the recipe schema, the form's widgets and the checks its
    first check runs: ~0.4 s), imported while the history is idle: the first `n` no longer pays
    them on the UI thread, nor its check's thread beside the form's first frames."""
    for module in ("tuiapp.ui.screens.new_experiment", "tuiapp.core.prelaunch.door"):
        importlib.import_module(module)


WAKE_S = 0.2  # a polling worker looks whether it was cancelled this often while it waits
SIDE_POLLS = 2  # evaluations/exports and servers made from a shell: looked for every 2nd poll (4 s)


def wait_a_poll(worker, seconds: float) -> None:
    """A polling worker's wait between polls, in slices: cancelled, it ends within WAKE_S (each wake
    takes the GIL from the UI: 0.05 s slices in three workers were 60 wakes a second)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not worker.is_cancelled:
        time.sleep(WAKE_S)


class HomeScreen(HistoryManageActions, Screen):
    AUTO_FOCUS = "RunsTable"
    BINDINGS = [
        Binding("n", "new", "New", tooltip="New experiment"),
        Binding("enter", "open", "Open", tooltip="Open the run (or the sweep) under the cursor"),
        Binding("space", "mark", "Mark", tooltip="Mark or unmark the run (a sweep: all its runs) for comparison, "
                "then move down; marks stay while you filter"),
        Binding("c", "compare", "Compare", tooltip="Compare the marked runs (2 or more)"),
        Binding("u", "unmark_all", "Unmark all", tooltip="Clear every mark"),
        Binding("g", "top", "Top", tooltip="First run"),
        Binding("G", "bottom", "Bottom", tooltip="Last run"),
        Binding("f", "fold", "Fold", tooltip="Unfold the sweep under the cursor into its runs, or fold it"),
        Binding("s", "sort", "Sort", tooltip="Sort by the next column"),
        Binding("S", "reverse_sort", "Reverse", tooltip="Reverse the sort order"),
        Binding("slash", "filter", "Filter", tooltip="Filter by free text; tag:NAME keeps runs with that tag"),
        Binding("t", "cycle_status", "Status", tooltip="Filter by status (cycles)"),
        Binding("m", "cycle_method", "Method", tooltip="Filter by method (cycles)"),
        Binding("e", "clone", "Clone", tooltip="New experiment from this run's recipe"),
        Binding("C", "chat", "Chat", tooltip="Talk to the run's final model (ctrl+b there: its base beside); "
                "with two runs marked, an arena: both answer each prompt side by side"),
        Binding("E", "evaluate", "Evaluate", tooltip="Score the run's final model vs its base on held-out data "
                "(loss, perplexity, exact match, ROUGE-L), as `llmtui eval`"),
        Binding("X", "export", "Export", tooltip="Write the run's model to a folder (merged, cast), as `llmtui export`"),
        Binding("V", "served", "Served", tooltip="The models `llmtui serve` serves (⇄ in the list): URL, state, "
                "backend; stop one or read its doctor report"),
        *HISTORY_BINDINGS,
        *META_BINDINGS,
        Binding("escape", "clear_filters", "Clear", tooltip="Clear the filters (marks stay; u clears them)"),
        Binding("q", "app.quit", "Quit", tooltip="Quit (runs keep going)"),
    ]
    # the footer's keys, most important first: as many as fit the width show (tuiapp.ui.footer_keys)
    FOOTER_PRIORITY = ["open", "new", "mark", "compare", "filter", "app.quit", "help", "top", "bottom", "sort",
                       "cycle_status", "cycle_method", "clone", "fold", "unmark_all"]

    def __init__(self) -> None:
        super().__init__()
        self.model: HistoryModel | None = None
        self.loaded = False  # every run.json read
        self.summarized = False  # every metrics file read once
        self._methods: list[str] = []
        self._quiet: set[str] = set()  # runs the user stopped here: no bell when they end
        self._stop_asked: dict[str, str] = {}  # run id -> its status when the user asked for the stop
        self._reading: dict[str, str] = {}  # long runs whose columns worker processes make: id -> queued / reading
        self._first_rows_drawn = threading.Event()  # the loader reads on once the first rows are painted

    @property
    def active_bindings(self):
        return footer_by_priority(self.app, super().active_bindings, self.FOOTER_PRIORITY, self.size.width)

    def on_resize(self) -> None:
        self.refresh_bindings()

    def compose(self) -> ComposeResult:
        yield AppHeader()
        with Horizontal(id="home-filters"):
            text = Input(placeholder="/ filter: name, model, dataset, tag:NAME…", compact=True, id="filter-text")
            text.tooltip = ("Words that must all appear in name, id, method, model, dataset, status, tags or note; "
                            "tag:NAME keeps the runs with that tag")
            yield text
            yield Select([(s, s) for s in STATUS_FILTERS[1:]], prompt="all statuses", compact=True, id="filter-status")
            yield Select([], prompt="all methods", compact=True, id="filter-method")
        yield RunsTable(id="runs")
        yield Static("", id="home-detail", markup=False)
        yield Static("", id="home-status")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.model = HistoryModel(self.app.config.clock)
        self._show_status()
        # the first screenful is read here (a listing and ~50 small files), so the first frame
        # already has rows; the worker reads the rest once that frame is painted
        config = self.app.config
        loader = HistoryLoader(config.runs_root)
        names = loader.scan()
        first = next(loader.load_infos(names[: config.first_batch], config.first_batch), [])
        if first:
            self.model.add(first)
            self._show_rows()
        self.call_after_refresh(self._first_rows_drawn.set)
        self.load_history(loader, names[len(first):], first)
        if self.app.config.live:
            self.set_interval(1.0, self._tick)
            self.watch_after_training()
            self.watch_served()
        else:
            self.watch_served(once=True)

    # ------------------------------------------------------------ the worker

    @work(thread=True, exclusive=True, group="history")
    def load_history(self, loader: HistoryLoader, rest: list[str], first: list[RunRow]) -> None:
        config = self.app.config
        worker = get_current_worker()
        rows = list(first)
        self._first_rows_drawn.wait(timeout=1.0)  # the first frame, before the rest competes for the GIL
        for batch in loader.load_infos(rest, config.batch_size, max_batch=config.batch_size * 16):
            if worker.is_cancelled:
                return
            rows += batch
            self.post_message(RunsLoaded(batch))
        self.post_message(RunsLoaded([], done=True))
        groups = read_groups(config.runs_root)
        self.post_message(GroupsRead(groups))
        self._summarize(loader, rows, worker, final=True)
        warm_up_charts()
        warm_up_form()
        while config.live and not worker.is_cancelled:
            wait_a_poll(worker, config.history_poll_s)
            fresh = [r for batch in loader.load_infos(loader.scan(), config.batch_size) for r in batch]
            if fresh:
                self.post_message(RunsLoaded(fresh, done=True))
                self._summarize(loader, fresh, worker)
            changed = loader.poll()
            if changed:
                self.post_message(RunsUpdated(changed))
            if loader.removed:
                self.post_message(RunsRemoved(loader.removed))
            fresh_groups = read_groups(config.runs_root)
            if fresh_groups != groups:
                groups = fresh_groups
                self.post_message(GroupsRead(groups))

    @work(thread=True, exclusive=True, group="after-training")
    def watch_after_training(self) -> None:
        """Evaluations and exports made anywhere (`llmtui eval` in a shell, say) reach the eval
        column within a poll: two folder stats per run, a folder read only when it changed."""
        config = self.app.config
        worker = get_current_worker()
        watch = AfterWatch()
        rotation = Rotation()  # finished runs: a share per poll, in turn (active ones every poll)
        while not worker.is_cancelled:
            if self.summarized:  # after the first load: it read every run's latest eval itself
                try:  # ids copied at C speed; rows looked up only for the share polled
                    ids, active = list(self.model.rows), set(self.model.active)
                except RuntimeError:  # the rows changed while copied: next time
                    ids, active = [], set()
                share = [run_id for run_id in rotation.take(ids) if run_id not in active]
                found = watch.poll(self._paths([*active, *share]))
                if found:
                    self.post_message(AfterTrainingRead(found))
            wait_a_poll(worker, SIDE_POLLS * config.history_poll_s)

    @work(thread=True, exclusive=True, group="served")
    def watch_served(self, once: bool = False) -> None:
        """Runs whose model `llmtui serve` serves (a stat of serve.json per run and poll, a pid
        check where it is): the ⇄ marker, the detail line's URL and the status line's count."""
        config = self.app.config
        worker = get_current_worker()
        shown: dict[str, str] = {}  # nothing served: nothing to say
        rotation = Rotation()  # a share of the runs per poll, in turn; those served every poll
        records: dict[str, dict] = {}  # each run's server as last looked at
        whole = False  # every run looked at once, all of them read
        while not worker.is_cancelled:
            try:
                ids = list(self.model.rows) if self.model else []
            except RuntimeError:  # the rows changed while copied: next time
                ids = None
            if ids is not None:
                if whole and not once:  # those served, and a share of the rest in turn
                    paths = [path for _, path in self._paths([*records, *rotation.take(ids)])]
                else:
                    paths = [path for _, path in self._paths(ids)]
                    whole = self.loaded
                    records = {}
                live = served.live_records(paths)
                for path in paths:  # the runs not looked at this time keep their state
                    records.pop(path.name, None)
                records.update(live)
                live = dict(records)
                found = {run_id: served.url_of(record) for run_id, record in live.items()}
                if found != shown:
                    shown = found
                    self.post_message(ServingChanged(found))
                if once and self.loaded:
                    return
            wait_a_poll(worker, SIDE_POLLS * config.history_poll_s)

    def _paths(self, run_ids) -> list[tuple[str, Path]]:
        """(id, folder) of those of `run_ids` still in the history."""
        rows = self.model.rows
        return [(run_id, row.path) for run_id in run_ids if (row := rows.get(run_id)) is not None]

    def on_serving_changed(self, message: ServingChanged) -> None:
        self.query_one(RunsTable).set_serving(message.serving)
        self._show_status()
        self._show_detail()

    def action_served(self) -> None:
        self.app.open_served()

    def on_after_training_read(self, message: AfterTrainingRead) -> None:
        rows = []
        for run_id, after in message.found.items():
            row = self.model.rows.get(run_id)
            if row is not None and (row.eval_ppl, row.eval_base_ppl) != after.perplexity:
                tuned, base = after.perplexity
                rows.append(replace(row, eval_ppl=tuned, eval_base_ppl=base))
        if rows:
            self.model.update(rows)
            self._show_rows()

    def _summarize(self, loader: HistoryLoader, rows, worker, final: bool = False) -> None:
        """Every row's metrics summary; long runs without columns (an older llmtui's) last, their
        columns made in worker processes in parallel (columns_pool), each summarised (from its
        columns, in ms) as soon as its process is done; the status line counts them meanwhile."""
        slow = {row.path: row for row in rows if needs_columns(row.path)}
        for row in slow.values():
            self.post_message(ColumnsProgress(row.id, "queued"))
        pending, last = [], time.monotonic()
        for row in rows:
            if worker.is_cancelled:
                return
            if row.path in slow:
                continue
            pending.append(loader.summarize(row))
            if len(pending) >= 2000 or time.monotonic() - last > 0.25:
                self.post_message(RunsUpdated(pending))
                pending, last = [], time.monotonic()

        def built(path, ok: bool) -> None:
            self.post_message(RunsUpdated([loader.summarize(slow[path])]))
            self.post_message(ColumnsProgress(slow[path].id, "read"))

        if slow:
            if pending:
                self.post_message(RunsUpdated(pending))
                pending = []
            build_all(list(slow), lambda path: self.post_message(ColumnsProgress(slow[path].id, "reading")), built,
                      lambda: worker.is_cancelled)
            if worker.is_cancelled:
                return
        self.post_message(RunsUpdated(pending, summaries_done=final))

    # ------------------------------------------------------------ handlers

    def on_columns_progress(self, message: ColumnsProgress) -> None:
        if message.state == "read":
            self._reading.pop(message.run_id, None)
        else:
            self._reading[message.run_id] = message.state
        self._show_status()

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        self.model.add(message.rows)
        if message.done:
            self.loaded = True
            self._update_method_options()
        self._show_rows()

    def on_runs_updated(self, message: RunsUpdated) -> None:
        before = {r.id: self.model.rows[r.id] for r in message.rows if r.id in self.model.rows}
        self.model.update(message.rows)
        if message.summaries_done:
            self.summarized = True
        if any(r.method and r.method not in self._methods for r in message.rows):
            self._update_method_options()
        self._show_rows()
        self._alert(before, message.rows)

    def _alert(self, before: dict[str, RunRow], after: list[RunRow]) -> None:
        """The bell and a toast for each run that ended, failed or hung, and each sweep that ended."""
        alerts = run_alerts(before, after, self._quiet)
        ended = [r for r in after if r.id in before and before[r.id].status in ACTIVE and r.status not in ACTIVE]
        alerts += sweep_alerts(ended, self.model.rows, self.model.group_records)
        self._quiet.difference_update(r.id for r in ended)
        if not alerts:
            return
        self.app.bell()
        for alert in alerts:
            self.notify(alert.text, title=alert.title, severity=alert.severity, markup=False,
                        timeout=20 if alert.severity == "error" else 10)

    def on_runs_removed(self, message: RunsRemoved) -> None:
        self.model.remove(message.run_ids)
        self._show_rows()

    def on_groups_read(self, message: GroupsRead) -> None:
        self.model.set_groups(message.records)
        self._show_rows()

    def on_queue_reordered(self, message: QueueReordered) -> None:
        moved = [replace(row, queue_position=message.positions[row.id]) for row in self.model.rows.values()
                 if row.status == "queued" and row.id in message.positions]
        self.model.update(moved)
        self._show_rows()

    def on_run_meta_changed(self, message: RunMetaChanged) -> None:
        row = self.model.rows.get(message.run_id)
        if row is None:
            return
        row = with_meta(row, message.notes)
        self.model.update([row])
        self._show_rows()
        if message.what == "archive":
            hidden = row.archived and not self.model.show_archived
            self.notify(f"{row.title}: " + ("archived" + (" (A shows archived runs)" if hidden else "")
                                            if row.archived else "unarchived"), title="Archive")

    def on_run_stopping(self, message: RunStopping) -> None:
        self._quiet.add(message.run_id)
        row = self.model.rows.get(message.run_id)
        self._stop_asked[message.run_id] = row.status if row else ""

    def on_run_stopped(self, message: RunStopped) -> None:
        row = self.model.rows.get(message.run_id)
        title = row.title if row else message.run_id
        was_queued = self._stop_asked.pop(message.run_id, "") == "queued"
        note = "" if message.clean else " (some processes had to be killed)"
        self.notify(f"{title}: " + ("cancelled, it never started" if was_queued and message.status == "stopped"
                                    else message.status + note), title="Cancelled" if was_queued else "Stopped")

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
        row = self.query_one(RunsTable).cursor_row
        if isinstance(row, GroupRow):
            text = row.status_text()
        else:
            text = detail_text(row, self.app.config.clock()) if row else ""
            url = self.query_one(RunsTable).serving.get(row.id) if row else None
            if url:  # first, where 80 columns still show it
                head, _, rest = text.partition(": ")
                text = f"{head}: ⇄ serving on {url} (V) · {rest}"
        self.query_one("#home-detail", Static).update(text)

    def on_runs_table_highlighted(self, message: RunsTable.Highlighted) -> None:
        self._show_detail()

    def _show_status(self) -> None:
        model = self.model
        if model is None:
            return
        counts = model.counts()
        model.visible  # noqa: B018 (counts the runs that pass the filters)
        archived = counts.get("archived", 0)
        total = len(model.rows) - (0 if model.show_archived else archived)
        shown = model.accepted_count
        parts = [f"{shown} of {plural(total, 'run')}" if shown != total else plural(total, "run")]
        if not self.loaded:
            parts[0] += " (loading…)"
        elif not model.rows:  # nothing yet: where the runs would be, and how to start one
            parts = [f"no runs in {self.app.config.runs_root.resolve()}"]
        if self._reading:
            busy = sum(1 for state in self._reading.values() if state == "reading")
            parts.append(f"reading metrics of {plural(len(self._reading), 'long run')} ({busy} at once)…")
        for status in ("running", "starting", "stopping", "queued", FLAGGED):
            if counts.get(status):
                parts.append(f"{counts[status]} {status}")
        serving = len(self.query_one(RunsTable).serving)
        if serving:
            parts.append(f"{serving} serving (V)")
        if archived:
            parts.append(f"{archived} archived" + (" shown" if model.show_archived else " hidden (A shows)"))
        if model.marked:
            parts.append(f"{len(model.marked)} marked (c to compare)")
        if model.sort_key:
            parts.append(f"sorted by {SORT_LABELS[model.sort_key]} {'▼' if model.sort_reverse else '▲'}")
        self.query_one("#home-status", Static).update(" · ".join(parts))

    def _tick(self) -> None:
        if self.model and self.model.active:
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
        group = self.model.group_of(run_id) if run_id and run_id not in self.model.rows else None
        if group is not None:
            self.app.open_group(group.group_id)
        elif run_id:
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
        row = self.query_one(RunsTable).cursor_row
        if isinstance(row, GroupRow) and row.runs:
            row = row.runs[0]  # a sweep's recipe: that of its first run
        if row is not None:
            self.app.open_clone(row.path)

    def action_chat(self) -> None:
        marked = [run_id for run_id in self.model.marked if run_id in self.model.rows]
        if len(marked) == 2:  # an arena: the two marked runs answer each prompt side by side
            self.app.open_chat(marked[0], vs_run=marked[1])
            return
        row = self.query_one(RunsTable).cursor_row
        if row is not None and not isinstance(row, GroupRow):
            self.app.open_chat(row.id)

    def _finished_run_id(self, verb: str) -> str | None:
        """The run under the cursor when it has a final model; else a toast says why not."""
        row = self.query_one(RunsTable).cursor_row
        if row is None or isinstance(row, GroupRow):
            if row is not None:
                self.notify(f"unfold the sweep (f) and pick the run to {verb}", title=row.name)
            return None
        if not RunDir(row.path).final.is_dir():
            self.notify(f"{row.title} has no final model ({row.status}); {verb} a succeeded run",
                        title=verb.capitalize(), severity="warning", markup=False)
            return None
        return row.id

    def action_evaluate(self) -> None:
        run_id = self._finished_run_id("evaluate")
        if run_id is not None:
            self.app.open_evaluate(run_id)

    def action_export(self) -> None:
        run_id = self._finished_run_id("export")
        if run_id is not None:
            self.app.open_export(run_id)

    def refresh_eval(self, run_id: str) -> None:
        """A new eval result of the run: its eval column reads it (one small file)."""
        row = self.model.rows.get(run_id) if self.model else None
        if row is None:
            return
        latest = evals.latest(row.path)
        self.model.update([replace(row, eval_ppl=evals.number(latest, "tuned", "perplexity"),
                                   eval_base_ppl=evals.number(latest, "base", "perplexity"))])
        self._show_rows()

    def action_fold(self) -> None:
        """Unfold the sweep under the cursor, or fold it (from its row or one of its runs)."""
        table = self.query_one(RunsTable)
        group = self.model.group_of(table.cursor_run_id)
        if group is None:
            self.notify("not a sweep's run: f folds and unfolds sweeps", title="Fold")
            return
        self.model.toggle_group(group.group_id)
        self._show_rows()
        table.move_to_id(group.id)

    def action_show_archived(self) -> None:
        self.model.show_archived = not self.model.show_archived
        self.model.invalidate()
        self._show_rows()

    def managed_run(self) -> Target | None:
        """The run under the cursor (a sweep's line is no run: say so)."""
        row = self.query_one(RunsTable).cursor_row
        if isinstance(row, GroupRow):
            self.notify("unfold the sweep (f) and pick one of its runs", title=row.name)
            return None
        if row is None:
            return None
        return Target(row.id, row.path, row.title, row.status)

    def action_clear_filters(self) -> None:
        """Clear the filters; the marks stay (u clears them)."""
        if self.focused is self.query_one("#filter-text"):
            self.query_one(RunsTable).focus()
            return
        self.query_one("#filter-text", Input).value = ""
        self.query_one("#filter-status", Select).clear()
        self.query_one("#filter-method", Select).clear()
        self._show_rows()

    def action_unmark_all(self) -> None:
        self.model.marked.clear()
        self._show_rows()

    def action_top(self) -> None:
        self.query_one(RunsTable).action_jump(0)

    def action_bottom(self) -> None:
        self.query_one(RunsTable).action_jump(-1)

