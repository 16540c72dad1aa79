"""What a vision-language run trains and how big its images get, decided in pure Python: one answer
for the checks before launch, the memory estimate and the trainer (tuiapp.trainer.vision).

A VLM has three parts: the language model, the projector (the connector that maps image features
into the language model's embeddings) and the vision tower (the image encoder). `[vision]` says
which of them train and at what learning rate. The image tokens an example holds follow from the
model's config and its image processor: a fixed count per image for processors that resize every
image to one size (Gemma 3, LLaVA), or the image's own size for Qwen2-VL's dynamic resolution, where
`vision.max_pixels` caps it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from tuiapp.core import tiny_vlm
from tuiapp.core.images import IMAGE_PLACEHOLDER
from tuiapp.core.recipe import Recipe

PARTS = ("language_model", "projector", "vision_tower")
FULL_KINDS = ("sft",)  # every weight of a trained part trains; the rest put adapters on it
# image processors whose resolution is dynamic, capped by a pixel count (Qwen2-VL's smart_resize)
MAX_PIXELS_PROCESSORS = re.compile(r"^(Qwen2VL|Qwen2_5_VL|Qwen3VL|Glm4v)ImageProcessor")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def trained_parts(recipe: Recipe) -> dict[str, bool]:
    """Which parts train: {'language_model': True, 'projector': ..., 'vision_tower': ...}."""
    vision = recipe.vision
    projector = vision.train_projector
    if projector == "auto":
        projector = recipe.method.kind in FULL_KINDS
    return {"language_model": vision.train_language_model, "projector": bool(projector),
            "vision_tower": vision.train_vision_tower}


def part_lrs(recipe: Recipe) -> dict[str, float]:
    """Each trained part's peak learning rate (vision.*_lr, else train.learning_rate)."""
    base = recipe.train.learning_rate
    own = {"language_model": 0.0, "projector": recipe.vision.projector_lr,
           "vision_tower": recipe.vision.vision_tower_lr}
    return {part: own[part] or base for part, on in trained_parts(recipe).items() if on}


# ---------------------------------------------------------------- the image processor


def processor_config(folder: Path | None) -> dict:
    """The image processor's settings saved with a model folder ({} when there are none)."""
    for name in PROCESSOR_FILES if folder is not None else ():
        try:
            data = json.loads((Path(folder) / name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data.get("image_processor", data) if name == "processor_config.json" else data
    return {}


def dynamic_resolution(processor: dict) -> bool:
    """Whether the image processor resizes by a pixel budget (so max_pixels applies)."""
    return bool(MAX_PIXELS_PROCESSORS.match(str(processor.get("image_processor_type", ""))))


def max_pixels_problem(processor: dict, max_pixels: int) -> tuple[str, str] | None:
    """(problem, fix) when vision.max_pixels cannot apply to this image processor; None when it can."""
    if not max_pixels or dynamic_resolution(processor):
        return None
    kind = processor.get("image_processor_type") or "this model's image processor"
    size = processor.get("size") or {}
    fixed = f" to {size['height']}x{size['width']} pixels" if {"height", "width"} <= set(size) else ""
    return (f"vision.max_pixels = {max_pixels}: {kind} resizes every image{fixed}, whatever its size, so a pixel "
            "limit cannot change its image tokens",
            "remove vision.max_pixels (it applies to dynamic-resolution processors such as Qwen2-VL's)")


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize: both sides multiples of `factor`, the area within [min_pixels, max_pixels]."""
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_tokens(model: str, config: dict, processor: dict, size: tuple[int, int], max_pixels: int = 0) -> int | None:
    """Tokens one image of `size` (width, height) takes in the sequence, its start/end markers included;
    None for an architecture this does not know (then nothing is checked)."""
    if tiny_vlm.is_tiny_vlm(model):
        return tiny_vlm.image_tokens(model)
    kind = config.get("model_type", "")
    vision = config.get("vision_config") or {}
    if dynamic_resolution(processor):
        patch, merge = processor.get("patch_size", 14), processor.get("merge_size", 2)
        bounds = processor.get("size") or {}
        low = processor.get("min_pixels") or bounds.get("shortest_edge") or 56 * 56
        high = max_pixels or processor.get("max_pixels") or bounds.get("longest_edge") or 28 * 28 * 1280
        height, width = smart_resize(size[1], size[0], patch * merge, low, high)
        return (height // patch) * (width // patch) // (merge * merge) + 2  # + vision start and end
    if kind.startswith("gemma3") and config.get("mm_tokens_per_image"):
        return int(config["mm_tokens_per_image"]) + 2  # + start and end of image
    if kind in ("llava", "mistral3") and vision.get("image_size") and vision.get("patch_size"):
        return (vision["image_size"] // vision["patch_size"]) ** 2
    return None


def fixed_image_tokens(model: str, config: dict, processor: dict) -> int | None:
    """Tokens per image where they do not depend on its size (None: dynamic or unknown)."""
    if dynamic_resolution(processor):
        return None
    return image_tokens(model, config, processor, (1, 1))


def text_tokens_at_least(messages: list[dict]) -> int:
    """A lower bound of a chat's text tokens: one per whitespace-separated word (tokenizers split
    words apart before they merge pieces) and one per turn's end."""
    return sum(len(str(turn.get("content") or "").replace(IMAGE_PLACEHOLDER, " ").split()) + 1 for turn in messages)
