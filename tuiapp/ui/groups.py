"""Sweeps as the app shows them: one collapsible row per sweep in the history, and the group
screen's ranking, table and heat map. No Textual here (rich Text at most).

A thin reader over the files tuiapp.core.config.sweep writes: runs/.groups/<id>.json ({id, name, keys,
runs, total, metric, halving_step}); each run's own run.json names its group ({id, name, index,
keys, values}), so a run whose group file is missing still groups with its sweep.

What ranks a sweep (`sweep_metric`, the one place that decides it): the best eval loss, or the final
train loss with `[sweep] metric = "loss"`; lower is better. A sweep whose runs are all online RL
(grpo, rloo), whose TRL eval loss says nothing about the task, ranks by the task's reward on the
held-out prompts (RunRow.held_out), higher is better.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from rich.text import Text

from tuiapp.core.common.methods import is_rl
from tuiapp.core.config.sweep_groups import list_groups
from tuiapp.core.run_folder.rundir import ACTIVE, FINAL
from tuiapp.ui.history import RunRow

GROUP_PREFIX = "group:"  # a group row's id in the history table
METRIC_LABELS = {"eval_loss": "eval loss", "loss": "loss", "held_out": "held-out reward"}
HIGHER_IS_BETTER = {"held_out"}  # the other metrics are losses
SHADES = "░▒▓█"  # worse → better


def read_groups(runs_root: Path) -> dict[str, dict]:
    """Every sweep's record, by id."""
    return list_groups(runs_root)


def metric_of(record: dict | None) -> str:
    """What ranks a sweep's runs: `eval_loss` (best eval loss) or `loss` (final train loss)."""
    return "loss" if (record or {}).get("metric") == "loss" else "eval_loss"


def sweep_metric(requested: str, rows: list[RunRow]) -> str:
    """What ranks these runs of a sweep: the held-out reward when they are all grpo/rloo runs,
    else the metric its record asks for (a mixed sweep then ranks only its other runs)."""
    return "held_out" if rows and all(is_rl(r.method) for r in rows) else requested


def metric_value(row: RunRow, metric: str) -> float | None:
    value = {"loss": row.last_loss, "held_out": row.held_out}.get(metric, row.best_eval_loss)
    return value if value is not None and math.isfinite(value) else None


def ranking_key(value: float, metric: str) -> float:
    """The value as a sort key, smallest best: a reward's sign flipped."""
    return -value if metric in HIGHER_IS_BETTER else value


def short_key(key: str) -> str:
    """'train.learning_rate' -> 'learning_rate'."""
    return key.rsplit(".", 1)[-1]


def show_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return format(value, "g")
    if value is None:
        return "—"
    return str(value)


def values_label(keys: list[str], values: dict | None) -> str:
    """A run's combination: 'learning_rate=0.003 rank=8'."""
    values = values or {}
    return " ".join(f"{short_key(k)}={show_value(values.get(k))}" for k in keys)


def run_keys(row: RunRow) -> list[str]:
    keys = (row.group or {}).get("keys")
    return list(keys) if isinstance(keys, list) else list(((row.group or {}).get("values") or {}))


def run_values(row: RunRow) -> dict:
    values = (row.group or {}).get("values")
    return values if isinstance(values, dict) else {}


def run_index(row: RunRow) -> int:
    index = (row.group or {}).get("index")
    return index if isinstance(index, int) else 0


def combination(row: RunRow) -> str:
    return values_label(run_keys(row), run_values(row))


@dataclass
class GroupRow:
    """One sweep in the history: its runs (the ones the history holds) and what they add up to."""

    group_id: str
    name: str
    keys: list[str]
    metric: str
    runs: list[RunRow] = field(default_factory=list)
    size: int = 0  # runs the sweep queued (its record), at least those found
    expanded: bool = False

    @property
    def id(self) -> str:
        return GROUP_PREFIX + self.group_id

    @property
    def title(self) -> str:
        return self.name

    @property
    def done(self) -> int:
        return sum(r.status in FINAL for r in self.runs)

    @property
    def total(self) -> int:
        return max(self.size, len(self.runs))

    @property
    def finished(self) -> bool:
        return bool(self.runs) and self.done >= self.total

    def count(self, statuses: tuple[str, ...]) -> int:
        return sum(r.status in statuses for r in self.runs)

    @property
    def best(self) -> RunRow | None:
        ranked = rank_runs(self.runs, self.metric)
        return ranked[0] if ranked and metric_value(ranked[0], self.metric) is not None else None

    @property
    def best_value(self) -> float | None:
        best = self.best
        return metric_value(best, self.metric) if best else None

    @property
    def newest(self) -> str:
        """The newest run id (ids start with the UTC time): where the group sits in the history."""
        return max((r.id for r in self.runs), default="")

    @property
    def started(self) -> float | None:
        times = [r.started or r.created for r in self.runs if r.started or r.created]
        return min(times) if times else None

    def progress(self) -> str:
        return f"{self.done}/{self.total} done"

    def best_text(self) -> str:
        """'best eval loss 1.2345 · learning_rate=0.003 rank=8', or what is missing."""
        best = self.best
        if best is None:
            return f"no {METRIC_LABELS[self.metric]} yet"
        return f"best {METRIC_LABELS[self.metric]} {self.best_value:.4f} · {combination(best)}"

    def status_text(self) -> str:
        """The history's detail line for the sweep."""
        parts = [f"sweep {self.name}: {self.progress()}"]
        for statuses, word in ((("running", "starting", "stopping"), "running"), (("queued",), "queued"),
                               (("failed",), "failed")):
            count = self.count(statuses)
            if count:
                parts.append(f"{count} {word}")
        parts.append(self.best_text())
        parts.append("enter opens · f " + ("folds" if self.expanded else "unfolds"))
        return " · ".join(parts)


def build_groups(rows: list[RunRow], records: dict[str, dict], expanded: set[str]) -> dict[str, GroupRow]:
    """GroupRow of every sweep some row belongs to (rows in sweep order)."""
    out: dict[str, GroupRow] = {}
    for row in rows:
        gid = row.group_id
        if gid is None:
            continue
        group = out.get(gid)
        if group is None:
            record = records.get(gid) or {}
            keys = record.get("keys") if isinstance(record.get("keys"), list) else run_keys(row)
            size = len(record.get("runs") or [])
            group = out[gid] = GroupRow(gid, str(record.get("name") or row.group.get("name") or gid), list(keys),
                                        metric_of(record), size=size, expanded=gid in expanded)
        group.runs.append(row)
    for group in out.values():
        group.runs.sort(key=lambda r: (run_index(r), r.id))
        group.metric = sweep_metric(group.metric, group.runs)
    return out


def rank_runs(rows: list[RunRow], metric: str) -> list[RunRow]:
    """Best first by the metric (lowest loss, highest reward); runs without it last, in sweep order."""
    def key(row: RunRow):
        value = metric_value(row, metric)
        return (value is None, ranking_key(value, metric) if value is not None else 0.0, run_index(row), row.id)

    return sorted(rows, key=key)


# ---------------------------------------------------------------- the group screen


def table_rows(rows: list[RunRow], keys: list[str], metric: str, now: float) -> list[tuple[str, ...]]:
    """The group screen's table, best first: rank, each varied key's value, status, step,
    final loss, best eval loss (the held-out reward when that ranks the sweep)."""
    out = []
    for place, row in enumerate(rank_runs(rows, metric), start=1):
        values = run_values(row)
        step = f"{row.step:.0f}" + (f"/{row.max_steps:.0f}" if row.max_steps else "") if row.step is not None else ""
        last = metric_value(row, "held_out" if metric == "held_out" else "eval_loss")
        out.append((
            str(place) if metric_value(row, metric) is not None else "-",
            *(show_value(values.get(k)) for k in keys),
            row.view(now).cell,
            step,
            f"{row.last_loss:.4f}" if row.last_loss is not None else "",
            f"{last:.4f}" if last is not None else "",
        ))
    return out


def axis_values(rows: list[RunRow], key: str) -> list:
    """A key's values in sweep order (the order of the grid), each once."""
    seen: list = []
    shown: set[str] = set()
    for row in sorted(rows, key=lambda r: (run_index(r), r.id)):
        value = run_values(row).get(key)
        marker = json.dumps(value, sort_keys=True)
        if marker not in shown:
            shown.add(marker)
            seen.append(value)
    return seen


def heat_grid(rows: list[RunRow], keys: list[str], metric: str) -> tuple[list, list, dict]:
    """For two varied keys: the first key's values (rows), the second's (columns) and the
    metric at each (row value, column value) marker pair (the best run's when repeated)."""
    first, second = keys
    down, across = axis_values(rows, first), axis_values(rows, second)
    cells: dict[tuple[str, str], float] = {}
    for row in rows:
        value = metric_value(row, metric)
        if value is None:
            continue
        values = run_values(row)
        at = (json.dumps(values.get(first), sort_keys=True), json.dumps(values.get(second), sort_keys=True))
        cells[at] = min(value, cells.get(at, value), key=lambda v: ranking_key(v, metric))
    return down, across, cells


def shade(value: float, found: list[float], metric: str = "eval_loss") -> str:
    """Darker is better: by the value's rank among those found (ties alike), so a small grid
    uses every shade."""
    ranks = sorted(set(found), key=lambda v: ranking_key(v, metric))
    if len(ranks) < 2:
        return SHADES[-1]
    place = ranks.index(value) / (len(ranks) - 1)  # 0 best .. 1 worst
    return SHADES[round((1.0 - place) * (len(SHADES) - 1))]


def heat_map(rows: list[RunRow], keys: list[str], metric: str) -> Text:
    """A text grid of the metric over two varied keys, shaded (█ best … ░ worst), the best
    cell in bold with a ★."""
    down, across, cells = heat_grid(rows, keys, metric)
    first, second = keys
    labels_down = [f"{short_key(first)}={show_value(v)}" for v in down]
    labels_across = [f"{short_key(second)}={show_value(v)}" for v in across]
    left = max([len(x) for x in labels_down] + [len(short_key(first))]) + 2
    width = max([len(x) for x in labels_across] + [10]) + 2
    found = list(cells.values())
    low = min(found, key=lambda v: ranking_key(v, metric)) if found else None
    text = Text(no_wrap=True, overflow="crop")
    text.append(f"{METRIC_LABELS[metric]}: {short_key(first)} ↓ × {short_key(second)} →   █ best … ░ worst\n", style="dim")
    text.append(" " * left + "".join(label.rjust(width) for label in labels_across) + "\n", style="bold")
    for value, label in zip(down, labels_down, strict=True):
        text.append(label.ljust(left), style="bold")
        for other in across:
            at = (json.dumps(value, sort_keys=True), json.dumps(other, sort_keys=True))
            metric_at = cells.get(at)
            if metric_at is None:
                text.append("—".rjust(width), style="dim")
                continue
            best = metric_at == low
            cell = f"{shade(metric_at, found, metric) * 2} {metric_at:.4f}{'★' if best else ' '}"
            text.append(cell.rjust(width), style="bold" if best else "")
        text.append("\n")
    text.rstrip()
    return text


def compare_labels(rows: list[RunRow]) -> list[str] | None:
    """Legend labels for runs of one sweep: their varied keys' values ('learning_rate=0.003
    rank=8'); None when the runs are not all of the same sweep."""
    ids = {r.group_id for r in rows}
    if len(ids) != 1 or None in ids:
        return None
    labels = [combination(r) for r in rows]
    if not all(labels) or len(set(labels)) != len(labels):
        return None
    return labels


def group_alive(group: GroupRow) -> bool:
    return any(r.status in ACTIVE for r in group.runs)
