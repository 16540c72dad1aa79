"""A run's metrics as growable series: what the run view's charts and status line show.

Rows come from metrics.jsonl in the order they were written. A resumed run writes steps again
from its checkpoint: a train row whose step is not past the last one cuts the series back to
before that step, so each step appears once (the latest write wins, as in core's dedupe_steps).
"""

from __future__ import annotations

import math
import os
import time
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path

import orjson

from tuiapp.core.run_folder import columns
from tuiapp.core.run_folder.columns import columns_cache, columns_path
from tuiapp.core.run_folder.metrics import (
    PREFERENCE_METRICS,
    RL_METRICS,
    JsonlReader,
    JsonlWriter,
    as_number,
    device_peak,
)
from tuiapp.core.run_folder.progress import eta_seconds
from tuiapp.core.run_folder.rundir import RunDir

_np = None  # numpy, imported on first use (it costs ~0.15 s of the app's start-up)
_np_tried = False


def numpy_module():
    """numpy when it can be imported (optional: ~50x faster on a million points), else None."""
    global _np, _np_tried
    if not _np_tried:
        _np_tried = True
        try:
            import numpy
        except ImportError:  # pragma: no cover - exercised when numpy is absent
            numpy = None
        _np = numpy
    return _np


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
        if ys and ys.count(None) == len(ys):
            return  # a metric these rows do not have (grad_norm of some methods)
        try:  # fast path: every value a finite number
            ax, ay = array("d", xs), array("d", ys)
            if len(ax) == len(ay) and _all_finite(ax) and _all_finite(ay):
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


def _all_finite(values: array) -> bool:
    np = numpy_module() if len(values) > 1000 else None
    if np is not None:
        return bool(np.isfinite(np.frombuffer(values, dtype=np.float64)).all())
    return all(map(math.isfinite, values))


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


REWARD_MEAN_PREFIX = "rewards/"  # grpo/rloo: each reward's mean per step is rewards/NAME/mean
TRAIN_SERIES = ("loss", "lr", "tokens_per_s", "grad_norm", "samples_per_s", *PREFERENCE_METRICS, *RL_METRICS)


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

    def _add_reward_series(self, rows: list[dict]) -> None:
        """An online RL run's reward means (rewards/NAME/mean) get series of their own: the task's
        reward is charted and summarised, not only the total (TRL logs the same keys every step,
        so a batch's first and last rows name them)."""
        for row in rows:
            for key in row:
                if key.startswith(REWARD_MEAN_PREFIX) and key.endswith("/mean") and key not in self.series:
                    self.series[key] = Series()

    def _extend_columns(self, records: list[dict]) -> bool:
        """Many rows at once, a column per metric (a whole metrics.jsonl of 100,000 rows in
        ~0.1 s). Only when the train steps are integers that only grow (no resume to cut back
        to); False leaves the rows to the row-by-row path."""
        has_split = any("split" in r for r in records)  # eval rows (or train rows that say so)
        if has_split:
            train = [r for r in records if r.get("split", "train") == "train" and "step" in r]
        else:
            train = [r for r in records if "step" in r]
        steps = [r["step"] for r in train]
        if not set(map(type, steps)) <= {int} or len(set(steps)) != len(steps) or steps != sorted(steps):
            return False
        if steps and self.steps and steps[0] <= self.steps[-1]:
            return False
        self.records += len(records)
        self._add_reward_series(train[:1] + train[-1:])
        self.steps.extend(steps)
        self.tokens.extend(_column(train, "tokens"))
        self.times.extend(_column(train, "time"))
        for key, series in self.series.items():
            values = list(map(dict.get, train, repeat(key)))  # C speed: no Python frame per row
            if key == "loss" and str in set(map(type, values)):
                self.nonfinite_loss = self.nonfinite_loss or any(
                    (n := as_number(v)) is not None and not math.isfinite(n) for v in values)
            series.extend(steps, values)
        mems = list(map(dict.get, train, repeat("mem")))
        if mems.count(None) < len(mems):
            for step, mem in zip(steps, mems, strict=True):
                for rank, device in (mem.items() if isinstance(mem, dict) else ()):
                    value = device_peak(device)
                    if value is not None:
                        self.memory.setdefault(rank, Series()).append(step, value / 1e9)
        if train:
            if self.first_time is None:
                self.first_time = as_number(train[0].get("time"))
            self.last_train = train[-1]
            self.recent = (self.recent + train[-20:])[-20:]
        for record in records if has_split else ():
            if record.get("split") == "eval":
                self._eval(record)
        return True

    def _train(self, row: dict) -> None:
        step = as_number(row.get("step"))
        if step is None:
            return
        if self.steps and step <= self.steps[-1]:
            self._cut(step)
        if "reward" in row:
            self._add_reward_series([row])
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


def _column(rows: list[dict], key: str) -> array:
    """One key of every row as floats (NaN where a row has no number)."""
    values = list(map(dict.get, rows, repeat(key)))
    try:
        return array("d", values)
    except TypeError:  # None or a string somewhere
        return array("d", [v if type(v) is float else float(v) if type(v) is int else math.nan for v in values])


# ------------------------------------------------------------------ columns kept beside the runs

COLUMNS_MIN_RECORDS = 10_000  # the TUI caches columns once it has parsed this many rows at once
SUMMARISE_MIN_BYTES = 1 << 20  # a metrics.jsonl under ~10,000 rows parses in milliseconds anyway


def summarise_run(run_dir: Path) -> None:
    """Make sure a finished run's metrics can be read in columns (the supervisor calls this once
    the run's outcome is recorded): a run whose trainer kept metrics.columns to its end needs
    nothing; another's (an older llmtui's, one killed before its last snapshot) get the TUI's
    cache, so the compare screen's first open of it reads columns instead of parsing JSON."""
    metrics_path = RunDir(run_dir).metrics
    try:
        if metrics_path.stat().st_size >= SUMMARISE_MIN_BYTES:
            read_run_data(metrics_path, columns_cache(run_dir))
    except Exception:  # a cache: it never decides a run's outcome
        pass


def needs_columns(run_dir: Path) -> bool:
    """Whether a first read of the run's metrics would parse a long metrics.jsonl whole: it is
    over SUMMARISE_MIN_BYTES and neither the trainer's metrics.columns nor the TUI's cache holds
    for it (an older llmtui's run, a deleted cache). Cheap: stats and the snapshots' headers."""
    metrics_path = RunDir(run_dir).metrics
    try:
        if metrics_path.stat().st_size < SUMMARISE_MIN_BYTES:
            return False
    except OSError:
        return False
    return not (columns.holds(columns_path(run_dir), metrics_path) or columns.holds(columns_cache(run_dir), metrics_path))


def build_columns(run_dir: Path) -> bool:
    """Parse a run's metrics.jsonl once and leave its columns in the TUI's cache (for a worker
    process: the UI then loads them in milliseconds); whether a snapshot holds afterwards."""
    metrics_path = RunDir(run_dir).metrics
    try:
        data, reader = read_run_data(metrics_path)
        save_columns(data, metrics_path, reader.offset - len(reader._partial), columns_cache(run_dir))
    except Exception:  # a cache: the reader parses metrics.jsonl itself when there is none
        return False
    return columns.holds(columns_cache(run_dir), metrics_path)


def read_run_data(metrics_path: Path, cache_path: Path | None = None) -> tuple[RunData, JsonlReader]:
    """A run's metrics as RunData, and the reader to follow the file from where it stopped.

    The rows the run's own columns hold (metrics.columns, kept by the trainer as it writes) are
    loaded in milliseconds, and only the lines written since are parsed; without them (or when
    they do not hold for metrics.jsonl as it is now), the TUI's cache at `cache_path` is tried,
    and else the file is read whole. A read that had to parse COLUMNS_MIN_RECORDS rows or more
    leaves its columns at `cache_path` for the next one."""
    data = reader = None
    for path in (columns_path(metrics_path.parent), cache_path):
        loaded = _load_columns(metrics_path, path) if path is not None else None
        if loaded is not None:
            data, reader = loaded
            break
    if data is None or reader is None:
        data, reader = RunData(), JsonlReader(metrics_path)
    before = data.records
    data.extend(reader.read_new())
    if cache_path is not None and data.records - before >= COLUMNS_MIN_RECORDS:
        save_columns(data, metrics_path, reader.offset - len(reader._partial), cache_path)
    return data, reader


def _arrays(data: RunData) -> list[tuple[str, array]]:
    out = [("steps", data.steps), ("tokens", data.tokens), ("times", data.times),
           ("eval:x", data.eval_loss.xs), ("eval:y", data.eval_loss.ys)]
    for key, series in data.series.items():
        out += [(f"series:{key}:x", series.xs), (f"series:{key}:y", series.ys)]
    for rank, series in data.memory.items():
        out += [(f"memory:{rank}:x", series.xs), (f"memory:{rank}:y", series.ys)]
    return out


def save_columns(data: RunData, metrics_path: Path, covered: int, path: Path) -> bool:
    """A snapshot of `data`, which holds metrics.jsonl's rows up to byte `covered`, at `path`."""
    header = {
        "records": data.records, "first_time": data.first_time, "last_train": data.last_train,
        "recent": data.recent, "last_eval": data.last_eval, "samples": data.samples, "samples_step": data.samples_step,
        "evals": data.evals, "eval_records": data.eval_records, "nonfinite_loss": data.nonfinite_loss,
    }
    return columns.save(path, metrics_path, covered, header, _arrays(data))


def _load_columns(metrics_path: Path, path: Path) -> tuple[RunData, JsonlReader] | None:
    loaded = columns.load(path, metrics_path)
    if loaded is None:
        return None
    header, arrays, inode = loaded
    data = RunData()
    try:
        data.steps, data.tokens, data.times = arrays["steps"], arrays["tokens"], arrays["times"]
        if not len(data.steps) == len(data.tokens) == len(data.times):
            return None
        _fill(data.eval_loss, arrays["eval:x"], arrays["eval:y"])
        for key, series in data.series.items():
            _fill(series, arrays.get(f"series:{key}:x", array("d")), arrays.get(f"series:{key}:y", array("d")))
        for name in arrays:  # the series a run added as it went (its reward means)
            key = name[len("series:") : -2]
            if name.startswith("series:") and name.endswith(":x") and key not in data.series:
                data.series[key] = _fill(Series(), arrays[name], arrays[f"series:{key}:y"])
        for name in arrays:
            if name.startswith("memory:") and name.endswith(":x"):
                rank = name[len("memory:") : -2]
                data.memory[rank] = _fill(Series(), arrays[name], arrays[f"memory:{rank}:y"])
        data.records, data.first_time, data.last_train = header["records"], header["first_time"], header["last_train"]
        data.recent, data.last_eval, data.samples = header["recent"], header["last_eval"], header["samples"]
        data.samples_step, data.nonfinite_loss = header["samples_step"], header["nonfinite_loss"]
        data.evals = [(step, samples) for step, samples in header["evals"]]
        data.eval_records = header["eval_records"]
    except (KeyError, TypeError, ValueError):
        return None
    reader = JsonlReader(metrics_path)
    reader.offset, reader._inode = header["covered"], inode
    return data, reader


def _fill(series: Series, xs: array, ys: array) -> Series:
    if len(xs) != len(ys):
        raise ValueError("columns of different lengths")
    series.xs, series.ys = xs, ys
    series.version += 1 if len(ys) else 0
    return series


# ------------------------------------------------------------------ the trainer's writer


class MetricsWriter(JsonlWriter):
    """metrics.jsonl's writer (rank 0 of a run) that keeps the run's columns (metrics.columns)
    current, so no reader ever parses a long run's JSON lines: the rows are also added to a
    RunData, and a snapshot of it replaces the file once the rows not in it reach
    max(every_rows, a 16th of all), after every_s seconds with rows not in it, and at close.
    A reader parses at most that many lines; the snapshots of a run of N rows write ~16 x its
    final columns in all (a few hundred MB over 100,000 rows), each in milliseconds.

    Opened on a run that has rows already (a resume), it starts from them: from its columns
    when they hold, else by reading metrics.jsonl once."""

    def __init__(self, run_dir: Path, every_rows: int = 1000, every_s: float = 30.0):
        super().__init__(RunDir(run_dir).metrics)
        self.columns = columns_path(run_dir)
        self.every_rows, self.every_s = every_rows, every_s
        if self._file.tell():
            with open(self.path, "rb") as handle:
                handle.seek(-1, os.SEEK_END)
                cut = handle.read(1) != b"\n"
            if cut:  # a line cut by a crash stays one unreadable line, apart from the next
                self._file.write(b"\n")
                self._file.flush()
        self.data, _ = read_run_data(self.path)
        self._pending: list[dict] = []
        self._saved = 0  # rows in the last snapshot this writer made
        self._saved_at = time.monotonic()

    def write(self, record: dict) -> None:
        line = self.encode(record)
        self._file.write(line)
        self._file.flush()
        self._pending.append(orjson.loads(line))  # the row as readers will see it
        unsaved = self.data.records + len(self._pending) - self._saved
        if unsaved >= max(self.every_rows, self.data.records // 16) or time.monotonic() - self._saved_at >= self.every_s:
            self.save()

    def save(self) -> None:
        """Replace the run's columns with a snapshot of every row written so far."""
        self.data.extend(self._pending)
        self._pending = []
        if self.data.records != self._saved:
            save_columns(self.data, self.path, self._file.tell(), self.columns)
            self._saved = self.data.records
        self._saved_at = time.monotonic()

    def close(self) -> None:
        if not self._file.closed:
            self.save()
        super().close()
