"""What a recipe on image data must hold before launch: a method that trains image chats, no packing."""

from __future__ import annotations

from tuiapp.core.datasets import DatasetInfo
from tuiapp.core.findings import Finding
from tuiapp.core.recipe import Recipe

VISION_METHODS = ("sft", "lora")


def data_findings(recipe: Recipe, info: DatasetInfo) -> list[Finding]:
    """Findings for a dataset whose records carry images (their files were checked as it was read)."""
    findings = []
    if recipe.method.kind not in VISION_METHODS:
        findings.append(Finding("error", "method.kind", f"method '{recipe.method.kind}' does not train on images yet "
                                f"({info.with_images} record(s) of {info.source} carry images)",
                                f"set method.kind to one of: {', '.join(VISION_METHODS)}"))
    if recipe.train.packing is True:
        findings.append(Finding("error", "train.packing", "packing would mix one example's image tokens with "
                                "another's; image data is never packed", "set train.packing = false"))
    elif recipe.train.packing == "auto":
        findings.append(Finding("info", "train.packing", "image data: batches are padded, not packed", ""))
    return findings
