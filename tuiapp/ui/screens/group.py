"""One sweep: its runs ranked by the sweep's metric (best eval loss, or final loss), a table of
the keys it varies against final and best loss, and for exactly two varied keys a heat map.
`c` compares its runs, labelled by their values; enter opens the run under the cursor."""

from __future__ import annotations

import time

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Static
from textual.worker import get_current_worker

from tuiapp.core.run_folder.metrics import JsonlReader
from tuiapp.core.run_folder.rundir import ACTIVE
from tuiapp.core.store import meta
from tuiapp.core.store.runs import Run, RunStore
from tuiapp.ui.groups import (
    METRIC_LABELS,
    GroupRow,
    build_groups,
    heat_map,
    metric_of,
    rank_runs,
    read_groups,
    short_key,
    table_rows,
)
from tuiapp.ui.history import RunRow, queue_positions, row_from_record, with_metrics
from tuiapp.ui.messages import GroupLoaded
from tuiapp.ui.widgets.header import AppHeader
from tuiapp.ui.widgets.key_footer import KeyFooter


def load_group(runs_root, group_id: str) -> tuple[dict, list[RunRow]]:
    """The sweep's record and its runs, each summed up from all its metrics."""
    record = read_groups(runs_root).get(group_id) or {}
    store = RunStore(runs_root)
    ids = [str(i) for i in record.get("runs") or []]
    if not ids:  # no record (yet): the runs that name the sweep in their run.json
        ids = [p.name for p in store.run_dirs() if (Run(p).load().record.group or {}).get("id") == group_id]
    positions: dict[str, int] | None = None
    rows = []
    for run_id in ids:
        path = store.root / run_id
        if not path.is_dir():
            continue  # deleted
        run = Run(path).load()
        if run.status in ACTIVE:
            run.refresh_truth()
        if run.status == "queued" and positions is None:
            positions = queue_positions(store.root)
        row = row_from_record(path, run.record, meta.read_meta(path), (positions or {}).get(run_id))
        rows.append(with_metrics(row, JsonlReader(run.metrics_path).read_all()))
    return record, rows


class GroupScreen(Screen):
    BINDINGS = [
        Binding("enter", "open", "Open", tooltip="Open the run under the cursor", priority=True),
        Binding("c", "compare", "Compare", tooltip="Compare the sweep's runs, labelled by the values they try"),
        Binding("escape", "back", "Back", tooltip="Back to the history"),
    ]

    def __init__(self, group_id: str) -> None:
        super().__init__()
        self.group_id = group_id
        self.record: dict = {}
        self.group: GroupRow | None = None
        self.ranked: list[RunRow] = []
        self.loaded = False

    def compose(self) -> ComposeResult:
        yield AppHeader()
        yield Static("", id="grp-title", markup=False)
        yield DataTable(id="grp-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="grp-heat")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.sub_title = self.group_id
        self.query_one("#grp-title", Static).update("loading the sweep…")
        self.load()

    @work(thread=True, exclusive=True, group="group")
    def load(self) -> None:
        config = self.app.config
        worker = get_current_worker()
        while not worker.is_cancelled:
            record, rows = load_group(config.runs_root, self.group_id)
            self.post_message(GroupLoaded(self.group_id, record, rows))
            if not config.live or not any(r.status in ACTIVE for r in rows):
                return
            deadline = time.monotonic() + config.history_poll_s
            while time.monotonic() < deadline and not worker.is_cancelled:
                time.sleep(0.05)

    def on_group_loaded(self, message: GroupLoaded) -> None:
        self.record = message.record
        groups = build_groups(message.rows, {self.group_id: message.record} if message.record else {}, set())
        self.group = groups.get(self.group_id) or GroupRow(self.group_id, str(message.record.get("name") or self.group_id),
                                                           list(message.record.get("keys") or []),
                                                           metric_of(message.record), size=len(message.record.get("runs") or []))
        self.ranked = rank_runs(self.group.runs, self.group.metric)
        self.sub_title = self.group.name
        self.loaded = True
        self._show()

    # ------------------------------------------------------------ drawing

    def _show(self) -> None:
        group = self.group
        metric = METRIC_LABELS[group.metric]
        self.query_one("#grp-title", Static).update(
            f"sweep {group.name} · {group.progress()} · ranked by {metric} · {group.best_text()}")
        table = self.query_one("#grp-table", DataTable)
        cursor = table.cursor_row
        table.clear(columns=True)
        table.add_column("#", key="place")
        for key in group.keys:
            table.add_column(short_key(key), key=key)
        best = "held-out reward" if group.metric == "held_out" else "best eval"  # the last column: what ranks
        for label, key in (("status", "status"), ("step", "step"), ("final loss", "last_loss"), (best, "best_eval")):
            table.add_column(label + (" ▲" if key == ("last_loss" if group.metric == "loss" else "best_eval") else ""),
                             key=key)
        for row, cells in zip(self.ranked, table_rows(group.runs, group.keys, group.metric, self.app.config.clock()),
                              strict=True):
            table.add_row(*cells, key=row.id)
        if self.ranked:
            table.move_cursor(row=min(cursor, len(self.ranked) - 1))
        heat = self.query_one("#grp-heat", Static)
        if len(group.keys) == 2:
            heat.update(heat_map(group.runs, group.keys, group.metric))
        else:
            heat.update(f"[dim]a heat map needs exactly two varied keys; this sweep varies {len(group.keys)}[/]")

    # ------------------------------------------------------------ actions

    def _cursor_run(self) -> RunRow | None:
        table = self.query_one("#grp-table", DataTable)
        return self.ranked[table.cursor_row] if 0 <= table.cursor_row < len(self.ranked) else None

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_open()

    def action_open(self) -> None:
        row = self._cursor_run()
        if row is not None:
            self.app.open_run(row.id)

    def action_compare(self) -> None:
        ids = [r.id for r in self.ranked]
        if len(ids) < 2:
            self.notify("a sweep of one run: nothing to compare", title="Compare")
            return
        self.app.open_compare(ids)

    def action_back(self) -> None:
        self.app.pop_screen()
