"""`llmtui show`'s line for a distill run, from its metric rows: the KL to the teacher, the
cross-entropy and the top-1 agreement, first logged step -> last, and the held-out figures of the
first and last evaluation (the trainer writes them: tuiapp/trainer/methods/distill.py)."""

from __future__ import annotations

import math


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _change(rows: list[dict], key: str, label: str, percent: bool = False) -> str | None:
    values = [r[key] for r in rows if _number(r.get(key))]
    if not values:
        return None
    fmt = (lambda v: f"{v:.0%}") if percent else (lambda v: f"{v:.3f}")
    return f"{label} {fmt(values[0])} -> {fmt(values[-1])}"


def show_lines(rows: list[dict]) -> list[str]:
    """[] for a run whose rows carry no `top1_agree` (any other method: KTO logs a `kl` too)."""
    train = [r for r in rows if r.get("split", "train") == "train"]
    evals = [r for r in rows if r.get("split") == "eval"]
    parts = [p for p in (_change(train, "kl", "kl"), _change(train, "ce", "ce"),
                         _change(train, "top1_agree", "top-1 agreement", percent=True)) if p]
    if not parts or not any(_number(r.get("top1_agree")) for r in train):
        return []
    on_policy = sum(r["on_policy"] for r in train if _number(r.get("on_policy")))
    if any("on_policy" in r for r in train):
        parts.append(f"{on_policy:.0f} on-policy batches")
    out = ["  distill   " + " · ".join(parts)]
    held = [p for p in (_change(evals, "eval_kl", "kl"), _change(evals, "eval_top1_agree", "top-1 agreement",
                                                                  percent=True)) if p]
    if held:
        out.append("  held out  " + " · ".join(held))
    return out
