"""Compare runs: curves overlaid per metric (smoothed, on a log scale, by step, tokens, wall time
or percent of each run, zoomed, read at a cursor), the recipe keys that differ, a summary table
and every eval's samples side by side. Runs that are still going are followed live."""

from __future__ import annotations

import time

from rich.cells import cell_len
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Static, Tabs
from textual.worker import get_current_worker

from tuiapp.core.common.methods import is_distill, is_preference, is_rl
from tuiapp.core.run_folder.metrics import source_tokens_text
from tuiapp.core.run_folder.progress import fmt_bytes, fmt_number
from tuiapp.core.run_folder.rundata import needs_columns, numpy_module
from tuiapp.core.run_folder.rundir import RunRecord
from tuiapp.core.store import meta
from tuiapp.core.store.runs import ACTIVE, Run
from tuiapp.ui.columns_pool import build_all
from tuiapp.ui.comparing import (
    AXES,
    AXIS_LABELS,
    BENCH_CHARTS,
    COLORS,
    DISTILL_CHARTS,
    HELD_OUT_CHART,
    MARKERS,
    METRICS,
    PREFERENCE_CHARTS,
    RL_CHARTS,
    ROBUST_METRICS,
    SMOOTHING,
    CompareRun,
    abbreviate,
    chart_id,
    config_rows,
    default_x_range,
    ema,
    fit_columns,
    has_benchmarks,
    label_runs,
    load_compare_run,
    prune_columns_cache,
    sample_rows,
    show_value,
    summary_row,
    tick_label,
    time_unit,
    value_at,
    x_values,
)
from tuiapp.ui.footer_keys import footer_by_priority
from tuiapp.ui.history import row_from_record
from tuiapp.ui.messages import ColumnsProgress, CompareLoaded, MetricsAppended, RunStatusChanged
from tuiapp.ui.widgets.charts import CompareChart, Line, View
from tuiapp.ui.widgets.header import AppHeader
from tuiapp.ui.widgets.key_footer import KeyFooter
from tuiapp.ui.widgets.pane_deck import Pane, PaneDeck, PaneDeckActions, pane_bindings

CURSOR_STEPS = 60  # left/right move the cursor by 1/60 of the range shown (shift: 1/10)


def cell_widths(headers: list[str], rows: list[tuple[str | None, list[str]]]) -> list[int]:
    widths = [cell_len(header) for header in headers]
    for _, cells in rows:
        widths = [max(width, cell_len(str(cell))) for width, cell in zip(widths, cells, strict=True)]
    return widths


def fill_table(table: DataTable, headers: list[str], rows: list[tuple[str | None, list[str]]],
               widths: list[int] | None = None) -> None:
    """Replace a table's columns and rows, each column as wide as its widest cell (or `widths`):
    a DataTable left to size its columns measures new rows on its next idle, so the frame drawn
    before that showed every column cut to its label's width."""
    widths = widths or cell_widths(headers, rows)
    table.clear(columns=True)
    for header, width in zip(headers, widths, strict=True):
        table.add_column(header, width=width)
    for key, cells in rows:
        table.add_row(*cells, key=key)


def fit_title(first: str, parts: list[str], names: str, width: int) -> str:
    """A title line of at most `width` cells (markup): `first` whole, then as many of `parts` as
    fit in their order, then `names` cut with … to the room left (left out under 8 cells)."""
    def cells(markup: str) -> int:
        return Text.from_markup(markup).cell_len

    kept = [escape(first)] if first else []
    for part in parts:
        if cells(" · ".join([*kept, part])) <= width:
            kept.append(part)
    room = width - cells(" · ".join([*kept, ""])) if kept else width
    if names and room >= 8:
        text = Text(names)
        text.truncate(room, overflow="ellipsis")
        kept.append(escape(text.plain))
    return " · ".join(kept)


class ConfigTable(DataTable):
    """The config pane's table: says when its width changed (its columns are fitted to it)."""

    class Resized(Message):
        pass

    def on_resize(self, event: events.Resize) -> None:
        self.post_message(self.Resized())


class CompareScreen(PaneDeckActions, Screen):
    CSS = """
    CompareScreen #cmp-body { height: 1fr; }
    CompareScreen #cmp-deck { width: 1fr; }
    CompareScreen #cmp-legend { width: 28; height: 1fr; padding: 0 1; border-left: vkey $border-blurred; }
    CompareScreen.-wide #cmp-legend { width: 34; }
    CompareScreen #cmp-zoom-legend { display: none; dock: right; width: 28; height: 1fr; padding: 0 1;
                                     border-left: vkey $border-blurred; }
    CompareScreen.-wide #cmp-zoom-legend { width: 34; }
    CompareScreen.-maximized-view #cmp-zoom-legend { display: block; }
    CompareScreen.-maximized-view #cmp-zoom-legend.-off { display: none; }
    CompareScreen.-wide #cmp-deck > #deck-body { grid-size: 2; }
    CompareScreen.-wide #cmp-deck > #deck-body > .pane.-offpage { display: none; }
    CompareScreen.-wide.-paged #cmp-deck > #deck-tabs { display: block; }
    CompareScreen #cmp-config-detail { height: auto; max-height: 40%; padding: 0 1; border-top: solid $border-blurred; }
    """
    PANE_ROWS = 14  # a pane shown in the grid gets at least this many rows (about 8 of plot)
    PANE_CELLS = 42  # and this many columns
    WIDE_PANES = ("cmp-config-pane", "cmp-summary-pane")  # a whole row of the grid each: run columns side by side
    ALLOW_IN_MAXIMIZED_VIEW = "Footer, #cmp-zoom-legend"  # z on a chart keeps its legend beside it
    AUTO_FOCUS = None  # the cursor keys move the chart's cursor; tab reaches the tables
    # what an 80-column footer keeps (whole keys; the help screen and the palette list every one)
    FOOTER_PRIORITY = ["back", "cursor(-1)", "zoom_x(0.5)", "zoom_x(2)", "zoom", "next_pane", "toggle_run",
                       "smooth(1)", "smooth(-1)", "toggle_log", "next_axis", "toggle_keys", "reset_zoom"]
    BINDINGS = [
        Binding("x", "next_axis", "X axis", tooltip="x axis: step, tokens, wall time or % of each run"),
        Binding("s", "smooth(1)", "Smooth+", tooltip="More EMA smoothing (0 to 0.99, as in TensorBoard and W&B)"),
        Binding("S", "smooth(-1)", "Smooth-", tooltip="Less EMA smoothing"),
        Binding("l", "toggle_log", "Log y", tooltip="Logarithmic y axis, or linear"),
        # priority: the cursor keys reach the charts whatever has focus (a focused table gets them back)
        Binding("left", "cursor(-1)", "Cursor", priority=True, tooltip="Move the cursor; the side table reads each run's value there"),
        Binding("right", "cursor(1)", "Cursor", show=False, priority=True),
        Binding("shift+left", "cursor(-6)", "Cursor fast", show=False, priority=True),
        Binding("shift+right", "cursor(6)", "Cursor fast", show=False, priority=True),
        Binding("plus,equals_sign", "zoom_x(0.5)", "Zoom in", tooltip="Zoom the x axis in around the cursor"),
        Binding("minus", "zoom_x(2)", "Zoom out", tooltip="Zoom the x axis out around the cursor (up to every run whole)"),
        Binding("0", "reset_zoom", "Reset", tooltip="Back to the default x range"),
        Binding("up", "pick_run(-1)", "Run", show=False, priority=True, tooltip="Pick a run in the side table"),
        Binding("down", "pick_run(1)", "Run", show=False, priority=True, tooltip="Pick a run in the side table"),
        Binding("h", "toggle_run", "Hide/show", tooltip="Hide or show the run picked in the side table"),
        Binding("a", "toggle_keys", "All keys", tooltip="Show every recipe key, or only those that differ"),
        Binding("p", "next_pane", "Pane", tooltip="Next pane (1-9 pick one)"),
        Binding("z", "zoom", "Full", tooltip="Maximize the current pane, or restore"),
        Binding("escape", "back", "Back", tooltip="Back to the history"),
        *pane_bindings(9),
    ]

    def __init__(self, run_ids: list[str]) -> None:
        super().__init__()
        self.run_ids = list(run_ids)
        self.runs: list[CompareRun] = []
        self.axis = "step"
        self.smoothing = 0  # index into SMOOTHING
        self.log_y = False
        self.zoom: dict[str, tuple[float, float]] = {}  # axis -> x range chosen with +/-
        self.cursor: float | None = None  # None: at the right end of the range, following new points
        self.picked = 0  # the run the side table highlights (h hides it)
        self.only_differing = True
        self.preference = self.online_rl = self.only_rl = False  # set from the runs' methods in compose
        self.loaded = False
        self.reading: dict[str, str] = {}  # long runs without columns: run id -> queued / reading / read
        self._redraw_pending = False
        self._shown_statuses: tuple[str, ...] = ()
        self._smoothed: dict[tuple, tuple[int, list[float]]] = {}
        self._x_cache: dict[tuple, tuple[int, list[float]]] = {}
        self._lines: dict[tuple[str, str], Line] = {}

    @property
    def active_bindings(self):
        return footer_by_priority(self.app, super().active_bindings, self.FOOTER_PRIORITY, self.size.width)

    @property
    def smoothing_weight(self) -> float:
        return SMOOTHING[self.smoothing]

    def compose(self) -> ComposeResult:
        yield AppHeader()
        yield Static("", id="cmp-title")
        methods = self._methods()
        self.preference, self.online_rl = any(map(is_preference, methods)), any(map(is_rl, methods))
        self.only_rl = bool(methods) and all(map(is_rl, methods))  # their held-out reward in the eval loss's place
        self.benchmarked = self._benchmarked()
        self.distilled = any(map(is_distill, methods))  # a KL-to-teacher chart
        panes = [Pane(title, CompareChart(title.lower(), id=f"cmp-chart-{chart_id(key)}"), id=f"cmp-{chart_id(key)}")
                 for key, (title, _) in self.chart_metrics().items()]
        with Horizontal(id="cmp-body"):
            yield PaneDeck(
                *panes,
                Pane("Config", ConfigTable(id="cmp-config", cursor_type="row", zebra_stripes=True, fixed_columns=1),
                     Static("", id="cmp-config-detail"), id="cmp-config-pane"),
                Pane("Summary", DataTable(id="cmp-summary", cursor_type="row", zebra_stripes=True), id="cmp-summary-pane"),
                Pane("Samples", VerticalScroll(Static("", id="cmp-samples")), id="cmp-samples-pane"),
                id="cmp-deck",
            )
            yield Static("", id="cmp-legend")
        yield Static("", id="cmp-zoom-legend")  # the same, beside a zoomed (maximized) chart
        yield KeyFooter(compact=True)

    def chart_metrics(self) -> dict[str, tuple[str, str]]:
        """The metrics charted: the usual ones (grpo/rloo runs alone: their held-out reward in the eval
        loss's place), and reward curves when a preference or an online RL run is compared."""
        charts = dict(HELD_OUT_CHART if key == "eval_loss" and self.only_rl else (key, value)
                      for key, value in METRICS.items())
        return {**charts, **(PREFERENCE_CHARTS if self.preference else {}), **(RL_CHARTS if self.online_rl else {}),
                **(BENCH_CHARTS if getattr(self, "benchmarked", False) else {}),
                **(DISTILL_CHARTS if getattr(self, "distilled", False) and not self.preference else {})}

    def _benchmarked(self) -> bool:
        """Whether a compared run scores benchmarks while training (a Benchmark chart then)."""
        root = self.app.config.runs_root
        return any(has_benchmarks(Run(root / run_id).load().record.recipe) for run_id in self.run_ids
                   if (root / run_id).is_dir())

    def _methods(self) -> set[str]:
        root = self.app.config.runs_root
        return {Run(root / run_id).load().record.method for run_id in self.run_ids if (root / run_id).is_dir()}

    def on_mount(self) -> None:
        self.sub_title = f"compare {len(self.run_ids)} runs"
        self.query_one("#deck-tabs", Tabs).can_focus = False  # left/right belong to the cursor
        self.set_focus(None)
        self.lay_out()
        self._show_title()
        self.load_runs()
        if self.app.config.live:
            self.set_interval(1.0, self._tick_status)  # a run whose steps stop turns stalled with no new line

    # ------------------------------------------------------------ workers

    @work(thread=True, exclusive=True, group="compare")
    def load_runs(self) -> None:
        """Runs with columns (their own, or the TUI's cache) are read here at once; long runs
        without them get theirs made in worker processes, in parallel (columns_pool), each
        loaded as soon as its columns are in, with its state shown meanwhile."""
        config = self.app.config
        root = config.runs_root
        worker = get_current_worker()
        numpy_module()  # here, not in the first chart's render on the UI thread (~0.15 s)
        paths = [root / run_id for run_id in self.run_ids if (root / run_id).is_dir()]
        slow = [path for path in paths if needs_columns(path)]
        for path in slow:
            self.post_message(ColumnsProgress(path.name, "queued"))
        batch: list[CompareRun] = []
        posted = time.monotonic()
        for path in paths:
            if worker.is_cancelled:
                return
            if path not in slow:
                batch.append(load_compare_run(path))
            if batch and time.monotonic() - posted > 1.0:  # slow reads: show the runs read so far
                self.post_message(CompareLoaded(batch))
                batch, posted = [], time.monotonic()
        if batch:
            self.post_message(CompareLoaded(batch))

        def built(path, ok: bool) -> None:
            self.post_message(ColumnsProgress(path.name, "read"))
            self.post_message(CompareLoaded([load_compare_run(path)]))

        build_all(slow, lambda path: self.post_message(ColumnsProgress(path.name, "reading")), built,
                  lambda: worker.is_cancelled)
        if worker.is_cancelled:
            return
        self.post_message(CompareLoaded([], done=True))  # its handler starts following the runs
        prune_columns_cache(root)

    @work(thread=True, exclusive=True, group="compare-live")
    def follow_runs(self) -> None:
        """New metrics lines of every compared run (from where the load stopped) and run.json
        changes (a run that finishes while the screen is open says so)."""
        config = self.app.config
        worker = get_current_worker()
        runs = list(self.runs)
        seen: dict[str, RunRecord | None] = {run.id: None for run in runs}  # each run's record at the last look
        last_status = 0.0
        while not worker.is_cancelled:
            active = False
            for run in runs:
                records = run.reader.read_new() if run.reader is not None else []
                if records:
                    self.post_message(MetricsAppended(run.id, records))
            if time.monotonic() - last_status >= 1.0:
                last_status = time.monotonic()
                for run in runs:
                    record = Run(run.path).load().refresh_truth().record
                    if record != seen[run.id]:
                        if seen[run.id] is not None:
                            self.post_message(RunStatusChanged(run.id, record.copy()))
                        seen[run.id] = record.copy()
            active = any(record is not None and record.status in ACTIVE for record in seen.values())
            time.sleep(config.poll_s if active else config.poll_s * 4)

    # ------------------------------------------------------------ handlers

    def on_columns_progress(self, message: ColumnsProgress) -> None:
        self.reading[message.run_id] = message.state
        self._show_title()
        self._show_legend()

    def on_compare_loaded(self, message: CompareLoaded) -> None:
        for run in message.runs:
            self.reading.pop(run.id, None)
            index = self.run_ids.index(run.id)
            run.marker, run.color = MARKERS[index % len(MARKERS)], COLORS[index % len(COLORS)]
        self.runs += message.runs
        self.runs.sort(key=lambda r: self.run_ids.index(r.id))
        label_runs(self.runs)
        self.loaded = message.done
        if message.done and self.app.config.live:
            self.follow_runs()  # here, once every run is in self.runs (not from the loading thread)
        if message.done or len(self.runs) == len(message.runs):  # the last, or the first
            self._redraw()
        elif not self._redraw_pending:  # at most two redraws a second while runs arrive
            self._redraw_pending = True
            self.set_timer(0.5, self._redraw)

    def on_metrics_appended(self, message: MetricsAppended) -> None:
        run = self._run(message.run_id)
        if run is None or not message.records:
            return
        evals = len(run.data.evals)
        run.data.extend(message.records)
        run.row = summary_row(run.row, run.data)
        self._show_charts()  # the config table keeps its scroll position: recipes do not change
        self._show_summary()
        if len(run.data.evals) != evals:
            self._show_samples()

    def on_run_status_changed(self, message: RunStatusChanged) -> None:
        run = self._run(message.run_id)
        if run is None:
            return
        row = row_from_record(run.path, message.record, meta.read_meta(run.path))
        run.row = summary_row(row, run.data)
        self._show_summary()
        self._show_title()

    def _run(self, run_id: str) -> CompareRun | None:
        return next((r for r in self.runs if r.id == run_id), None)

    def _redraw(self) -> None:
        self._redraw_pending = False
        self._show_charts()
        self._show_config()
        self._show_summary()
        self._show_samples()
        self._show_title()

    # ------------------------------------------------------------ curves

    def _xs(self, run: CompareRun, metric: str) -> list[float]:
        """The metric's x values on the current axis (cached by the series' version)."""
        series = run.metric(metric)
        key = (run.id, metric, self.axis)
        cached = self._x_cache.get(key)
        if cached and cached[0] == series.version:
            return cached[1]
        xs = x_values(run.data, series.xs, self.axis)
        if self.axis == "time":
            unit = self._time_unit()[0]
            xs = [x / unit for x in xs]
        self._x_cache[key] = (series.version, xs)
        return xs

    def _ys(self, run: CompareRun, metric: str) -> list[float]:
        series = run.metric(metric)
        weight = self.smoothing_weight
        if weight <= 0:
            return series.ys
        key = (run.id, metric, weight)
        cached = self._smoothed.get(key)
        if cached and cached[0] == series.version:
            return cached[1]
        ys = ema(series.ys, weight)
        self._smoothed[key] = (series.version, ys)
        return ys

    def _time_unit(self) -> tuple[float, str]:
        spans = [r.data.times[-1] - r.data.times[0] for r in self.runs if len(r.data.times) and r.data.times[0] == r.data.times[0]]
        return time_unit(max([s for s in spans if s == s] or [0.0]))

    def _line(self, run: CompareRun, metric: str) -> Line:
        """The run's curve of the metric as drawn now (cached until its data, the axis or the
        smoothing change)."""
        key = (run.id, metric, self.axis, self.smoothing_weight, run.metric(metric).version)
        line = self._lines.get((run.id, metric))
        if line is not None and line.key[:5] == key and line.label == run.label:
            return line
        xs, ys = self._xs(run, metric), self._ys(run, metric)
        if self.axis in ("tokens", "time") and any(x != x for x in xs):  # rows without tokens or time: no x
            pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if x == x]
            xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        line = Line(run.label, xs, ys, marker=run.marker, color=run.color, key=(*key, len(xs)))
        self._lines[(run.id, metric)] = line
        return line

    def _ends(self) -> list[float]:
        """Where each shown run's curves end on the current axis."""
        ends = []
        for run in self.shown_runs():
            xs = [x for x in self._xs(run, "loss")[-1:] if x == x]
            if xs:
                ends.append(xs[-1])
        return ends

    def _full_range(self) -> tuple[float, float]:
        ends = self._ends()
        return 0.0, max(ends) if ends and max(ends) > 0 else 1.0

    def _view_range(self) -> tuple[float, float]:
        """The x range shown: the zoom chosen, else the default (short runs are not squeezed)."""
        if self.axis in self.zoom:
            return self.zoom[self.axis]
        return default_x_range(self._ends()) or (0.0, 1.0)

    def shown_runs(self) -> list[CompareRun]:
        return [run for run in self.runs if not run.hidden]

    def _note(self) -> str:
        notes = []
        view_end, full_end = self._view_range()[1], self._full_range()[1]
        if self.axis not in self.zoom and view_end < full_end:
            notes.append(f"x to {tick_label(view_end)} of {tick_label(full_end)} (- zooms out)")
        if self.smoothing_weight:
            notes.append(f"EMA {self.smoothing_weight:g}")
        return ", ".join(notes)

    def _show_charts(self) -> None:
        x_label = AXIS_LABELS[self.axis] + (f" ({self._time_unit()[1]})" if self.axis == "time" else "")
        for metric in self.chart_metrics():
            view = View(
                x_range=self._view_range(), cursor=self.cursor_x(), log_y=self.log_y, robust=metric in ROBUST_METRICS,
                integer_x=self.axis in ("step", "tokens"), x_label=x_label, note=self._note(),
            )
            chart = self.query_one(f"#cmp-chart-{chart_id(metric)}", CompareChart)
            chart.show([self._line(run, metric) for run in self.shown_runs()], view)
        self._show_legend()

    def cursor_x(self) -> float:
        """Where the cursor is: where it was moved to (kept inside the range shown), else the
        right end of the range (it follows new points there)."""
        low, high = self._view_range()
        return high if self.cursor is None else min(max(self.cursor, low), high)

    def active_metric(self) -> str:
        """The metric of the pane shown (the loss when the pane is not a chart)."""
        active = self.query_one(PaneDeck).active_id
        for metric in self.chart_metrics():
            if active == f"cmp-{chart_id(metric)}":
                return metric
        return "loss"

    def cursor_values(self, metric: str | None = None) -> dict[str, float | None]:
        """Each run's value of the metric at the cursor (the last point at or before it)."""
        metric = metric or self.active_metric()
        out: dict[str, float | None] = {}
        for run in self.runs:
            line = self._line(run, metric)
            point = value_at(line.xs, line.ys, self.cursor_x())
            out[run.label] = point[1] if point else None
        return out

    def on_resize(self) -> None:
        self._show_legend()
        self._show_title()
        self.lay_out()

    def on_pane_deck_activated(self, message: PaneDeck.Activated) -> None:
        self.lay_out()

    def lay_out(self) -> None:
        """As many panes side by side as the terminal holds readable (PANE_ROWS x PANE_CELLS each,
        at most 3 x 2): the page of panes with the active one; the tabs above say what else there
        is (1-8, p). Narrow terminals show one pane at a time behind the tabs."""
        deck = self.query_one(PaneDeck)
        body = deck.query_one("#deck-body")
        if not self.has_class("-wide"):
            for pane in deck.panes:
                pane.remove_class("-offpage")
            self.remove_class("-paged")
            return
        legend = 34
        columns = max(1, min(3, (self.size.width - legend) // self.PANE_CELLS))
        rows = max(1, min(2, (self.size.height - 5) // self.PANE_ROWS))  # header, title, tabs, footer
        per_page = columns * rows
        pages = self._pages(deck.panes, columns, per_page)
        paged = len(set(pages)) > 1
        ids = [pane.id for pane in deck.panes]
        shown = pages[ids.index(deck.active_id)] if deck.active_id in ids else 0
        for page, pane in zip(pages, deck.panes, strict=True):
            pane.set_class(page != shown, "-offpage")
            pane.styles.column_span = columns if pane.id in self.WIDE_PANES else 1
        body.styles.grid_size_columns = columns
        body.styles.grid_size_rows = rows
        self.set_class(paged, "-paged")

    def _pages(self, panes, columns: int, per_page: int) -> list[int]:
        """The page of each pane in a grid of `columns` x (per_page / columns): a chart takes one
        cell, a table (WIDE_PANES) a whole row, so that its run columns and values are readable."""
        pages, page, cell = [], 0, 0
        for pane in panes:
            width = columns if pane.id in self.WIDE_PANES else 1
            # a grid puts a pane that spans the row beside the one before it, not under it: a
            # table starts a page of its own unless it comes at the start of a row
            if cell + width > per_page or (width > 1 and cell % columns):
                page, cell = page + 1, 0
            pages.append(page)
            cell += width
        return pages

    def _show_legend(self) -> None:
        active = self.query_one(PaneDeck).active_id
        on_chart = any(active == f"cmp-{chart_id(m)}" for m in self.chart_metrics())
        self.query_one("#cmp-legend", Static).display = on_chart or self.has_class("-wide")
        metric = self.active_metric()
        values = self.cursor_values(metric)
        table = Table(box=None, show_header=False, padding=(0, 1, 0, 0), expand=True)
        table.add_column("marker", no_wrap=True, width=1)
        table.add_column("run", ratio=1, overflow="ellipsis", no_wrap=True)
        table.add_column("value", justify="right", no_wrap=True)
        for index, run in enumerate(self.runs):
            style = "reverse" if index == self.picked else ""
            label = Text(run.label, style=("dim strike " if run.hidden else "") + style)
            value = "hidden" if run.hidden else fmt_number(values.get(run.label), ".4g")
            table.add_row(Text(run.marker, style=run.color.rstrip("+")), label, value)
        for run_id, state in self.reading.items():  # long runs whose columns a worker process makes
            table.add_row(Text("…", style="dim"), Text(run_id, style="dim"), Text(state, style="dim"))
        cursor = tick_label(self.cursor_x(), 0.01 if self.axis in ("time", "relative") else 1)
        head = Text.from_markup(f"[b]{escape(self.chart_metrics().get(metric, (metric,))[0])}[/] at {AXIS_LABELS[self.axis]} {cursor}\n")
        legend = Group(head, table, Text("\n↑↓ pick · h hide · ←→ cursor", style="dim"))
        self.query_one("#cmp-legend", Static).update(legend)
        zoomed = self.query_one("#cmp-zoom-legend", Static)
        zoomed.set_class(not on_chart, "-off")
        zoomed.update(legend)

    # ------------------------------------------------------------ tables

    def _show_title(self) -> None:
        """One line, fitted to the width: the loading state first (never cut), then the axis, the
        smoothing, the scale, the config's keys, the runs' names; what does not fit is dropped
        from the end (the names cut with …; the legend and the tables have them whole)."""
        loading = ""
        if not self.loaded:
            loading = f"loading {len(self.runs)}/{len(self.run_ids)} runs"
            busy = sum(1 for state in self.reading.values() if state == "reading")
            if self.reading:
                loading += f" ({busy} reading metrics.jsonl, {len(self.reading)} left)"
            loading += "…"
        slider = "▮" * self.smoothing + "▯" * (len(SMOOTHING) - 1 - self.smoothing)
        parts = [
            f"{len(self.run_ids)} runs by [b]{AXIS_LABELS[self.axis]}[/]",
            f"smooth {slider} {self.smoothing_weight:g}",
            f"y {'log' if self.log_y else 'linear'}",
            f"config: {'differing keys' if self.only_differing else 'all keys'}",
        ]
        self.query_one("#cmp-title", Static).update(
            fit_title(loading, parts, ", ".join(r.label for r in self.runs), max(20, self.size.width - 2)))

    def _show_config(self) -> None:
        """The keys and each run's value, fitted to the pane's width: a long value, key or run
        label is cut in its middle (…); the highlighted row's full values show under the table."""
        table = self.query_one("#cmp-config", DataTable)
        full = [(key, values) for key, values in config_rows([r.recipe for r in self.runs], self.only_differing)]
        rows = [(key, [key, *[show_value(v) for v in values]]) for key, values in full]
        if not rows:
            rows = [(None, ["(the recipes are identical; a shows all keys)", *["" for _ in self.runs]])]
        self._config_full = dict(full)
        headers = ["key", *[run.label for run in self.runs]]
        room = self._config_room()
        self._config_fitted = room
        widths = fit_columns(cell_widths(headers, rows), room) if rows[0][0] is not None else None
        if widths:
            headers = [abbreviate(header, width) for header, width in zip(headers, widths, strict=True)]
            rows = [(key, [abbreviate(cell, width) for cell, width in zip(cells, widths, strict=True)]) for key, cells in rows]
        cursor = table.cursor_row
        fill_table(table, headers, rows, widths)
        if rows and 0 < cursor < len(rows):
            table.move_cursor(row=cursor, animate=False)
        self._show_config_detail()

    def _config_room(self) -> int:
        """The cells the config table's columns may take: its width less a vertical scrollbar's."""
        table = self.query_one("#cmp-config", DataTable)
        width = table.size.width or max(40, self.size.width - 30)
        return max(20, width - 2)

    def on_config_table_resized(self, message: ConfigTable.Resized) -> None:
        if self.runs and self._config_room() != getattr(self, "_config_fitted", None):
            self._show_config()

    @on(DataTable.RowHighlighted, "#cmp-config")
    def _config_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_config_detail()

    def _show_config_detail(self) -> None:
        """The highlighted key and every run's whole value (and whole label), wrapped."""
        table = self.query_one("#cmp-config", DataTable)
        detail = self.query_one("#cmp-config-detail", Static)
        full = getattr(self, "_config_full", {})
        key = None
        if table.row_count and 0 <= table.cursor_row < table.row_count:
            key = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
        if key not in full:
            detail.display = False
            return
        text = Text(key, style="bold")
        for run, value in zip(self.runs, full[key], strict=False):
            text.append("\n")
            text.append(f"{run.marker} {run.label}: ", style="dim")
            text.append(show_value(value))
        detail.display = True
        detail.update(text)

    def _statuses(self, now: float) -> tuple[str, ...]:
        return tuple(run.row.view(now).key for run in self.runs)

    def _tick_status(self) -> None:
        if self.runs and self._statuses(self.app.config.clock()) != self._shown_statuses:
            self._show_summary()

    def _show_summary(self) -> None:
        headers = ["run", "status", "best eval", "last loss", "tok/s", "peak mem", "duration", "steps"]
        if self.preference:
            headers += ["best acc", "best margin"]
        if self.online_rl:  # grpo/rloo: no best eval (their eval loss says nothing); the task's held-out reward
            headers += ["held out"]
        now = self.app.config.clock()
        self._shown_statuses = self._statuses(now)
        rows = []
        for run in self.runs:
            row = run.row
            extra = [fmt_number(row.best_accuracy, ".3f"), fmt_number(row.best_margin, ".3f")] if self.preference else []
            extra += [fmt_number(row.held_out, ".3f")] if self.online_rl else []
            rows.append((run.id, [
                run.label, row.view(now).short, fmt_number(row.best_eval_loss, ".4f"), fmt_number(row.last_loss, ".4f"),
                fmt_number(row.tokens_per_s, ".0f"), fmt_bytes(row.peak_mem), row.time_text(now) or "-",
                fmt_number(row.step, ".0f"), *extra,
            ]))
        fill_table(self.query_one("#cmp-summary", DataTable), headers, rows)
        self._show_evals()
        self._show_bench()
        self._show_sources()

    def _show_sources(self) -> None:
        """A mixture's tokens per source at its last step (a column only when a compared run mixes)."""
        texts = {run.id: source_tokens_text(run.data.last_train) for run in self.runs}
        if not any(texts.values()):
            return
        table = self.query_one("#cmp-summary", DataTable)
        column = table.add_column("tokens per source", key="sources", default="-")
        for run_id, text in texts.items():
            table.update_cell(run_id, column, text or "-")

    def _show_evals(self) -> None:
        """The latest `llmtui eval` of each run beside its summary: tuned and base perplexity
        (columns only when a compared run has been evaluated)."""
        if not any(run.row.eval_ppl is not None for run in self.runs):
            return
        table = self.query_one("#cmp-summary", DataTable)
        tuned = table.add_column("eval ppl", key="eval_ppl", default="-")
        base = table.add_column("base ppl", key="eval_base_ppl", default="-")
        for run in self.runs:
            table.update_cell(run.id, tuned, fmt_number(run.row.eval_ppl, ".3f"))
            table.update_cell(run.id, base, fmt_number(run.row.eval_base_ppl, ".3f"))

    def _show_bench(self) -> None:
        """Each run's benchmarks (the last evaluation's, else its latest `llmtui eval --benchmark`): a
        column per task, only when a compared run has them."""
        tasks: list[str] = []
        for run in self.runs:
            tasks += [task for task in run.row.bench if task not in tasks]
        table = self.query_one("#cmp-summary", DataTable)
        for task in tasks:
            column = table.add_column(task, key=f"bench-{task}", default="-")
            for run in self.runs:
                table.update_cell(run.id, column, fmt_number(run.row.bench.get(task), ".4f"))

    def bench_table(self) -> list[tuple[str, dict]]:
        """(run label, {task: main metric}) of the compared runs (for tests and the palette)."""
        return [(run.label, dict(run.row.bench)) for run in self.runs]

    def _show_samples(self) -> None:
        """Every eval's answers to the sample prompts, one column per run."""
        rows = sample_rows(self.runs)
        widget = self.query_one("#cmp-samples", Static)
        if not rows:
            widget.update("no eval samples yet (set train.eval_steps and train.sample_prompts)")
            return
        parts = []
        for step, prompt, answers in rows:
            parts.append(Text(f"step {step:.0f} · {prompt}", style="bold"))
            table = Table(expand=True, show_edge=False, padding=(0, 1))
            for run in self.runs:
                table.add_column(Text(f"{run.marker} {run.label}"), ratio=1)
            table.add_row(*[Text(a if a is not None else "—") for a in answers])
            parts += [table, Text("")]
        widget.update(Group(*parts))

    def config_keys(self) -> list[str]:
        """Keys shown in the config table (for tests and the palette)."""
        return [key for key, _ in config_rows([r.recipe for r in self.runs], self.only_differing)]

    # ------------------------------------------------------------ actions

    def action_next_axis(self) -> None:
        self.axis = AXES[(AXES.index(self.axis) + 1) % len(AXES)]
        self.cursor = None
        self._show_charts()
        self._show_title()

    def action_toggle_axis(self) -> None:  # the old name of x
        self.action_next_axis()

    def action_smooth(self, delta: int) -> None:
        self.smoothing = max(0, min(len(SMOOTHING) - 1, self.smoothing + delta))
        self._show_charts()
        self._show_title()

    def action_toggle_log(self) -> None:
        self.log_y = not self.log_y
        self._show_charts()
        self._show_title()

    def _table_takes(self, action: str) -> bool:
        """A focused table of the pane shown takes the cursor keys (rows, columns)."""
        focused = self.focused
        pane = self.query_one(PaneDeck).active_pane
        if isinstance(focused, DataTable) and pane is not None and focused in pane.query(DataTable):
            getattr(focused, f"action_{action}")()
            return True
        return False

    def action_cursor(self, steps: int) -> None:
        if self._table_takes("cursor_left" if steps < 0 else "cursor_right"):
            return
        low, high = self._view_range()
        cursor = self.cursor_x()
        move = steps * (high - low) / CURSOR_STEPS
        if self.axis == "step":  # whole steps, at least one a key
            move = steps * max(1, round(abs(move) / abs(steps)))
            cursor = round(cursor)
        cursor += move
        self.cursor = min(max(cursor, low), high)
        self._show_charts()

    def action_zoom_x(self, factor: float) -> None:
        low, high = self._view_range()
        full_low, full_high = self._full_range()
        center = self.cursor_x()
        half = (high - low) * factor / 2
        if factor > 1 and half * 2 >= full_high - full_low:
            self.zoom[self.axis] = (full_low, full_high)
        else:
            half = max(half, 1.0 if self.axis == "step" else (full_high - full_low) / 10000)
            new_low = max(full_low, min(center - half, full_high - 2 * half))  # the window stays inside
            self.zoom[self.axis] = (new_low, min(full_high, new_low + 2 * half))
        self._show_charts()

    def action_reset_zoom(self) -> None:
        self.zoom.pop(self.axis, None)
        self.cursor = None
        self._show_charts()

    def action_pick_run(self, delta: int) -> None:
        if self._table_takes("cursor_up" if delta < 0 else "cursor_down"):
            return
        if self.runs:
            self.picked = (self.picked + delta) % len(self.runs)
            self._show_legend()

    def action_toggle_run(self) -> None:
        if not self.runs:
            return
        run = self.runs[self.picked]
        run.hidden = not run.hidden
        self._show_charts()

    def action_toggle_keys(self) -> None:
        self.only_differing = not self.only_differing
        self._show_config()
        self._show_title()

    def pane_shown(self) -> None:
        """Tables take the keys when their pane is shown; a chart leaves them to the cursor."""
        active = self.query_one(PaneDeck).active_pane
        tables = list(active.query(DataTable)) if active is not None else []
        self.set_focus(tables[0] if tables else None)
        self._show_legend()
        self.lay_out()
