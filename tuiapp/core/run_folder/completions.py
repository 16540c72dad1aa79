"""completions.jsonl: every generation of an online RL run (grpo, rloo), one JSON object a line.

Rank 0 appends one line per completion (tuiapp.trainer.methods.rl), in JsonlWriter's format:

    {"time": ..., "step": 3, "prompt": "What is 2 + 3? ...", "completion": "5",
     "rewards": {"format": 1.0, "answer": 1.0}, "reward": 2.0, "advantage": 0.71,
     "tokens": 2, "clipped": false}

`rewards` holds each reward function's score (null where it gave none), `reward` their weighted
total; generations of an evaluation add "split": "eval". A multi-turn rollout (tools) adds
"turns": [{"role": "model" | "tool_call" | "tool", "content": ...}], the completion as the model
wrote it, its tool calls and the results it read. A resume rewrites the file without the
steps past its checkpoint. This module turns a line into a typed Generation and follows the file
by byte offset (a TextTail: only new bytes, from the last `initial_bytes` on the first read).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.run_folder.tail import TextTail

COMPLETIONS_FILE = rundir.COMPLETIONS_JSONL


@dataclass(frozen=True)
class Generation:
    """One scored completion of a prompt."""

    step: int
    prompt: str
    completion: str
    rewards: dict[str, float | None] = field(default_factory=dict)  # each reward function's score
    reward: float | None = None  # the weighted total
    advantage: float | None = None
    tokens: int | None = None
    clipped: bool = False  # reached max_completion_length
    split: str = "train"
    time: float | None = None
    turns: tuple[tuple[str, str], ...] = ()  # a multi-turn rollout: (role, text), role model/tool_call/tool


TURN_ROLES = ("model", "tool_call", "tool")


def _turns(value: object) -> tuple[tuple[str, str], ...]:
    """A record's `turns` ([{"role", "content"}]) as (role, text) pairs; () when absent or malformed."""
    if not isinstance(value, list):
        return ()
    out = []
    for turn in value:
        if isinstance(turn, dict) and turn.get("role") in TURN_ROLES:
            out.append((str(turn["role"]), str(turn.get("content") or "")))
    return tuple(out)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        number = float(value)  # NaN/inf are written as strings
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def parse_generation(row: object) -> Generation | None:
    """A completions.jsonl object as a Generation; None when it is not one (no integer step)."""
    if not isinstance(row, dict):
        return None
    step = row.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    rewards = row.get("rewards")
    scores = {str(k): _number(v) for k, v in rewards.items()} if isinstance(rewards, dict) else {}
    tokens = row.get("tokens")
    return Generation(
        step=step,
        prompt=str(row.get("prompt") or ""),
        completion=str(row.get("completion") or ""),
        rewards=scores,
        reward=_number(row.get("reward")),
        advantage=_number(row.get("advantage")),
        tokens=tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None,
        clipped=row.get("clipped") is True,
        split="eval" if row.get("split") == "eval" else "train",
        time=_number(row.get("time")),
        turns=_turns(row.get("turns")),
    )


def parse_line(line: str | bytes) -> Generation | None:
    """One line of the file; None for a blank, malformed or foreign line."""
    try:
        return parse_generation(orjson.loads(line))
    except (orjson.JSONDecodeError, RecursionError):
        return None


def completions_path(run_dir: str | Path) -> Path:
    return RunDir(run_dir).completions


class GenerationsTail:
    """The new generations of a run's completions.jsonl on each read, by byte offset."""

    def __init__(self, run_dir: str | Path, initial_bytes: int = 2 << 20):
        self._tail = TextTail(completions_path(run_dir), initial_bytes=initial_bytes)

    def read_new(self) -> tuple[list[Generation], bool]:
        """(new generations, reset): reset when reading (re)started (the first read, a resume's
        rewrite of the file), so the caller drops what it holds."""
        lines, reset = self._tail.read_new()
        found = [g for g in map(parse_line, lines) if g is not None]
        return found, reset
