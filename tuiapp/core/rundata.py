"""A run's metrics as growable series: what the run view's charts and status line show.

Rows come from metrics.jsonl in the order they were written. A resumed run writes steps again
from its checkpoint: a train row whose step is not past the last one cuts the series back to
before that step, so each step appears once (the latest write wins, as in core's dedupe_steps).
"""

from __future__ import annotations

import math
import os
import sys
from array import array
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path

import orjson

from tuiapp.core.metrics import PREFERENCE_METRICS, RL_METRICS, JsonlReader, as_number, device_peak
from tuiapp.core.progress import eta_seconds

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
    cached_offset: int = -1  # how much of metrics.jsonl the columns cache holds (read_run_data)

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


# ------------------------------------------------------------------ columns cached beside the runs

COLUMNS_VERSION = 2  # 2: the RL series
COLUMNS_MIN_RECORDS = 10_000  # smaller files parse in a few ms: not worth a cache file
_TAIL = 64  # bytes before the cached offset that must still be there for the cache to hold


def columns_cache(run_dir: Path) -> Path:
    """Where a run's metrics are kept in columns: runs/.cache/columns/<id>.bin (a dot folder:
    never taken for a run)."""
    return run_dir.parent / ".cache" / "columns" / f"{run_dir.name}.bin"


SUMMARISE_MIN_BYTES = 1 << 20  # a metrics.jsonl under ~10,000 rows parses in milliseconds anyway


def summarise_run(run_dir: Path) -> None:
    """Write a finished run's columns cache (the supervisor does, once the run's outcome is
    recorded), so the compare screen's first open of it reads columns instead of parsing JSON."""
    metrics_path = run_dir / "metrics.jsonl"
    try:
        if metrics_path.stat().st_size >= SUMMARISE_MIN_BYTES:
            read_run_data(metrics_path, columns_cache(run_dir))
    except Exception:  # a cache: it never decides a run's outcome
        pass


def read_run_data(metrics_path: Path, cache_path: Path | None = None) -> tuple[RunData, JsonlReader]:
    """A run's metrics as RunData, and the reader to follow the file from where it stopped.

    With `cache_path`, the columns of the rows already read are kept there (a binary file of
    arrays and a JSON header): the next read loads them in milliseconds and parses only the
    lines written since. The cache holds while metrics.jsonl is the same file (inode) and still
    has the bytes it was made from (the file only grows); else the file is read whole again."""
    cached = _load_columns(metrics_path, cache_path) if cache_path is not None else None
    if cached is not None:
        data, reader = cached
        data.extend(reader.read_new())
    else:
        reader = JsonlReader(metrics_path)
        data = RunData()
        data.extend(reader.read_all())
    covered = reader.offset - len(reader._partial)
    if cache_path is not None and data.records >= COLUMNS_MIN_RECORDS and covered != data.cached_offset:
        _save_columns(data, metrics_path, covered, cache_path)
    return data, reader


def _arrays(data: RunData) -> list[tuple[str, array]]:
    out = [("steps", data.steps), ("tokens", data.tokens), ("times", data.times),
           ("eval:x", data.eval_loss.xs), ("eval:y", data.eval_loss.ys)]
    for key, series in data.series.items():
        out += [(f"series:{key}:x", series.xs), (f"series:{key}:y", series.ys)]
    for rank, series in data.memory.items():
        out += [(f"memory:{rank}:x", series.xs), (f"memory:{rank}:y", series.ys)]
    return out


def _save_columns(data: RunData, metrics_path: Path, covered: int, cache_path: Path) -> None:
    try:
        stat = metrics_path.stat()
        with open(metrics_path, "rb") as handle:
            handle.seek(max(0, covered - _TAIL))
            tail = handle.read(min(covered, _TAIL))
        arrays = _arrays(data)
        header = orjson.dumps({
            "version": COLUMNS_VERSION, "byteorder": sys.byteorder, "inode": stat.st_ino, "covered": covered,
            "tail": tail.hex(), "records": data.records, "first_time": data.first_time, "last_train": data.last_train,
            "recent": data.recent, "last_eval": data.last_eval, "samples": data.samples, "samples_step": data.samples_step,
            "evals": data.evals, "eval_records": data.eval_records, "nonfinite_loss": data.nonfinite_loss,
            "arrays": [[name, len(values)] for name, values in arrays],
        }, option=orjson.OPT_SERIALIZE_NUMPY)
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_name(f".{cache_path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as handle:
            handle.write(len(header).to_bytes(8, "little"))
            handle.write(header)
            for _, values in arrays:
                values.tofile(handle)
        os.replace(tmp, cache_path)
        data.cached_offset = covered
    except (OSError, TypeError, ValueError):
        pass  # a read-only runs folder, or odd values: the next read parses the file again


def _load_columns(metrics_path: Path, cache_path: Path) -> tuple[RunData, JsonlReader] | None:
    try:
        raw = cache_path.read_bytes()
        size = int.from_bytes(raw[:8], "little")
        header = orjson.loads(raw[8 : 8 + size])
        stat = metrics_path.stat()
        covered = header["covered"]
        if (header.get("version") != COLUMNS_VERSION or header.get("byteorder") != sys.byteorder
                or header["inode"] != stat.st_ino or stat.st_size < covered):
            return None
        with open(metrics_path, "rb") as handle:
            handle.seek(max(0, covered - _TAIL))
            if handle.read(min(covered, _TAIL)).hex() != header["tail"]:
                return None
        data = RunData()
        offset = 8 + size
        columns: dict[str, array] = {}
        view = memoryview(raw)  # slices without copies: each column is copied once, into its array
        for name, count in header["arrays"]:
            values = array("d")
            values.frombytes(view[offset : offset + count * 8])
            offset += count * 8
            columns[name] = values
        data.steps, data.tokens, data.times = columns["steps"], columns["tokens"], columns["times"]
        _fill(data.eval_loss, columns["eval:x"], columns["eval:y"])
        for key, series in data.series.items():
            _fill(series, columns.get(f"series:{key}:x", array("d")), columns.get(f"series:{key}:y", array("d")))
        for name in columns:
            if name.startswith("memory:") and name.endswith(":x"):
                rank = name[len("memory:") : -2]
                data.memory[rank] = _fill(Series(), columns[name], columns[f"memory:{rank}:y"])
        data.records, data.first_time, data.last_train = header["records"], header["first_time"], header["last_train"]
        data.recent, data.last_eval, data.samples = header["recent"], header["last_eval"], header["samples"]
        data.samples_step, data.nonfinite_loss = header["samples_step"], header["nonfinite_loss"]
        data.evals = [(step, samples) for step, samples in header["evals"]]
        data.eval_records = header["eval_records"]
        data.cached_offset = covered
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    reader = JsonlReader(metrics_path)
    reader.offset, reader._inode = covered, stat.st_ino
    return data, reader


def _fill(series: Series, xs: array, ys: array) -> Series:
    if len(xs) != len(ys):
        raise ValueError("columns of different lengths")
    series.xs, series.ys = xs, ys
    series.version += 1 if len(ys) else 0
    return series
