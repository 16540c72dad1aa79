"""Comparing runs as data: their curves on a chosen x axis, smoothing, the ranges and ticks of a
chart, the value each run has at a cursor, and the keys of their frozen recipes that differ.
Pure functions; the compare screen calls `load_compare_run` in a worker.
"""

from __future__ import annotations

import math
import os
import statistics
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import tomllib
from rich.cells import cell_len

from tuiapp.core.common.methods import is_rl
from tuiapp.core.run_folder import benchmarks, evals, provenance
from tuiapp.core.run_folder.metrics import JsonlReader, as_number, preference_best
from tuiapp.core.run_folder.rundata import RunData, Series, columns_cache, read_run_data
from tuiapp.core.run_folder.runstate import STALL_WINDOW
from tuiapp.core.store import meta
from tuiapp.core.store.runs import Run
from tuiapp.ui.downsample import numpy_module
from tuiapp.ui.groups import compare_labels
from tuiapp.ui.history import RunRow, bench_summary, eval_loss_of, held_out_reward, row_from_record
from tuiapp.ui.primary_reward import TOTAL_KEY

# metric id -> (title, where it lives)
METRICS = {
    "loss": ("Loss", "train"),
    "eval_loss": ("Eval loss", "eval"),
    "lr": ("Learning rate", "train"),
    "tokens_per_s": ("Tokens/s", "train"),
    "grad_norm": ("Grad norm", "train"),
}
# preference runs (dpo, simpo, cpo, orpo, kto, reward): charts shown when a compared run has them
PREFERENCE_CHARTS = {
    "rewards/margins": ("Reward margin", "train"),
    "rewards/accuracies": ("Reward accuracy", "train"),
}
# online RL runs (grpo, rloo): the reward curve, shown when a compared run is one
RL_CHARTS = {"task_reward": ("Task reward", "train"), "reward": ("Total reward", "train")}
"""The task's reward (primary_reward: the reward marked primary, else the answer reward) beside the weighted
total, which a format reward a degenerate completion satisfies can lift alone."""
# grpo/rloo runs compared alone: in place of the eval loss (TRL's, which says nothing about the task), the
# task's reward on the held-out prompts at each evaluation (eval_<the task reward's key>; RunRow.held_out)
HELD_OUT_CHART = ("held_out", ("Held-out reward", "eval"))
# distill runs: the KL to the teacher, shown when a compared run is one
DISTILL_CHARTS = {"kl": ("KL to teacher", "train")}
# runs with [[eval.benchmarks]]: the first task's main metric at each evaluation (bench/<task>/<metric>)
BENCH_CHARTS = {"bench": ("Benchmark", "eval")}
# spiky metrics: their y range comes from percentiles, so one spike does not set the axis
ROBUST_METRICS = ("tokens_per_s", "grad_norm")
AXES = ("step", "tokens", "time", "relative")
AXIS_LABELS = {"step": "step", "tokens": "tokens", "time": "wall time", "relative": "% of run"}
SMOOTHING = (0.0, 0.3, 0.6, 0.8, 0.9, 0.95, 0.99)  # EMA weights the s / S keys step through
# one glyph and one colour per run, in the order the runs were picked
MARKERS = ("•", "x", "+", "o", "*", "#", "@", "%", "&", "=")
COLORS = ("cyan", "orange", "green", "magenta", "yellow", "red", "blue", "white", "gray", "cyan+")
CLIP_RATIO = 2.0  # the longest run is clipped from the default range when over 2x the next


def chart_id(metric: str) -> str:
    return metric.replace("/", "-").replace("_", "-")


@dataclass
class CompareRun:
    id: str
    row: RunRow
    recipe: dict
    data: RunData = field(default_factory=RunData)
    label: str = ""
    path: Path | None = None
    reader: JsonlReader | None = None  # where live updates go on reading
    hidden: bool = False
    marker: str = MARKERS[0]
    color: str = COLORS[0]

    def metric(self, metric: str) -> Series:
        """A metric's series by step."""
        if metric == "bench":
            return bench_series(self.data)
        if metric == "task_reward":
            task = self.data.series.get(self.row.reward_key)  # the history's choice (primary_reward)
            return task if task is not None else self.data.series[TOTAL_KEY]
        if metric == "held_out":
            return eval_series(self.data, "eval_" + self.row.reward_key)
        if metric == "eval_loss":  # a grpo/rloo run's says nothing about its task: not charted
            return Series() if is_rl(self.row.method) else self.data.eval_loss
        return self.data.series[metric]


def bench_key(data: RunData) -> str | None:
    """The bench/<task>/<metric> a run's Benchmark chart draws: its first task's main metric."""
    found = benchmarks.latest_scores(data.eval_records)
    for task, metrics in found.items():
        name = benchmarks.main_metric(metrics)
        if name:
            return f"{benchmarks.PREFIX}{task}/{name}"
    return None


def bench_series(data: RunData) -> Series:
    series = Series()
    key = bench_key(data)
    for step, value in benchmarks.curves(data.eval_records).get(key, []) if key else []:
        series.append(step, value)
    return series


def eval_series(data: RunData, key: str) -> Series:
    """An eval rows' metric by step (rows without it skipped)."""
    series = Series()
    for record in data.eval_records:
        series.append(as_number(record.get("step")), as_number(record.get(key)))
    return series


def has_benchmarks(recipe: dict | None) -> bool:
    """Whether a run's recipe (run.json's copy) scores benchmarks while training."""
    return bool(((recipe or {}).get("eval") or {}).get("benchmarks"))


def load_compare_run(path: Path) -> CompareRun:
    """Everything the compare screen shows of one run: metrics.jsonl read once, in columns."""
    run = Run(path).load()
    data, reader = read_run_data(run.metrics_path, columns_cache(path))
    row = row_from_record(path, run.record, meta.read_meta(path))
    return CompareRun(path.name, summary_row(row, data), with_provenance(read_frozen_recipe(run), path), data,
                      path=path, reader=reader)


def with_provenance(recipe: dict, path: Path) -> dict:
    """The recipe and, under `provenance`, where and with what the run was made (versions,
    machine, data fingerprint): a changed package version is a differing key of the config diff."""
    made = provenance.environment(provenance.read(path))
    return {**recipe, "provenance": made} if made else recipe


def prune_columns_cache(runs_root: Path) -> int:
    """Remove the cached columns of runs whose folder is gone (deleted, moved to the trash);
    how many files went."""
    removed = 0
    folder = runs_root / ".cache" / "columns"
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.name.endswith(".bin")]
    except OSError:
        return 0
    for name in names:
        if not (runs_root / name[: -len(".bin")]).is_dir():
            try:
                (folder / name).unlink()
                removed += 1
            except OSError:
                pass
    return removed


def summary_row(row: RunRow, data: RunData) -> RunRow:
    """The row with the summary figures of the run's metrics (those of history.with_metrics)."""
    last = data.last_train
    speed = median_low(data.series["tokens_per_s"].ys)
    peaks = [max(s.ys) for s in data.memory.values() if len(s)]
    evaluated = evals.latest(row.path) if row.path else None
    best = {"best_accuracy": None, "best_margin": None}
    if len(data.series["rewards/accuracies"]) or len(data.series["rewards/margins"]):
        train = [{"rewards/accuracies": a} for a in data.series["rewards/accuracies"].ys]
        train += [{"rewards/margins": m} for m in data.series["rewards/margins"].ys]
        best = preference_best(train, data.eval_records)
    return replace(
        row,
        step=data.steps[-1] if data.steps else None,
        max_steps=_number(last.get("max_steps")),
        last_loss=data.loss.last(),
        best_eval_loss=eval_loss_of(row, data.best_eval()),  # None for grpo/rloo: their held-out reward instead
        held_out=held_out_reward(row, data.eval_records),
        eval_ppl=evals.number(evaluated, "tuned", "perplexity"),
        eval_base_ppl=evals.number(evaluated, "base", "perplexity"),
        tokens_per_s=speed,
        peak_mem=max(peaks) * 1e9 if peaks else None,
        last_time=_number(last.get("time")),
        step_times=[t for t in data.times[-STALL_WINDOW:] if not math.isnan(t)],  # the stall check, as in the history
        bench=bench_summary(row.path, data.eval_records),
        summarized=True,
        **best,
    )


def median_low(values: array) -> float | None:
    """statistics.median_low of an array of doubles; numpy's partition when it can (100,000
    tokens/s values of a long run: ~1 ms instead of ~25 ms)."""
    if not len(values):
        return None
    np = numpy_module()
    if np is None:
        return statistics.median_low(values)
    index = (len(values) - 1) // 2
    return float(np.partition(np.frombuffer(values, dtype=np.float64), index)[index])


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_frozen_recipe(run: Run) -> dict:
    try:
        return tomllib.loads(run.dir.recipe_toml.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        recipe = run.record.recipe
        return recipe if isinstance(recipe, dict) else {}


# ------------------------------------------------------------------ x axes


def x_values(data: RunData, steps: Sequence[float], axis: str) -> Sequence[float]:
    """The x of each point given by its step: the step itself, the tokens seen at it, the wall
    time since the run's first row (seconds), or the percent of the run's last step."""
    if axis == "step":
        return steps
    if axis == "relative":
        end = data.steps[-1] if data.steps else 0.0
        return array("d", [100.0 * s / end if end else 0.0 for s in steps])
    np = numpy_module()
    if np is not None and len(steps) > 1000 and len(data.steps):  # the same lookup, vectorised
        at = np.searchsorted(np.frombuffer(data.steps, dtype=np.float64), np.asarray(steps, dtype=np.float64), side="right") - 1
        column = np.frombuffer(data.tokens if axis == "tokens" else data.times, dtype=np.float64)
        origin = 0.0
        if axis == "time":
            finite = column[np.isfinite(column)]
            origin = float(finite[0]) if len(finite) else math.nan
        values = np.where(at >= 0, column[np.maximum(at, 0)] - origin, 0.0 if axis == "tokens" else math.nan)
        return array("d", values.tobytes())
    column = data.tokens if axis == "tokens" else data.times
    origin = 0.0
    if axis == "time":
        origin = next((t for t in data.times if t == t), math.nan)
    out = []
    for step in steps:
        index = bisect_right(data.steps, step) - 1  # the last train row at or before the step
        value = column[index] - origin if index >= 0 else (0.0 if axis == "tokens" else math.nan)
        out.append(value)
    return out


def time_unit(span_s: float) -> tuple[float, str]:
    """Seconds per unit and its name for a wall-time axis spanning span_s seconds."""
    if span_s >= 3 * 3600:
        return 3600.0, "h"
    if span_s >= 3 * 60:
        return 60.0, "min"
    return 1.0, "s"


# ------------------------------------------------------------------ smoothing


def ema(values: Sequence[float], weight: float) -> Sequence[float]:
    """Debiased exponential moving average (TensorBoard's and W&B's smoothing): each point is
    the weighted mean of it and the points before, the weights decaying by `weight`; dividing
    by the weights' sum keeps the first points from being pulled towards zero."""
    if weight <= 0:
        return list(values)
    np = numpy_module()
    if np is not None and len(values) > 64:
        return _ema_numpy(np, values, weight)
    out = []
    last = 0.0
    norm = 0.0
    keep = 1.0 - weight
    for value in values:
        last = last * weight + keep * value
        norm = norm * weight + keep
        out.append(last / norm)
    return out


def _ema_numpy(np, values: Sequence[float], weight: float) -> Sequence[float]:
    """The same EMA as a log-depth scan: after the pass with shift k each point holds the
    weighted sum of the 2k points ending at it; the weights' sum is 1 - weight**(i+1)."""
    total = (1.0 - weight) * np.asarray(values, dtype=np.float64)
    shift, factor = 1, weight
    while shift < len(total) and factor > 0.0:
        total[shift:] = total[shift:] + factor * total[:-shift]
        shift, factor = shift * 2, factor * factor
    norm = 1.0 - weight ** np.arange(1, len(total) + 1, dtype=np.float64)
    return array("d", (total / norm).tobytes())


# ------------------------------------------------------------------ ranges and ticks


def default_x_range(ends: list[float]) -> tuple[float, float] | None:
    """The x range shown before any zoom: up to the end of the longest run, unless it is over
    CLIP_RATIO times the next longest; then up to the next longest's end, so that short runs
    keep the width of the chart (the longest run goes on past the right edge; zoom out with -)."""
    ends = sorted(e for e in ends if e == e)
    if not ends:
        return None
    end = ends[-1]
    if len(ends) > 1 and ends[-2] > 0 and ends[-1] > CLIP_RATIO * ends[-2]:
        end = ends[-2]
    return 0.0, end if end > 0 else 1.0


def robust_limits(values: Sequence[float], robust: bool) -> tuple[float, float] | None:
    """y limits: the lowest and highest value; with `robust`, the 2nd and 98th percentiles
    (nearest rank) so that one spike does not squash the curves. A margin of 5% either side."""
    finite = sorted(v for v in values if math.isfinite(v))
    if not finite:
        return None
    low, high = finite[0], finite[-1]
    if robust and len(finite) >= 5:
        low = finite[round(0.02 * (len(finite) - 1))]
        high = finite[round(0.98 * (len(finite) - 1))]
    if high == low:
        pad = abs(high) * 0.05 or 1.0
    else:
        pad = (high - low) * 0.05
    return low - pad, high + pad


def nice_step(span: float, count: int) -> float:
    """A tick spacing of 1, 2 or 5 times a power of ten that gives about `count` ticks."""
    if span <= 0 or count < 1:
        return 1.0
    raw = span / count
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if factor * power >= raw:
            return factor * power
    return 10 * power


def nice_ticks(low: float, high: float, count: int, integer: bool = False) -> list[float]:
    """Round tick positions inside [low, high] (whole numbers only with `integer`)."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low] if math.isfinite(low) else []
    step = nice_step(high - low, max(1, count))
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(low / step - 1e-9) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9 and len(ticks) < 50:
        ticks.append(round(value, 12))
        value += step
    return ticks


def tick_label(value: float, step: float = 0.0) -> str:
    """A tick's text: whole numbers as such (12k for 12000), others with the digits the
    spacing needs, tiny and huge ones in e-notation."""
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1e4 and value == int(value):
        for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if magnitude >= size:
                text = f"{value / size:.3g}"
                return text + suffix
    if value == int(value) and magnitude < 1e4:
        return str(int(value))
    if magnitude < 1e-3 or magnitude >= 1e6:
        return f"{value:.1e}"
    digits = max(0, -math.floor(math.log10(step))) if step > 0 else 3
    return f"{value:.{min(digits, 6)}f}"


def value_at(xs: Sequence[float], ys: Sequence[float], x: float) -> tuple[float, float] | None:
    """The point of a curve at x: the last one at or before it (None before the first)."""
    index = bisect_right(xs, x) - 1
    if index < 0 or not len(ys):
        return None
    return xs[index], ys[index]


# ------------------------------------------------------------------ labels and recipes


def label_runs(runs: list[CompareRun]) -> None:
    """Short unique labels: for runs of one sweep, the values of the keys it varies
    ('learning_rate=0.003 rank=8'); otherwise the name shown (display name, else the run's
    name), or name@id-suffix when names repeat."""
    by_values = compare_labels([run.row for run in runs])
    if by_values is not None:
        for run, label in zip(runs, by_values, strict=True):
            run.label = label
        return
    counts: dict[str, int] = {}
    for run in runs:
        counts[run.row.title] = counts.get(run.row.title, 0) + 1
    for run in runs:
        name = run.row.title
        run.label = name if counts[name] == 1 else f"{name}@{run.id[-4:]}"


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested dict: {'train': {'lr': 1}} -> {'train.lr': 1}; a list of tables by
    index, as --set and sweeps name them: dataset.sources.0.weight."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                out.update(flatten(value, path))
            elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
                for index, item in enumerate(value):
                    out.update(flatten(item, f"{path}.{index}"))
            else:
                out[path] = value
    return out


MISSING = object()


def config_rows(recipes: list[dict], only_differing: bool = True) -> list[tuple[str, list[Any]]]:
    """(key, value per run) for every recipe key, or only those whose values differ."""
    flat = [flatten(r) for r in recipes]
    keys: list[str] = []
    seen = set()
    for item in flat:
        for key in item:
            if key not in seen:
                seen.add(key)
                keys.append(key)
    rows = []
    for key in keys:
        values = [item.get(key, MISSING) for item in flat]
        if only_differing and all(v == values[0] for v in values[1:]):
            continue
        rows.append((key, values))
    return rows


def show_value(value: Any) -> str:
    if value is MISSING:
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value else '""'
    return str(value)


def abbreviate(text: str, width: int) -> str:
    """`text` in at most `width` cells: whole when it fits, else its start and its end with …
    between (both ends of a path or a model id say the most)."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…" if width == 1 else ""
    head_room = (width - 1) // 2
    tail_room = width - 1 - head_room  # the end (a file's name, a version) gets the odd cell
    head = ""
    for char in text:
        if cell_len(head + char) > head_room:
            break
        head += char
    tail = ""
    for char in reversed(text):
        if cell_len(char + tail) > tail_room:
            break
        tail = char + tail
    return f"{head}…{tail}"


def fit_columns(widths: list[int], room: int, padding: int = 2, least: int = 8, key_share: float = 0.4) -> list[int]:
    """Widths for a table's columns in `room` cells (each column also takes `padding`): their
    widest cells when all fit; else the first column (the keys) up to `key_share` of the room,
    the others sharing the rest evenly (a narrow one gives what it does not need to the wide
    ones), none under `least` (narrower rooms scroll sideways)."""
    available = room - padding * len(widths)
    if not widths or sum(widths) <= available:
        return list(widths)
    first = min(widths[0], max(least, int(available * key_share)))
    rest = available - first
    out = [first] + [0] * (len(widths) - 1)
    left = sorted(range(1, len(widths)), key=lambda i: widths[i])
    while left:
        share = rest // len(left)
        index = left.pop(0)
        out[index] = max(least, min(widths[index], share))
        rest -= out[index]
    return out


def sample_rows(runs: list[CompareRun]) -> list[tuple[float, str, list[str | None]]]:
    """Every eval's samples side by side: (step, prompt, each run's answer or None), by step."""
    table: dict[tuple[float, str], list[str | None]] = {}
    for index, run in enumerate(runs):
        for step, samples in run.data.evals:
            for sample in samples:
                key = (step, str(sample.get("prompt", "")))
                table.setdefault(key, [None] * len(runs))[index] = str(sample.get("output", ""))
    return [(step, prompt, answers) for (step, prompt), answers in sorted(table.items(), key=lambda item: item[0])]

