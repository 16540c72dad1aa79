"""The history table's model: every RunRow, and the filtered, sorted list the table shows."""

from __future__ import annotations

from typing import Callable

from tuiapp.core.rundir import ACTIVE
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
    "last_loss": lambda r, now: r.last_loss,
    "tokens_per_s": lambda r, now: r.tokens_per_s,
    "peak_mem": lambda r, now: r.peak_mem,
    "duration": lambda r, now: r.duration(now),
    "started": lambda r, now: r.started or r.created,
    "spark": lambda r, now: r.last_loss,
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
        self._visible: list[RunRow] | None = None

    def add(self, rows: list[RunRow]) -> None:
        for row in rows:
            self.rows[row.id] = row
        self._visible = None

    def update(self, rows: list[RunRow]) -> None:
        self.add(rows)

    def invalidate(self) -> None:
        self._visible = None

    def accepts(self, row: RunRow, now: float) -> bool:
        wanted = self.status_filter
        if wanted and row.status != wanted:  # a run.json status, else what is shown (a flag)
            view = row.view(now)
            if not (view.flagged if wanted == FLAGGED else view.key == wanted):
                return False
        if self.method_filter and row.method != self.method_filter:
            return False
        return not self.text_filter or row.matches(self.text_filter)

    @property
    def visible(self) -> list[RunRow]:
        if self._visible is None:
            now = self.clock()
            # default order: newest first (ids start with the UTC time), new runs on top
            rows = [self.rows[i] for i in sorted(self.rows, reverse=True) if self.accepts(self.rows[i], now)]
            if self.sort_key:
                key = SORT_KEYS[self.sort_key]
                present = [r for r in rows if key(r, now) is not None]
                missing = [r for r in rows if key(r, now) is None]
                present.sort(key=lambda r: key(r, now), reverse=self.sort_reverse)
                rows = present + missing  # blanks last in both directions
            self._visible = rows
        return self._visible

    def sort_by(self, key: str | None, reverse: bool | None = None) -> None:
        if reverse is None:
            reverse = (not self.sort_reverse) if key == self.sort_key else False
        self.sort_key, self.sort_reverse = key, reverse
        self._visible = None

    def toggle_mark(self, run_id: str) -> None:
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
            out[row.status] = out.get(row.status, 0) + 1
            if row.status in ACTIVE and row.view(now).flagged:
                out[FLAGGED] = out.get(FLAGGED, 0) + 1
        return out
