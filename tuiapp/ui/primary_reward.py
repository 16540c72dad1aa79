"""Which reward the history's `reward` column shows for a grpo/rloo run: what the run was for.

A run's total reward mixes its rewards (a format reward that a degenerate completion satisfies
lifts it), so the column shows the task's reward: the reward marked `primary = true`, else the
first `answer` reward, else the weighted total. The rule itself lives in
tuiapp.core.run_folder.reward_health (`llmtui show` and the run view's hacking warning use it too)."""

from __future__ import annotations

from tuiapp.core.run_folder.reward_health import TOTAL_KEY, primary_reward_key, reward_label

_label = reward_label  # the name earlier callers used

__all__ = ["TOTAL_KEY", "primary_reward_key", "reward_label"]
