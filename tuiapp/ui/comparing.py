"""Comparing runs as data: their curves by step or by tokens, and the keys of their frozen
recipes that differ. Pure functions; the compare screen calls `load_compare_run` in a worker.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from tuiapp.core import meta
from tuiapp.core.metrics import JsonlReader, as_number, dedupe_steps, eval_rows, train_rows
from tuiapp.core.runs import Run
from tuiapp.ui.groups import compare_labels
from tuiapp.ui.history import RunRow, row_from_info, with_metrics
from tuiapp.ui.rundata import Series

# metric id -> (title, where it lives)
METRICS = {
    "loss": ("Loss", "train"),
    "eval_loss": ("Eval loss", "eval"),
    "lr": ("Learning rate", "train"),
    "tokens_per_s": ("Tokens/s", "train"),
}
# preference runs (dpo, simpo, cpo, orpo, kto, reward): charts shown when a compared run has them
PREFERENCE_CHARTS = {
    "rewards/margins": ("Reward margin", "train"),
    "rewards/accuracies": ("Reward accuracy", "train"),
}
AXES = ("step", "tokens")


def chart_id(metric: str) -> str:
    return metric.replace("/", "-").replace("_", "-")


@dataclass
class CompareRun:
    id: str
    row: RunRow
    recipe: dict
    series: dict[tuple[str, str], Series] = field(default_factory=dict)  # (metric, axis)
    label: str = ""


def load_compare_run(path: Path) -> CompareRun:
    """Everything the compare screen shows of one run (reads its files once)."""
    run = Run(path).load()
    records = JsonlReader(run.metrics_path).read_all()
    row = with_metrics(row_from_info(path, run.info, meta.read_meta(path)), records)
    return CompareRun(path.name, row, read_frozen_recipe(run), build_series(records))


def read_frozen_recipe(run: Run) -> dict:
    try:
        return tomllib.loads((run.path / "recipe.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        recipe = run.info.get("recipe")
        return recipe if isinstance(recipe, dict) else {}


def build_series(records: list[dict]) -> dict[tuple[str, str], Series]:
    train = dedupe_steps(train_rows(records))
    evals = dedupe_steps(eval_rows(records))
    steps = [as_number(r.get("step")) or 0.0 for r in train]
    tokens = [r.get("tokens") for r in train]
    out = {(m, a): Series() for m in (*METRICS, *PREFERENCE_CHARTS) for a in AXES}
    for metric, (_, where) in (*METRICS.items(), *PREFERENCE_CHARTS.items()):
        if where != "train":
            continue
        values = [_number(r.get(metric)) for r in train]
        out[(metric, "step")].extend(steps, values)
        out[(metric, "tokens")].extend(tokens, values)
    eval_steps = [as_number(r.get("step")) for r in evals]
    eval_values = [_number(r.get("eval_loss")) for r in evals]
    out[("eval_loss", "step")].extend(eval_steps, eval_values)
    out[("eval_loss", "tokens")].extend([tokens_at(s, steps, tokens) for s in eval_steps], eval_values)
    return out


def _number(value):
    """Numbers as they are; strings such as "nan" through as_number."""
    return value if isinstance(value, (int, float)) else as_number(value)


def tokens_at(step: float | None, steps: list[float], tokens: list[float | None]) -> float | None:
    """Tokens seen at a step: those of the last train row at or before it."""
    if step is None or not steps:
        return None
    index = bisect_right(steps, step) - 1
    return tokens[index] if index >= 0 else 0.0


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
    """Dotted keys of a nested dict: {'train': {'lr': 1}} -> {'train.lr': 1}."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                out.update(flatten(value, path))
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
