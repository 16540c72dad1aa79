"""The history table's model: every RunRow, and the filtered, sorted list the table shows.

Runs of a sweep fold into one GroupRow (tuiapp.ui.groups) that unfolds into its runs; queued
runs come first in the default order, in the order the queue will start them; archived runs
are hidden unless asked for."""

from __future__ import annotations

from typing import Callable

from tuiapp.core.run_folder.rundir import ACTIVE
from tuiapp.ui.groups import GroupRow, build_groups, ranking_key, run_index
from tuiapp.ui.history import RunRow

FLAGGED = "flagged"  # the status filter of runs that need a look: stalled, hung, orphaned

SORT_KEYS: dict[str, Callable[[RunRow, float], object]] = {
    "name": lambda r, now: r.name.lower(),
    "status": lambda r, now: r.display_status(now),
    "method": lambda r, now: r.method,
    "model": lambda r, now: r.model.lower(),
    "dataset": lambda r, now: r.dataset.lower(),
    "step": lambda r, now: r.step,
    "best_eval": lambda r, now: r.best_eval_loss,
    "preference": lambda r, now: r.best_accuracy,
    "reward": lambda r, now: r.reward,
    "last_loss": lambda r, now: r.last_loss,
    "tokens_per_s": lambda r, now: r.tokens_per_s,
    "peak_mem": lambda r, now: r.peak_mem,
    "duration": lambda r, now: r.duration(now),
    "started": lambda r, now: r.started or r.created,
    "spark": lambda r, now: r.last_loss,
    "eval_ppl": lambda r, now: r.eval_ppl,
    "bench": lambda r, now: next(iter(r.bench.values()), None),
}
SORT_KEYS["name"] = lambda r, now: r.title.lower()
# a sweep's row sorts by what it sums up: its name, its best metric, its start
def _best(group: GroupRow) -> float | None:
    """A sweep's best as a sort key, better first (a held-out reward's sign flipped, as its ranking does)."""
    return None if group.best_value is None else ranking_key(group.best_value, group.metric)


GROUP_SORT_KEYS: dict[str, Callable[[GroupRow, float], object]] = {
    "name": lambda g, now: g.name.lower(),
    "best_eval": lambda g, now: _best(g),
    "last_loss": lambda g, now: _best(g),
    "spark": lambda g, now: _best(g),
    "started": lambda g, now: g.started,
}


class HistoryModel:
    """All rows, and the filtered and sorted list the table shows."""

    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.rows: dict[str, RunRow] = {}
        self.status_filter = ""  # "" = all; a run.json status, a flag (stalled...) or "flagged" (any flag)
        self.method_filter = ""
        self.text_filter = ""
        self.sort_key: str | None = None
        self.sort_reverse = False
        self.marked: list[str] = []
        self.show_archived = False
        self.group_records: dict[str, dict] = {}  # runs/.groups/<id>.json by id
        self.expanded: set[str] = set()  # sweeps shown unfolded
        self.groups: dict[str, GroupRow] = {}  # every sweep of the rows (built with `visible`)
        self.accepted_count = 0  # runs that pass the filters (folded ones included)
        self._visible: list[RunRow | GroupRow] | None = None
        self.active: set[str] = set()  # ids of the runs whose status is ACTIVE: kept as rows change

    def add(self, rows: list[RunRow]) -> None:
        for row in rows:
            self.rows[row.id] = row
            if row.status in ACTIVE:
                self.active.add(row.id)
            else:
                self.active.discard(row.id)
        self._visible = None

    def update(self, rows: list[RunRow]) -> None:
        self.add(rows)

    def remove(self, run_ids: list[str]) -> None:
        for run_id in run_ids:
            self.rows.pop(run_id, None)
            self.active.discard(run_id)
            if run_id in self.marked:
                self.marked.remove(run_id)
        self._visible = None

    def set_groups(self, records: dict[str, dict]) -> None:
        self.group_records = records
        self._visible = None

    def toggle_group(self, group_id: str) -> None:
        self.expanded.symmetric_difference_update({group_id})
        self._visible = None

    def invalidate(self) -> None:
        self._visible = None

    @property
    def filtering(self) -> bool:
        return bool(self.status_filter or self.method_filter or self.text_filter.strip())

    def accepts(self, row: RunRow, now: float) -> bool:
        if row.archived and not self.show_archived:
            return False
        wanted = self.status_filter
        if wanted and row.status != wanted:  # a run.json status, else what is shown (a flag)
            view = row.view(now)
            if not (view.flagged if wanted == FLAGGED else view.key == wanted):
                return False
        if self.method_filter and row.method != self.method_filter:
            return False
        return not self.text_filter or row.matches(self.text_filter)

    @property
    def visible(self) -> list[RunRow | GroupRow]:
        """The table's lines: runs and folded sweeps; an unfolded sweep's runs follow its row
        (every sweep is unfolded while a filter is on, to show the runs that match)."""
        if self._visible is None:
            now = self.clock()
            shown = [r for r in self.rows.values() if not (r.archived and not self.show_archived)]
            self.groups = build_groups(shown, self.group_records, self.expanded)
            accepted = [r for r in shown if self.accepts(r, now)]
            self.accepted_count = len(accepted)
            singles = [r for r in accepted if r.group_id is None]
            members: dict[str, list[RunRow]] = {}
            for row in accepted:
                if row.group_id is not None:
                    members.setdefault(row.group_id, []).append(row)
            tops: list[RunRow | GroupRow] = [*singles, *(self.groups[gid] for gid in members)]
            tops = self._sorted(tops, now, default=self._default_order)
            lines: list[RunRow | GroupRow] = []
            for item in tops:
                lines.append(item)
                if isinstance(item, GroupRow) and (item.expanded or self.filtering):
                    lines += self._sorted(members[item.group_id], now,
                                          default=lambda rows: sorted(rows, key=lambda r: (run_index(r), r.id)))
            self._visible = lines
        return self._visible

    @staticmethod
    def _default_order(items: list) -> list:
        """Queued runs first, in the order they will start; then newest first (ids start with
        the UTC time), new runs on top."""
        queued = [i for i in items if isinstance(i, RunRow) and i.status == "queued" and i.queue_position]
        rest = [i for i in items if not (isinstance(i, RunRow) and i.status == "queued" and i.queue_position)]
        queued.sort(key=lambda r: r.queue_position)
        rest.sort(key=lambda i: i.newest if isinstance(i, GroupRow) else i.id, reverse=True)
        return queued + rest

    def _sorted(self, items: list, now: float, default: Callable[[list], list]) -> list:
        if not self.sort_key:
            return default(items)
        run_key = SORT_KEYS[self.sort_key]
        group_key = GROUP_SORT_KEYS.get(self.sort_key, lambda g, now: None)

        def key(item):
            return group_key(item, now) if isinstance(item, GroupRow) else run_key(item, now)

        present = [i for i in items if key(i) is not None]
        missing = [i for i in items if key(i) is None]
        present.sort(key=key, reverse=self.sort_reverse)
        return present + missing  # blanks last in both directions

    def group_of(self, row_id: str | None) -> GroupRow | None:
        """The sweep of a table line: a group row itself, or a run of a sweep."""
        if row_id is None:
            return None
        self.visible  # noqa: B018 (builds self.groups)
        if row_id in self.rows:
            gid = self.rows[row_id].group_id
            return self.groups.get(gid) if gid else None
        return next((g for g in self.groups.values() if g.id == row_id), None)

    def sort_by(self, key: str | None, reverse: bool | None = None) -> None:
        if reverse is None:
            reverse = (not self.sort_reverse) if key == self.sort_key else False
        self.sort_key, self.sort_reverse = key, reverse
        self._visible = None

    def toggle_mark(self, run_id: str) -> None:
        group = self.group_of(run_id) if run_id not in self.rows else None
        if group is not None:  # a sweep's row marks (or unmarks) all its runs
            ids = [r.id for r in group.runs]
            if all(i in self.marked for i in ids):
                self.marked = [i for i in self.marked if i not in ids]
            else:
                self.marked += [i for i in ids if i not in self.marked]
            return
        if run_id in self.marked:
            self.marked.remove(run_id)
        elif run_id in self.rows:
            self.marked.append(run_id)

    def methods(self) -> list[str]:
        return sorted({r.method for r in self.rows.values() if r.method})

    def counts(self) -> dict[str, int]:
        """Runs per run.json status, and how many are flagged."""
        out: dict[str, int] = {}
        now = self.clock()
        for row in self.rows.values():
            if row.archived:
                out["archived"] = out.get("archived", 0) + 1
            out[row.status] = out.get(row.status, 0) + 1
            if row.status in ACTIVE and row.view(now).flagged:
                out[FLAGGED] = out.get(FLAGGED, 0) + 1
        return out
