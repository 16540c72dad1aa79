"""Benchmark scores of a run, in two places:

- metrics rows: an evaluation's row carries `bench/<task>/<metric>` for the recipe's
  `[[eval.benchmarks]]` (scored on the model being trained, tuiapp.trainer.loop.benchmarks);
- runs/<id>/bench/<UTC time>.json, one file per `llmtui eval --benchmark`:

    {"time": ..., "tasks": ["demo:facts-mc"], "limit": 0, "num_fewshot": 0,
     "models": [{"model": "checkpoint-30", "step": 30, "scores": {"llmtui_facts_mc": {"acc": 0.31}}},
                {"model": "final", "step": 60, "scores": {...}}, {"model": "base", "step": 0, "scores": {...}}]}

Read here for `llmtui show`, the history's column, compare's curves and table and the run view."""

from __future__ import annotations

import math
from pathlib import Path

from tuiapp.core.run_folder import stamped
from tuiapp.core.run_folder.metrics import read_jsonl, train_rows
from tuiapp.core.run_folder.rundir import RunDir

PREFIX = "bench/"
# the metric a task is summed up by, first found (lm-eval's multiple choice: acc; generation: exact_match)
MAIN_METRICS = ("acc_norm", "acc", "exact_match", "f1", "bleu", "mcc")


def metric_row(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    """{task: {metric: v}} as a metrics row's keys: {'bench/task/metric': v}."""
    return {f"{PREFIX}{task}/{metric}": value for task, metrics in scores.items() for metric, value in metrics.items()}


def is_bench_key(key: str) -> bool:
    return key.startswith(PREFIX) and key.count("/") >= 2


def split_key(key: str) -> tuple[str, str]:
    task, _, metric = key[len(PREFIX):].rpartition("/")
    return task, metric


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def main_metric(metrics: dict[str, float]) -> str | None:
    for name in MAIN_METRICS:
        if name in metrics:
            return name
    return next(iter(sorted(metrics)), None)


def curves(rows: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """Each bench key's (step, value) over the run's evaluation rows, by step."""
    out: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if row.get("split") != "eval" or not isinstance(row.get("step"), (int, float)):
            continue
        for key, value in row.items():
            number = _number(value)
            if is_bench_key(key) and number is not None:
                out.setdefault(key, []).append((float(row["step"]), number))
    return {key: sorted(points) for key, points in out.items()}


def latest_scores(rows: list[dict]) -> dict[str, dict[str, float]]:
    """{task: {metric: v}} of the last evaluation that scored benchmarks."""
    for row in reversed(rows):
        if row.get("split") == "eval" and any(is_bench_key(k) for k in row):
            out: dict[str, dict[str, float]] = {}
            for key, value in row.items():
                number = _number(value)
                if is_bench_key(key) and number is not None:
                    task, metric = split_key(key)
                    out.setdefault(task, {})[metric] = number
            return out
    return {}


def headline(scores: dict[str, dict[str, float]]) -> dict[str, float]:
    """{task: its main metric's value}: the history's column and compare's table."""
    out = {}
    for task, metrics in scores.items():
        name = main_metric(metrics)
        if name is not None:
            out[task] = metrics[name]
    return out


def headline_text(scores: dict[str, dict[str, float]]) -> str:
    """'llmtui_facts_mc 0.31 · arc_easy 0.25'."""
    return " · ".join(f"{task} {value:.3g}" for task, value in headline(scores).items())


# ---------------------------------------------------------------- bench/ results


def new_path(run_dir: Path, now: float | None = None) -> Path:
    return stamped.new_path(RunDir(run_dir).bench, now)


def write(path: Path, result: dict) -> None:
    stamped.write(path, result)


def _is_result(data: dict) -> bool:
    return isinstance(data.get("models"), list)


def read(path: Path) -> dict | None:
    data = stamped.read(path)
    return data if data is not None and _is_result(data) else None


def results(run_dir: Path) -> list[dict]:
    """Every `llmtui eval --benchmark` result of a run, oldest first (each with its `path`)."""
    return [{**data, "path": str(path)} for path, data in stamped.listing(RunDir(run_dir).bench, _is_result)]


def latest(run_dir: Path) -> dict | None:
    found = results(run_dir)
    return found[-1] if found else None


def final_step(run_dir: Path) -> int | None:
    rows = train_rows(read_jsonl(RunDir(run_dir).metrics))
    steps = [r["step"] for r in rows if isinstance(r.get("step"), int)]
    return max(steps) if steps else None


def table(result: dict) -> list[str]:
    """One line per model (checkpoints by step, then final, then base), one column per task's
    metric, for the CLI."""
    models = [m for m in result.get("models") or [] if isinstance(m, dict)]
    columns: list[tuple[str, str]] = []
    for model in models:
        for task, metrics in (model.get("scores") or {}).items():
            for metric in metrics:
                if (task, metric) not in columns:
                    columns.append((task, metric))
    heads = [f"{task} {metric}" for task, metric in columns]
    width = max([12, *(len(h) + 2 for h in heads)])
    lines = [f"{'model':<16}{'step':>7}" + "".join(f"{h:>{width}}" for h in heads)]
    for model in models:
        scores = model.get("scores") or {}
        cells = []
        for task, metric in columns:
            value = _number((scores.get(task) or {}).get(metric))
            cells.append(f"{'-' if value is None else format(value, '.4f'):>{width}}")
        step = model.get("step")
        lines.append(f"{str(model.get('model')):<16}{'-' if step is None else str(step):>7}" + "".join(cells))
    return lines
