"""Method kinds by family, apart from the recipe schema: the TUI's views test a run's method
against these without importing pydantic (~0.5 s the first time a screen opens)."""

PREFERENCE_KINDS = frozenset({"dpo", "simpo", "cpo", "orpo", "kto", "reward"})
RL_KINDS = frozenset({"grpo", "rloo"})
"""Online RL: completions generated during training and scored by reward functions (TRL's GRPO/RLOO)."""
