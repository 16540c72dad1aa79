"""Which reward the history's `reward` column shows for a grpo/rloo run: what the run was for.

A run's total reward mixes its rewards (a format reward that a degenerate completion satisfies
lifts it), so the column shows the task's reward: the reward marked `primary = true` (should the
recipe ever get that flag), else the first `answer` reward, else the weighted total. This is the
one place that choice is made."""

from __future__ import annotations

TOTAL_KEY = "reward"  # TRL's weighted total of a step's rewards


def _label(reward: dict) -> str:
    """The name a reward logs under (core.config.rewards' label()): its name, else a python
    reward's function name, else its kind."""
    if reward.get("name"):
        return str(reward["name"])
    function = str(reward.get("function") or "")
    if reward.get("kind") == "python" and ":" in function:
        return function.rsplit(":", 1)[1]
    return str(reward.get("kind") or "")


def primary_reward_key(recipe: dict | None) -> str:
    """The metrics key of the reward the column shows: `rewards/NAME/mean`, or the total."""
    method = (recipe or {}).get("method") if isinstance(recipe, dict) else None
    rewards = [r for r in ((method or {}).get("rewards") or []) if isinstance(r, dict)] if isinstance(method, dict) else []
    chosen = (next((r for r in rewards if r.get("primary") is True), None)
              or next((r for r in rewards if r.get("kind") == "answer"), None))
    return f"rewards/{_label(chosen)}/mean" if chosen else TOTAL_KEY
