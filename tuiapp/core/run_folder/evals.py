"""Evaluation results of a run: runs/<id>/evals/<UTC time>.json, one file per `llmtui eval`.

Written by the evaluation tool (tuiapp.trainer.tools.evaluate), read here for the CLI, the history
and compare. A result:

    {"time": 1763769600.0, "data": "demo:facts-heldout", "format": "alpaca", "records": 240,
     "target": {"label": "final", "kind": "full", "base": "...", ...},
     "models": {"tuned": {"loss": 0.52, "perplexity": 1.68, "tokens": 2810, "exact_match": 0.21,
                          "rouge_l": 0.81, "generated": 50, "samples": [...]},
                "base":  {...}},
     "tasks": {"tuned": {"hellaswag": {"acc,none": 0.25, ...}}, "base": {...}}}
"""

from __future__ import annotations

import math
from pathlib import Path

from tuiapp.core.run_folder import rundir, stamped
from tuiapp.core.run_folder.rundir import RunDir

EVALS = rundir.EVALS_DIR
COLUMNS = (("loss", "loss", ".4f"), ("perplexity", "perplexity", ".3f"), ("exact_match", "exact match", ".1%"),
           ("rouge_l", "ROUGE-L", ".3f"))


def new_path(run_dir: Path, now: float | None = None) -> Path:
    """Where the next result goes (never an existing file)."""
    return stamped.new_path(RunDir(run_dir).evals, now)


def write(path: Path, result: dict) -> None:
    """Atomically: a reader never sees half a file."""
    stamped.write(path, result)


def read(path: Path) -> dict | None:
    data = stamped.read(path)
    return data if data is not None and isinstance(data.get("models"), dict) else None


def results(run_dir: Path) -> list[dict]:
    """Every readable result of a run, oldest first (each with its `path`)."""
    return [{**data, "path": str(path)} for path, data in stamped.listing(RunDir(run_dir).evals, _is_result)]


def _is_result(data: dict) -> bool:
    return isinstance(data.get("models"), dict)


def latest(run_dir: Path) -> dict | None:
    found = results(run_dir)
    return found[-1] if found else None


def number(result: dict | None, model: str, key: str) -> float | None:
    if not result:
        return None
    value = ((result.get("models") or {}).get(model) or {}).get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def perplexity_text(tuned: float | None, base: float | None = None) -> str:
    """The history's eval column: the tuned model's perplexity, and the base's: '2.83 (base 1915)'."""
    if tuned is None:
        return ""
    return _short(tuned) + (f" (base {_short(base)})" if base is not None else "")


def perplexity_cell(result: dict | None) -> str:
    return perplexity_text(number(result, "tuned", "perplexity"), number(result, "base", "perplexity"))


def _short(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def table(result: dict) -> list[str]:
    """Base vs tuned, one metric per line, for the CLI."""
    models = [m for m in ("tuned", "base") if m in (result.get("models") or {})]
    names = {"tuned": f"tuned ({(result.get('target') or {}).get('label', 'final')})", "base": "base"}
    width = max(14, *(len(names[m]) for m in models))
    lines = [f"{'':<12}" + "".join(f"{names[m]:>{width}}" for m in models)]
    for key, label, spec in COLUMNS:
        values = [number(result, m, key) for m in models]
        if all(v is None for v in values):
            continue
        lines.append(f"{label:<12}" + "".join(f"{_fmt(v, spec):>{width}}" for v in values))
    for model in models:
        for task, metrics in ((result.get("tasks") or {}).get(model) or {}).items():
            for metric, value in (metrics or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    lines.append(f"{model}: {task} {metric} = {value:.4f}")
    return lines
