"""Sweeps: a grid of recipe keys, expanded into one checked recipe per combination, queued as
one group. Nothing is created unless every combination is valid."""

from __future__ import annotations

import itertools
import json
import random
import re
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import tomllib

from tuiapp.core.common.errors import RecipeError, UserError
from tuiapp.core.common.methods import is_rl
from tuiapp.core.config.recipe import Recipe, SweepSpec, apply_override, recipe_from_dict, require_model
from tuiapp.core.config.sweep_groups import groups_dir
from tuiapp.core.run_folder import reward_health
from tuiapp.core.run_folder.atomic import atomic_write_text


def parse_value(text: str):
    """A grid value as TOML when it parses (1e-4, 16, true, "x"), else the bare string."""
    try:
        return tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def split_values(text: str) -> list[str]:
    """'1e-4,3e-4' -> ['1e-4', '3e-4']; commas inside [...] or quotes stay."""
    parts, depth, quote, current = [], 0, None, ""
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_grid(items: list[str]) -> dict[str, list]:
    """--grid KEY=V1,V2 ... into {key: [values]} (later flags for a key replace earlier ones)."""
    grid: dict[str, list] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise UserError(message=f"bad --grid '{item}'",
                            fix="write it as key.path=value1,value2, e.g. --grid train.learning_rate=1e-4,3e-4")
        grid[key] = [parse_value(v) for v in split_values(values)]
    return grid


@dataclass
class Combination:
    index: int
    values: dict  # key -> value
    recipe: Recipe


@dataclass
class SweepPlan:
    name: str
    keys: list[str]
    combinations: list[Combination]
    spec: SweepSpec
    total: int  # combinations in the full grid (before a random draw)
    base: Recipe = field(repr=False, default=None)

    def table(self) -> list[str]:
        """The combinations as aligned text rows (for --dry-run)."""
        header = ["#", "run name", *self.keys]
        rows = [[str(c.index), c.recipe.name, *(json.dumps(c.values[k]) for k in self.keys)]
                for c in self.combinations]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
                for row in [header, *rows]]


def _short(key: str, value) -> str:
    name = key.rsplit(".", 1)[-1]
    abbrev = "".join(part[0] for part in name.split("_")) if "_" in name else name[:4]
    return re.sub(r"[^A-Za-z0-9._-]+", "", f"{abbrev}{value}")


def run_name(base: str, values: dict) -> str:
    return (f"{base}-" + "-".join(_short(k, v) for k, v in values.items()))[:100].rstrip("-.")


def plan_sweep(data: dict, text: str, file: str, grid_flags: dict[str, list], *, random_n: int | None = None,
               seed: int | None = None, slots: int | None = None, overrides: list[str] | None = None) -> SweepPlan:
    """Every combination checked against the schema; a RecipeError naming each bad combination,
    key and value otherwise. `data` is the recipe file's TOML (with --set applied)."""
    base = recipe_from_dict(data, text=text, file=file, overrides=overrides)  # the recipe itself must be valid first
    require_model(data, text, file)
    spec = base.sweep.model_copy(update={k: v for k, v in (("random", random_n), ("seed", seed), ("slots", slots))
                                         if v is not None})
    grid = {**spec.grid, **grid_flags}
    if not grid:
        raise UserError(message="nothing to sweep", file=file,
                        fix="add --grid key=v1,v2 (or a [sweep.grid] table in the recipe)")
    empty = [k for k, v in grid.items() if not v]
    if empty:
        raise UserError(message=f"--grid {empty[0]} has no values", key=empty[0], fix="give at least one value")
    keys = list(grid)
    product = list(itertools.product(*(grid[k] for k in keys)))
    total = len(product)
    if spec.random and spec.random < total:
        product = random.Random(spec.seed).sample(product, spec.random)
    errors: list[str] = []
    combinations: list[Combination] = []
    for index, combo in enumerate(product, start=1):
        values = dict(zip(keys, combo, strict=True))
        child = json.loads(json.dumps(data))
        child.pop("sweep", None)
        try:
            for key, value in values.items():
                apply_override(child, f"{key}={json.dumps(value)}")
            child["name"] = run_name(base.name, values)
            recipe = recipe_from_dict(child, text="", file=file)
        except RecipeError as exc:
            shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in values.items())
            errors.append(f"combination {index} ({shown}): {str(exc).replace(chr(10), chr(10) + '  ')}")
            continue
        combinations.append(Combination(index, values, recipe))
    if errors:
        raise RecipeError(message=f"{len(errors)} of {len(product)} combinations are invalid:\n" + "\n".join(errors),
                          file=file, fix="change the --grid values (or [sweep.grid]) named above")
    return SweepPlan(base.name, keys, combinations, spec, total, base)


# ---------------------------------------------------------------- groups on disk


def new_group_id(name: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"sweep-{stamp}-{re.sub(r'[^A-Za-z0-9._-]+', '-', name)[:40]}-{secrets.token_hex(2)}"


def write_group(runs_root: Path, group_id: str, plan: SweepPlan, run_ids: list[str]) -> dict:
    record = {"id": group_id, "name": plan.name, "keys": plan.keys, "created": time.time(), "runs": run_ids,
              "total": plan.total, "metric": plan.spec.metric, "halving_step": plan.spec.halving_step}
    path = groups_dir(runs_root) / f"{group_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=2))
    return record


def read_group(runs_root: Path, group_id: str) -> dict | None:
    try:
        return json.loads((groups_dir(runs_root) / f"{group_id}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def halving_path(runs_root: Path, group_id: str, run_id: str) -> Path:
    return groups_dir(runs_root) / group_id / "halving" / f"{run_id}.json"


def record_halving(runs_root: Path, group_id: str, run_id: str, value: float) -> None:
    path = halving_path(runs_root, group_id, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"value": value, "time": time.time()}))


def halving_values(runs_root: Path, group_id: str) -> dict[str, float]:
    out = {}
    for path in (groups_dir(runs_root) / group_id / "halving").glob("*.json"):
        try:
            out[path.stem] = float(json.loads(path.read_text(encoding="utf-8"))["value"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


HALVING_WINDOW = 5  # an RL run at the halving step: its primary reward's mean over its last rows (a step is noisy)


def halving_value(rows: list[dict], step: int, recipe: dict | None) -> float | None:
    """What the halving rule ranks a run by once its train rows reach `step`, lower better (None before):
    the loss there; for grpo/rloo, whose loss says nothing of the task, the primary reward's mean over the
    last HALVING_WINDOW rows up to it, its sign flipped (halving_text says it the right way up)."""
    method = (recipe or {}).get("method") or {}
    key = reward_health.primary_reward_key(recipe) if is_rl(method.get("kind")) else "loss"
    rows = [r for r in rows if r.get("split", "train") == "train" and isinstance(r.get("step"), (int, float))
            and isinstance(r.get(key), (int, float))]
    reached = next((i for i, r in enumerate(rows) if r["step"] >= step), None)
    if reached is None:
        return None
    if key == "loss":
        return float(rows[reached]["loss"])
    window = rows[max(0, reached + 1 - HALVING_WINDOW):reached + 1]
    return -sum(r[key] for r in window) / len(window)


def halving_text(value: float, recipe: dict | None) -> str:
    """A halving value as the run's metric: 'loss 1.2345', or 'answer reward 0.4000' for grpo/rloo."""
    if is_rl(((recipe or {}).get("method") or {}).get("kind")):
        return f"{reward_health.primary_label(recipe)} reward {-value:.4f} (mean of its last {HALVING_WINDOW} steps)"
    return f"loss {value:.4f}"


def in_worse_half(mine: float, values: dict[str, float]) -> tuple[bool, float | None]:
    """Whether `mine` is in the worse (higher) half of the values seen so far at the halving
    step, and their median; with fewer than 2 values nothing is stopped."""
    if len(values) < 2:
        return False, None
    ordered = sorted(values.values())
    median = (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) / 2
    keep = len(ordered) - len(ordered) // 2  # the better ceil(n/2) go on
    return mine > ordered[keep - 1], median
