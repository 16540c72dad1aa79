"""Helpers of the experiment-manager UI tests: a sweep built with the real core, and queued runs.

SWEEP: `make_sweep` plans a 2x2 sweep with tuiapp.core.config.sweep.plan_sweep (every combination
checked against the schema, as `llmtui sweep` does), creates each run with RunStore.create (fixed
ids, so snapshots never move), records its group and status with run.update (run.json's real
fields), writes metrics with the trainer's JsonlWriter, and the group with sweep.write_group.
The losses are made up but deterministic: a higher learning rate and rank learn faster here.

QUEUED: `queued_run` is a run waiting in the real device queue (tuiapp.core.store.queue.enqueue) whose
supervisor is "alive" because this process holds the run's lock, as the supervisor would.
"""

from __future__ import annotations

import math
from pathlib import Path

from ui_fixtures import FIXED_NOW

from tuiapp.core.config import sweep
from tuiapp.core.config.recipe import LoraMethod, Recipe
from tuiapp.core.run_folder.metrics import JsonlWriter
from tuiapp.core.store import queue
from tuiapp.core.store.runs import Run, RunStore

SWEEP_ID = "sweep-20260101-000400-tiny-sweep-e0e0"
SWEEP_RECIPE = {"name": "tiny-sweep", "model": {"name": "tiny"}, "method": {"kind": "lora"}, "dataset": {"name": "demo:facts"},
                "train": {"max_steps": 20, "eval_steps": 5, "logging_steps": 1}}
GRID = {"train.learning_rate": [1e-3, 3e-3], "method.rank": [4, 8]}


def sweep_loss(step: int, lr: float, rank: int) -> float:
    return round(0.9 + 2.0 * math.exp(-step * lr * 40 * (1 + rank / 16)) + 0.02 * math.sin(step), 5)


def make_sweep(root: Path, statuses: list[str] | None = None, grid: dict | None = None, written: dict | None = None,
               group_id: str = SWEEP_ID, metric: str | None = None) -> list[Run]:
    """A sweep of tiny-sweep runs over `grid` (default 2x2: learning_rate x rank); `statuses` per
    combination (default: all succeeded but the last, running); `written`: steps written per
    combination index (default all 20, 12 for a running one)."""
    store = RunStore(root)
    data = {**SWEEP_RECIPE, "train": dict(SWEEP_RECIPE["train"])}
    if metric:
        data["sweep"] = {"metric": metric}
    plan = sweep.plan_sweep(data, "", "recipes/tiny-sweep.toml", grid or GRID)
    count = len(plan.combinations)
    statuses = statuses or ["succeeded"] * (count - 1) + ["running"]
    runs = []
    for combo, status in zip(plan.combinations, statuses, strict=True):
        started = FIXED_NOW - 200 + combo.index * 10
        run_id = f"20260101-0004{20 + combo.index:02d}-{combo.recipe.name}-e{combo.index:03d}"
        run = store.create(combo.recipe, recipe_file="recipes/tiny-sweep.toml", run_id=run_id)
        values = dict(combo.values)
        run.update(group={"id": group_id, "name": plan.name, "index": combo.index, "keys": plan.keys,
                          "values": values},
                   status=status, created=started - 1, started=started, host="testhost",
                   ended=None if status == "running" else started + 45,
                   attempts=[{"number": 1, "started": started, "ended": None if status == "running" else started + 45,
                              "outcome": None if status == "running" else status}])
        steps = (written or {}).get(combo.index, 12 if status == "running" else 20)
        lr, rank = values.get("train.learning_rate", 1e-3), values.get("method.rank", 8)
        step_s = (FIXED_NOW - 1 - started) / steps if status == "running" else 2.0
        with JsonlWriter(run.metrics_path) as writer:
            for step in range(1, steps + 1):
                loss = sweep_loss(step, lr, rank)
                writer.write({"step": step, "max_steps": 20, "time": started + step * step_s, "loss": loss,
                              "lr": lr, "tokens": step * 512, "tokens_per_s": 900.0 + rank})
                if step % 5 == 0:
                    writer.write({"split": "eval", "step": step, "time": started + step * step_s + 0.5,
                                  "eval_loss": round(loss + 0.1, 5)})
        runs.append(run)
    sweep.write_group(root, group_id, plan, [r.id for r in runs])
    return runs


def queued_run(store: RunStore, name: str, position_hint: float) -> Run:
    """A run waiting in the device queue; this process holds its lock (its 'supervisor')."""
    run = store.create(Recipe(name=name, method=LoraMethod()), lock=True)
    entry = queue.enqueue(store.root, run.id, now=position_hint)
    run.update(status="queued", queue={"priority": 0, "slots": 1, "enqueued": entry.enqueued, "devices": 1})
    return run
