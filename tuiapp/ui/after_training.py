"""What a run got after training, for the TUI: its evaluations (`llmtui eval` or Evaluate:
core.run_folder.evals) and its exports (`llmtui export` or Export: core.run_folder.exports). Each lands as a new file in
the run's evals/ or exports/ folder, so a folder's mtime says something new arrived: the history
and the run view watch those two stamps and show results made from a shell without a restart.
Pure functions and a small watcher; no Textual."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuiapp.core.run_folder import evals, exports
from tuiapp.core.run_folder.rundir import RunDir

Stamp = tuple[float, float]
NOTHING: Stamp = (0.0, 0.0)


def _mtime(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def stamp(run_dir: Path) -> Stamp:
    """When the run's evals/ and exports/ folders last changed (0.0 for one that is not there)."""
    return _mtime(RunDir(run_dir).evals), _mtime(RunDir(run_dir).exports)


@dataclass(frozen=True)
class AfterTraining:
    evals: list[dict] = field(default_factory=list)  # oldest first
    exports: list[dict] = field(default_factory=list)

    @property
    def latest_eval(self) -> dict | None:
        return self.evals[-1] if self.evals else None

    @property
    def perplexity(self) -> tuple[float | None, float | None]:
        """The latest evaluation's perplexity of the tuned model and of its base (the history's column)."""
        latest = self.latest_eval
        return evals.number(latest, "tuned", "perplexity"), evals.number(latest, "base", "perplexity")


def read(run_dir: Path) -> AfterTraining:
    return AfterTraining(evals.results(run_dir), exports.made(run_dir))


def _when(entry: dict) -> str:
    moment = entry.get("time")
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(moment)) if isinstance(moment, (int, float)) else "?"


def eval_line(result: dict) -> str:
    """'2026-01-01 12:00 · demo:facts-heldout, 240 records · perplexity 1.68 (base 12.3) · exact match 21.0% (base 0.0%)'"""
    parts = [_when(result), f"{result.get('data', '?')}, {result.get('records', '?')} records"]
    for key, label, spec in evals.COLUMNS[1:]:
        tuned, base = evals.number(result, "tuned", key), evals.number(result, "base", key)
        if tuned is not None:
            parts.append(f"{label} {format(tuned, spec)}" + (f" (base {format(base, spec)})" if base is not None else ""))
    return " · ".join(parts)


def lines(after: AfterTraining) -> list[str]:
    """The run view's section on what was done with the run after training (empty: nothing)."""
    out = []
    if after.evals:
        out.append(f"── evaluations (llmtui eval / E): {len(after.evals)} ──")
        out += [eval_line(result) for result in reversed(after.evals[-5:])]  # the latest first
    if after.exports:
        out.append(f"── exports (llmtui export / X): {len(after.exports)} ──")
        out += [f"{_when(entry)} · {exports.describe(entry)}" for entry in reversed(after.exports[-5:])]
    return out


def news(before: AfterTraining, after: AfterTraining) -> list[str]:
    """What arrived between two reads, as toasts say it."""
    said = []
    if len(after.evals) > len(before.evals):
        tuned, base = after.perplexity
        said.append("new evaluation" + (f": perplexity {evals.perplexity_text(tuned, base)}" if tuned is not None else ""))
    if len(after.exports) > len(before.exports):
        said.append(f"exported to {after.exports[-1].get('out')}")
    return said


class AfterWatch:
    """For the history: the runs whose evals/ or exports/ changed since the last look (a stat of
    two folders per run and poll; a folder is read only when it changed)."""

    def __init__(self) -> None:
        self.seen: dict[str, Stamp] = {}

    def poll(self, runs: list[tuple[str, Path]]) -> dict[str, AfterTraining]:
        changed = {}
        for run_id, path in runs:
            now = stamp(path)
            before = self.seen.get(run_id, NOTHING)
            self.seen[run_id] = now
            if now != before:  # a first look reports a run with results too: one may have landed meanwhile
                changed[run_id] = read(path)
        return changed
