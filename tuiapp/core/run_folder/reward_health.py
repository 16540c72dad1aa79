"""The rewards of an online RL run (grpo, rloo) read for what the run was for: which reward is the
task's (the primary), and whether a shaping reward was gamed while the task's stayed flat.

A run's total reward mixes its rewards, and a format reward that a degenerate completion satisfies
lifts it: `666666666666` scores 1.0 on digit coverage and 0.0 on the answer. So the headline of a
run (the history's reward column, compare, `llmtui show`) is its primary reward: the one marked
`primary = true`, else the first `answer` reward, else the weighted total. This is the one place
that choice is made (tuiapp.ui.primary_reward re-exports it for the UI).

Reward hacking: over the logged train rows, a non-primary reward whose mean over the last fifth of
the steps is saturated (>= SATURATED, up by at least RISE from the first fifth) while the primary's
moved less than FLAT and stays below its own half: the policy learnt the shaping, not the task.
The samples that show it are the latest generations scoring high on the shaping reward and nothing
on the primary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TOTAL_KEY = "reward"  # TRL's weighted total of a step's rewards
SATURATED = 0.9  # a shaping reward's last-fifth mean at or above this is saturated
RISE = 0.2  # ... once it rose at least this much from the first fifth
FLAT = 0.1  # the primary's last-fifth mean moved less than this: flat
LOW = 0.5  # ... and stays below this
MIN_ROWS = 5  # a fifth of the steps needs five logged rows


def reward_label(reward: dict) -> str:
    """The name a reward logs under (core.config.rewards' label()): its name, else a python
    reward's function name, a model reward's 'model', else its kind."""
    if reward.get("name"):
        return str(reward["name"])
    function = str(reward.get("function") or "")
    if reward.get("kind") == "python" and ":" in function:
        return function.rsplit(":", 1)[1]
    return str(reward.get("kind") or "")


def recipe_rewards(recipe: dict | None) -> list[dict]:
    method = recipe.get("method") if isinstance(recipe, dict) else None
    rewards = method.get("rewards") if isinstance(method, dict) else None
    return [r for r in (rewards or []) if isinstance(r, dict)]


def primary_reward(recipe: dict | None) -> dict | None:
    """The reward marked primary, else the first answer reward, else None (the total is the headline)."""
    rewards = recipe_rewards(recipe)
    return (next((r for r in rewards if r.get("primary") is True), None)
            or next((r for r in rewards if r.get("kind") == "answer"), None))


def primary_reward_key(recipe: dict | None) -> str:
    """The metrics key of the headline reward: `rewards/NAME/mean`, or the total."""
    chosen = primary_reward(recipe)
    return f"rewards/{reward_label(chosen)}/mean" if chosen else TOTAL_KEY


def primary_label(recipe: dict | None) -> str:
    chosen = primary_reward(recipe)
    return reward_label(chosen) if chosen else "total"


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _series(rows: list[dict], key: str) -> list[float]:
    out = []
    for row in rows:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out.append(float(value))
    return out


def fifths(values: list[float]) -> tuple[float, float] | None:
    """(mean of the first fifth, mean of the last fifth) of the values; None under MIN_ROWS."""
    if len(values) < MIN_ROWS:
        return None
    part = max(1, len(values) // 5)
    return _mean(values[:part]), _mean(values[-part:])


@dataclass(frozen=True)
class Hacking:
    """A shaping reward saturated while the primary stayed flat."""

    shaping: str
    primary: str
    shaping_first: float
    shaping_last: float
    primary_first: float
    primary_last: float
    steps: int

    def text(self) -> str:
        return (f"reward hacking? {self.shaping} rose {self.shaping_first:.2f} -> {self.shaping_last:.2f} while "
                f"{self.primary} (primary) stayed {self.primary_first:.2f} -> {self.primary_last:.2f} over "
                f"{self.steps} steps: the policy learnt the shaping reward, not the task")


def reward_hacking(rows: list[dict], recipe: dict | None) -> list[Hacking]:
    """Each shaping reward that saturated while the primary stayed flat (first fifth -> last fifth of
    the train rows that logged it). Nothing without a primary reward or under MIN_ROWS rows."""
    chosen = primary_reward(recipe)
    if chosen is None:
        return []
    primary = reward_label(chosen)
    rows = [r for r in rows if r.get("split") != "eval"]
    main = fifths(_series(rows, f"rewards/{primary}/mean"))
    if main is None:
        return []
    p_first, p_last = main
    if abs(p_last - p_first) >= FLAT or p_last >= LOW:
        return []
    out = []
    for reward in recipe_rewards(recipe):
        label = reward_label(reward)
        if label == primary or reward.get("kind") == "length":
            continue  # a length reward is a budget, not something to game towards
        values = _series(rows, f"rewards/{label}/mean")
        edges = fifths(values)
        if edges is None:
            continue
        first, last = edges
        if last >= SATURATED and last - first >= RISE:
            out.append(Hacking(label, primary, first, last, p_first, p_last, len(values)))
    return out


def hacking_samples(generations: list[dict], hacking: Hacking, count: int = 3) -> list[dict]:
    """The latest train generations (completions.jsonl records) that score >= SATURATED on the
    shaping reward and at most the primary's flat level: what the policy does instead of the task."""
    out, seen = [], set()
    for record in reversed(generations):
        if record.get("split") == "eval" or record.get("completion") in seen:
            continue  # one line per distinct completion
        scores = record.get("rewards") or {}
        shaping, primary = scores.get(hacking.shaping), scores.get(hacking.primary)
        if isinstance(shaping, (int, float)) and shaping >= SATURATED and (
                primary is None or (isinstance(primary, (int, float)) and primary <= hacking.primary_last)):
            out.append(record)
            seen.add(record.get("completion"))
            if len(out) >= count:
                break
    return out


def sample_text(record: dict, hacking: Hacking, width: int = 60) -> str:
    """One sample as a line: step, the completion (shortened), both scores."""
    completion = " ".join(str(record.get("completion", "")).split())
    if len(completion) > width:
        completion = completion[: width - 1] + "…"
    scores = record.get("rewards") or {}

    def fmt(value) -> str:
        return "-" if not isinstance(value, (int, float)) else f"{value:.2f}"

    return (f"step {record.get('step', '?')}: {completion!r} {hacking.shaping} {fmt(scores.get(hacking.shaping))} "
            f"· {hacking.primary} {fmt(scores.get(hacking.primary))}")


def component_summary(rows: list[dict], recipe: dict | None) -> str | None:
    """The headline (primary) reward first, then the total and each component, first logged step -> last:
    'answer (primary) 0.000 -> 0.400 · total 0.100 -> 1.300 · format 0.100 -> 0.900'."""
    rows = [r for r in rows if r.get("split") != "eval"]
    key = primary_reward_key(recipe)
    labels = [reward_label(r) for r in recipe_rewards(recipe)]
    parts = []

    def edge(name: str, series_key: str) -> None:
        values = _series(rows, series_key)
        if values:
            parts.append(f"{name} {values[0]:.3f} -> {values[-1]:.3f}")

    if key != TOTAL_KEY:
        edge(f"{primary_label(recipe)} (primary)", key)
    edge("total" if key != TOTAL_KEY else "total (primary)", TOTAL_KEY)
    for label in labels:
        if f"rewards/{label}/mean" != key:
            edge(label, f"rewards/{label}/mean")
    return " · ".join(parts) or None


def _held_out(rows: list[dict], recipe: dict | None) -> tuple[str, str, dict, dict] | None:
    """(name, key, first eval row, last eval row) of the headline reward on the held-out prompts; the name is
    the primary reward's, or 'total'."""
    key = "eval_" + primary_reward_key(recipe)
    scored = [r for r in rows if r.get("split") == "eval" and _series([r], key)]
    if not scored:
        return None
    return primary_label(recipe) if key != "eval_" + TOTAL_KEY else "total", key, scored[0], scored[-1]


def held_out_summary(rows: list[dict], recipe: dict | None) -> str | None:
    """The headline reward on the held-out prompts (the eval rows), first evaluation -> last; the first is
    the base's when train.eval_on_start evaluated before step 1:
    'answer (primary) 0.102 (step 0, before training) -> 0.488 (step 40)'."""
    found = _held_out(rows, recipe)
    if found is None:
        return None
    name, key, first, last = found

    def at(row: dict) -> str:
        return f"{row[key]:.3f} (step {row.get('step')}{', before training' if row.get('step') == 0 else ''})"

    label = name if key == "eval_" + TOTAL_KEY else f"{name} (primary)"
    return f"{label} {at(first)}" + (f" -> {at(last)}" if last is not first else "")


def held_out_brief(rows: list[dict], recipe: dict | None) -> str | None:
    """The same in a few words, for the run view's header: 'held out answer 0.102 → 0.488'."""
    found = _held_out(rows, recipe)
    if found is None:
        return None
    name, key, first, last = found
    return f"held out {name} {first[key]:.3f}" + (f" → {last[key]:.3f}" if last is not first else "")


TAIL_BYTES = 512 * 1024  # the end of completions.jsonl read for the samples


def latest_generations(run_dir) -> list[dict]:
    """The last generations of a run folder's completions.jsonl (its last TAIL_BYTES), oldest first."""
    from tuiapp.core.run_folder.completions import completions_path
    from tuiapp.core.run_folder.metrics import parse_record
    from tuiapp.core.run_folder.tail import TextTail

    lines, _ = TextTail(completions_path(run_dir), initial_bytes=TAIL_BYTES).read_new()
    return [record for record in map(parse_record, lines) if record is not None]


def hacking_lines(rows: list[dict], recipe: dict | None, run_dir=None, samples: int = 3) -> list[str]:
    """The warning of each gamed shaping reward, each followed by its samples ('    step 16: ...')."""
    found = reward_hacking(rows, recipe)
    if not found:
        return []
    generations = latest_generations(run_dir) if run_dir is not None else []
    out = []
    for hacking in found:
        out.append(hacking.text())
        out += ["    " + sample_text(r, hacking) for r in hacking_samples(generations, hacking, samples)]
    return out
