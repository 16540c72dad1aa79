"""The sequence-parallel line of `llmtui show` and the run view, read from a run folder's recipe.toml
without the recipe schema (the run view opens without pydantic)."""

from __future__ import annotations

import tomllib

from tuiapp.core.run_folder.rundir import RunDir


def show_lines(run_path) -> list[str]:
    """`llmtui show` lines of a sequence-parallel run: the degree and each rank's share of a sequence."""


    try:
        data = tomllib.loads(RunDir(run_path).recipe_toml.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return []
    train = data.get("train") or {}
    n = int(train.get("sequence_parallel", 1) or 1)
    if n <= 1:
        return []
    seq = int(train.get("max_seq_len", 512))
    return [f"  sequence  parallel degree {n}: each rank holds {(seq + (-seq % n)) // n:,} of every {seq:,}-token "
            "sequence (tokens/s counts whole sequences)"]
