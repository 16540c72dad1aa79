"""What a recipe on image data must hold before launch: a vision-language model, a method that trains
image chats, no packing."""

from __future__ import annotations

from pathlib import Path

from tuiapp.core import estimate, tiny_vlm
from tuiapp.core.datasets import DatasetInfo
from tuiapp.core.errors import UserError
from tuiapp.core.findings import Finding
from tuiapp.core.recipe import BUNDLED_MODEL, Recipe

VISION_METHODS = ("sft", "lora")


def is_vision_model(name: str, base_dir: Path | None = None) -> bool | None:
    """Whether model.name is a vision-language model (its config has a vision part); None when its
    config cannot be read here."""
    if tiny_vlm.is_tiny_vlm(name):
        return True
    if name == BUNDLED_MODEL:
        return False
    try:
        config = estimate.load_model_config(name, base_dir)
    except UserError:
        return None
    return "vision_config" in config


def data_findings(recipe: Recipe, info: DatasetInfo, base_dir: Path | None = None) -> list[Finding]:
    """Findings for a dataset whose records carry images (their files were checked as it was read)."""
    findings = []
    images = f"{info.with_images} record(s) of {info.source} carry images"
    if is_vision_model(recipe.model.name, base_dir) is False:
        findings.append(Finding("error", "model.name", f"'{recipe.model.name}' is not a vision-language model "
                                f"({images})", "use a vision-language model, e.g. model.name = 'tiny-vlm' offline, "
                                "or data without images"))
    if recipe.method.kind not in VISION_METHODS:
        findings.append(Finding("error", "method.kind", f"method '{recipe.method.kind}' does not train on images yet "
                                f"({images})", f"set method.kind to one of: {', '.join(VISION_METHODS)}"))
    if recipe.train.packing is True:
        findings.append(Finding("error", "train.packing", "packing would mix one example's image tokens with "
                                "another's; image data is never packed", "set train.packing = false"))
    elif recipe.train.packing == "auto":
        findings.append(Finding("info", "train.packing", "image data: batches are padded, not packed", ""))
    return findings
