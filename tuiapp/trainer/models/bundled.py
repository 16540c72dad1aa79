"""The models llmtui builds itself, by name: 'tiny' (tuiapp.trainer.models.tiny), the distillation student
'tiny-student' (tuiapp.trainer.models.tiny_student) and the tiny vision-language models 'tiny-vlm' /
'tiny-llava' (tuiapp.trainer.models.vision), each made on first use."""

from __future__ import annotations

from pathlib import Path

from tuiapp.core.data.tiny_vlm import is_tiny_vlm
from tuiapp.core.plan.distill import STUDENT_NAME
from tuiapp.trainer.models.tiny import ensure_tiny_model
from tuiapp.trainer.models.vision import ensure_tiny_vlm


def resolve_model_path(name: str, cache_dir: Path | str | None = None) -> str:
    """A bundled model's folder for its name; other names are returned unchanged."""
    if is_tiny_vlm(name):
        return str(ensure_tiny_vlm(name, cache_dir))
    if name == STUDENT_NAME:
        from tuiapp.trainer.models.tiny_student import ensure_tiny_student

        return str(ensure_tiny_student(cache_dir))
    return str(ensure_tiny_model(cache_dir)) if name == "tiny" else name
