"""Compare runs: curves overlaid per metric by step or by tokens, the recipe keys that differ,
and a summary table."""

from __future__ import annotations

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual.worker import get_current_worker

from tuiapp.core.progress import fmt_bytes, fmt_number
from tuiapp.core.recipe import PREFERENCE_KINDS
from tuiapp.core.runs import Run
from tuiapp.ui.comparing import (
    METRICS,
    PREFERENCE_CHARTS,
    CompareRun,
    chart_id,
    config_rows,
    label_runs,
    load_compare_run,
    show_value,
)
from tuiapp.ui.messages import CompareLoaded
from tuiapp.ui.widgets.charts import MetricChart
from tuiapp.ui.widgets.pane_deck import Pane, PaneDeck, PaneDeckActions


class CompareScreen(PaneDeckActions, Screen):
    BINDINGS = [
        Binding("x", "toggle_axis", "Step/tokens", tooltip="Align the curves by step or by tokens seen"),
        Binding("a", "toggle_keys", "All keys", tooltip="Show every recipe key, or only those that differ"),
        Binding("p", "next_pane", "Pane", tooltip="Next pane (1-6 pick one)"),
        Binding("z", "zoom", "Zoom", tooltip="Maximize the current pane, or restore"),
        Binding("escape", "back", "Back", tooltip="Back to the history"),
        *[Binding(str(i), f"pane({i - 1})", f"Pane {i}", show=False) for i in range(1, 7)],
    ]

    def __init__(self, run_ids: list[str]) -> None:
        super().__init__()
        self.run_ids = list(run_ids)
        self.runs: list[CompareRun] = []
        self.axis = "step"
        self.only_differing = True
        self.loaded = False
        self._redraw_pending = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="cmp-title")
        panes = [Pane(title, MetricChart(title.lower(), id=f"cmp-chart-{key}"), id=f"cmp-{key.replace('_', '-')}") for key, (title, _) in METRICS.items()]
        self.preference = self._any_preference_run()
        if self.preference:  # reward margin and accuracy curves of dpo/simpo/cpo/orpo/kto/reward runs
            panes += [Pane(title, MetricChart(title.lower(), id=f"cmp-chart-{chart_id(key)}"), id=f"cmp-{chart_id(key)}")
                      for key, (title, _) in PREFERENCE_CHARTS.items()]
        yield PaneDeck(
            *panes,
            Pane("Config", DataTable(id="cmp-config", cursor_type="row", zebra_stripes=True), id="cmp-config-pane"),
            Pane("Summary", DataTable(id="cmp-summary", cursor_type="row", zebra_stripes=True), id="cmp-summary-pane"),
            id="cmp-deck",
        )
        yield Footer(compact=True)

    def _any_preference_run(self) -> bool:
        root = self.app.config.runs_root
        return any(Run(root / run_id).load().info.get("method") in PREFERENCE_KINDS
                   for run_id in self.run_ids if (root / run_id).is_dir())

    def on_mount(self) -> None:
        self.sub_title = f"compare {len(self.run_ids)} runs"
        self._show_title()
        self.load_runs()

    @work(thread=True, exclusive=True, group="compare")
    def load_runs(self) -> None:
        root = self.app.config.runs_root
        worker = get_current_worker()
        for run_id in self.run_ids:
            if worker.is_cancelled:
                return
            if (root / run_id).is_dir():
                self.post_message(CompareLoaded([load_compare_run(root / run_id)]))
        self.post_message(CompareLoaded([], done=True))

    def on_compare_loaded(self, message: CompareLoaded) -> None:
        self.runs += message.runs
        self.runs.sort(key=lambda r: self.run_ids.index(r.id))
        label_runs(self.runs)
        self.loaded = message.done
        if message.done or len(self.runs) == len(message.runs):  # the last, or the first
            self._redraw()
        elif not self._redraw_pending:  # at most two redraws a second while runs arrive
            self._redraw_pending = True
            self.set_timer(0.5, self._redraw)

    def _redraw(self) -> None:
        self._redraw_pending = False
        self._show_charts()
        self._show_config()
        self._show_summary()
        self._show_evals()
        self._show_title()

    # ------------------------------------------------------------ drawing

    def _show_title(self) -> None:
        names = ", ".join(r.label for r in self.runs) + ("" if self.loaded else " (loading…)")
        keys = "differing keys" if self.only_differing else "all keys"
        self.query_one("#cmp-title", Static).update(f"{len(self.run_ids)} runs by [b]{self.axis}[/] · config: {keys} · {names}")

    def _show_charts(self) -> None:
        for metric in METRICS:
            chart = self.query_one(f"#cmp-chart-{metric}", MetricChart)
            chart.set_series([(r.label, r.series[(metric, self.axis)]) for r in self.runs], x_label=self.axis)
        for metric in PREFERENCE_CHARTS if self.preference else ():
            chart = self.query_one(f"#cmp-chart-{chart_id(metric)}", MetricChart)
            chart.set_series([(r.label, r.series[(metric, self.axis)]) for r in self.runs], x_label=self.axis)

    def _show_config(self) -> None:
        table = self.query_one("#cmp-config", DataTable)
        table.clear(columns=True)
        table.add_column("key", key="key")
        for run in self.runs:
            table.add_column(run.label)
        rows = config_rows([r.recipe for r in self.runs], self.only_differing)
        for key, values in rows:
            table.add_row(key, *[show_value(v) for v in values], key=key)
        if not rows:
            table.add_row("(the recipes are identical; a shows all keys)", *["" for _ in self.runs])

    def _show_summary(self) -> None:
        table = self.query_one("#cmp-summary", DataTable)
        table.clear(columns=True)
        table.add_columns("run", "status", "best eval", "last loss", "tok/s", "peak mem", "duration", "steps")
        if self.preference:
            table.add_columns("best acc", "best margin")
        now = self.app.config.clock()
        for run in self.runs:
            row = run.row
            extra = (fmt_number(row.best_accuracy, ".3f"), fmt_number(row.best_margin, ".3f")) if self.preference else ()
            table.add_row(
                run.label, row.view(now).short, fmt_number(row.best_eval_loss, ".4f"), fmt_number(row.last_loss, ".4f"),
                fmt_number(row.tokens_per_s, ".0f"), fmt_bytes(row.peak_mem), row.time_text(now) or "-",
                fmt_number(row.step, ".0f"), *extra, key=run.id,
            )

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

    def config_keys(self) -> list[str]:
        """Keys shown in the config table (for tests and the palette)."""
        return [key for key, _ in config_rows([r.recipe for r in self.runs], self.only_differing)]

    # ------------------------------------------------------------ actions

    def action_toggle_axis(self) -> None:
        self.axis = "tokens" if self.axis == "step" else "step"
        self._show_charts()
        self._show_title()

    def action_toggle_keys(self) -> None:
        self.only_differing = not self.only_differing
        self._show_config()
        self._show_title()
