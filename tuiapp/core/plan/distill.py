"""Knowledge distillation's teacher, on the pure side: the bundled 'tiny-teacher' definition, the
teacher's config and parameter count for the memory estimate (one extra frozen copy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TEACHER_NAME = "tiny-teacher"  # a wider tiny Llama with the tiny model's tokenizer (tuiapp.trainer.distill builds it)
BUNDLED_TEACHERS = ("tiny", TEACHER_NAME)


def tiny_teacher_config() -> dict[str, Any]:
    """The bundled teacher: the tiny model's shape and vocab, 1.5 times as wide, with a larger init
    range so its random next-token distributions are peaked (something to learn) rather than flat."""
    from tuiapp.core.plan.estimate import TINY_CONFIG

    return {**TINY_CONFIG, "hidden_size": 192, "intermediate_size": 528, "initializer_range": 0.2}


def teacher_config(name: str, base_dir: str | Path | None = None) -> dict:
    """The teacher's HF config dict (a bundled name's definition, else as estimate.load_model_config
    reads a model name); RecipeError when it cannot be read."""
    if name == TEACHER_NAME:
        return tiny_teacher_config()
    from tuiapp.core.plan.estimate import load_model_config

    return load_model_config(name, base_dir)


def teacher_parameters(name: str, base_dir: str | Path | None = None) -> int:
    """The teacher's parameter count; 0 when its config cannot be read (the checks say why)."""
    from tuiapp.core.common.errors import UserError
    from tuiapp.core.plan.estimate import count_parameters

    try:
        return count_parameters(teacher_config(name, base_dir))
    except (UserError, KeyError, TypeError, ValueError):
        return 0
