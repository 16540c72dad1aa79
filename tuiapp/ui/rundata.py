"""A run's metrics as growable series: what the run view's charts and status line show.

Rows come from metrics.jsonl in the order they were written. A resumed run writes steps again
from its checkpoint: a train row whose step is not past the last one cuts the series back to
before that step, so each step appears once (the latest write wins, as in core's dedupe_steps).
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field

from tuiapp.core.metrics import PREFERENCE_METRICS, as_number, device_peak
from tuiapp.core.progress import eta_seconds


class Series:
    """x/y pairs in two arrays of doubles (compact; numpy reads them without a copy)."""

    __slots__ = ("xs", "ys", "version")

    def __init__(self) -> None:
        self.xs = array("d")
        self.ys = array("d")
        self.version = 0  # bumped on every change: charts cache their downsampled copy by it

    def __len__(self) -> int:
        return len(self.ys)

    def append(self, x: float | None, y: float | None) -> None:
        if x is None or y is None or not math.isfinite(y) or not math.isfinite(x):
            return  # NaN/inf cannot be drawn; the status line reports a non-finite loss
        self.xs.append(x)
        self.ys.append(y)
        self.version += 1

    def extend(self, xs: list, ys: list) -> None:
        """Append many points at once (non-numeric and non-finite ones are skipped)."""
        if ys and all(y is None for y in ys):
            return  # a metric these rows do not have (grad_norm of some methods)
        try:  # fast path: every value a finite number
            ax, ay = array("d", xs), array("d", ys)
            if len(ax) == len(ay) and all(map(math.isfinite, ax)) and all(map(math.isfinite, ay)):
                if ax:
                    self.xs.extend(ax)
                    self.ys.extend(ay)
                    self.version += 1
                return
        except TypeError:
            pass
        pairs = [(x, y) for x, y in zip(xs, ys, strict=False) if _finite(x) and _finite(y)]
        if pairs:
            self.xs.extend(float(x) for x, _ in pairs)
            self.ys.extend(float(y) for _, y in pairs)
            self.version += 1

    def truncate_from(self, x: float) -> None:
        """Drop every point at or after x (xs must be increasing)."""
        cut = bisect_left(self.xs, x)
        if cut < len(self.xs):
            del self.xs[cut:]
            del self.ys[cut:]
            self.version += 1

    def last(self) -> float | None:
        return self.ys[-1] if self.ys else None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


TRAIN_SERIES = ("loss", "lr", "tokens_per_s", "grad_norm", "samples_per_s", *PREFERENCE_METRICS)


@dataclass
class RunData:
    """Everything the run view draws, built from metrics records as they arrive."""

    series: dict[str, Series] = field(default_factory=lambda: {k: Series() for k in TRAIN_SERIES})
    eval_loss: Series = field(default_factory=Series)
    memory: dict[str, Series] = field(default_factory=dict)  # "rank0" -> GB by step
    steps: array = field(default_factory=lambda: array("d"))
    tokens: array = field(default_factory=lambda: array("d"))  # per step (NaN when not written)
    times: array = field(default_factory=lambda: array("d"))  # per step, unix seconds (or NaN)
    evals: list[tuple[float, list[dict]]] = field(default_factory=list)  # every eval's (step, samples)
    eval_records: list[dict] = field(default_factory=list)  # every eval row
    last_train: dict = field(default_factory=dict)
    first_time: float | None = None
    recent: list[dict] = field(default_factory=list)  # last train rows, for the ETA
    last_eval: dict = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)
    samples_step: float | None = None
    nonfinite_loss: bool = False
    records: int = 0

    @property
    def loss(self) -> Series:
        return self.series["loss"]

    def extend(self, records: list[dict]) -> None:
        if len(records) > 32 and self._extend_columns(records):
            return
        for record in records:
            self.records += 1
            if record.get("split") == "eval":
                self._eval(record)
            elif record.get("split", "train") == "train" and "step" in record:
                self._train(record)

    def _extend_columns(self, records: list[dict]) -> bool:
        """Many rows at once, a column per metric (a whole metrics.jsonl of 100,000 rows in
        ~0.1 s). Only when the train steps are integers that only grow (no resume to cut back
        to); False leaves the rows to the row-by-row path."""
        train = [r for r in records if r.get("split", "train") == "train" and "step" in r]
        steps = [r["step"] for r in train]
        if not all(type(s) is int for s in steps) or any(a >= b for a, b in zip(steps, steps[1:], strict=False)):
            return False
        if steps and self.steps and steps[0] <= self.steps[-1]:
            return False
        self.records += len(records)
        self.steps.extend(steps)
        self.tokens.extend(_column(train, "tokens"))
        self.times.extend(_column(train, "time"))
        present: set = set()
        for row in train:
            present.update(row)
        for key, series in self.series.items():
            if key not in present:
                continue
            values = [r.get(key) for r in train]
            if key == "loss" and any(type(v) is str for v in values):
                self.nonfinite_loss = self.nonfinite_loss or any(
                    (n := as_number(v)) is not None and not math.isfinite(n) for v in values)
            series.extend(steps, values)
        for row in train:
            mem = row.get("mem")
            for rank, device in (mem.items() if isinstance(mem, dict) else ()):
                value = device_peak(device)
                if value is not None:
                    self.memory.setdefault(rank, Series()).append(row["step"], value / 1e9)
        if train:
            if self.first_time is None:
                self.first_time = as_number(train[0].get("time"))
            self.last_train = train[-1]
            self.recent = (self.recent + train[-20:])[-20:]
        for record in records:
            if record.get("split") == "eval":
                self._eval(record)
        return True

    def _train(self, row: dict) -> None:
        step = as_number(row.get("step"))
        if step is None:
            return
        if self.steps and step <= self.steps[-1]:
            self._cut(step)
        self.steps.append(step)
        self.tokens.append(_float_or_nan(row.get("tokens")))
        self.times.append(_float_or_nan(row.get("time")))
        for key, series in self.series.items():
            value = as_number(row.get(key))
            if key == "loss" and value is not None and not math.isfinite(value):
                self.nonfinite_loss = True
            series.append(step, value)
        mem = row.get("mem")
        for rank, device in (mem.items() if isinstance(mem, dict) else ()):
            value = device_peak(device)  # the rule of core's peak_memory
            if value is not None:
                self.memory.setdefault(rank, Series()).append(step, value / 1e9)
        if self.first_time is None:
            self.first_time = as_number(row.get("time"))
        self.last_train = row
        self.recent.append(row)
        del self.recent[:-20]

    def _cut(self, step: float) -> None:
        cut = bisect_left(self.steps, step)
        del self.steps[cut:]
        del self.tokens[cut:]
        del self.times[cut:]
        self.evals = [e for e in self.evals if e[0] < step]
        self.eval_records = [r for r in self.eval_records if (as_number(r.get("step")) or 0) < step]
        for series in (*self.series.values(), *self.memory.values(), self.eval_loss):
            series.truncate_from(step)
        self.recent = [r for r in self.recent if (as_number(r.get("step")) or 0) < step]

    def _eval(self, row: dict) -> None:
        step = as_number(row.get("step"))
        if step is None:
            return
        if len(self.eval_loss) and step <= self.eval_loss.xs[-1]:
            self.eval_loss.truncate_from(step)
        self.eval_loss.append(step, as_number(row.get("eval_loss")))
        self.last_eval = row
        if self.evals and step <= self.evals[-1][0]:
            self.evals = [e for e in self.evals if e[0] < step]
        if self.eval_records and step <= (as_number(self.eval_records[-1].get("step")) or 0):
            self.eval_records = [r for r in self.eval_records if (as_number(r.get("step")) or 0) < step]
        self.eval_records.append(row)
        if isinstance(row.get("samples"), list) and row["samples"]:
            self.samples = [s for s in row["samples"] if isinstance(s, dict)]
            self.samples_step = step
            self.evals.append((step, self.samples))

    def best_eval(self) -> float | None:
        return min(self.eval_loss.ys) if len(self.eval_loss) else None

    def eta_seconds(self) -> float | None:
        """Seconds left: core's ETA (the CLI's) over the recent train rows."""
        return eta_seconds(self.recent)


def _float_or_nan(value) -> float:
    return float(value) if type(value) in (int, float) else math.nan


def _column(rows: list[dict], key: str) -> list[float]:
    """One key of every row as floats (NaN where a row has no number)."""
    return [v if type(v) is float else float(v) if type(v) is int else math.nan for v in (r.get(key) for r in rows)]
