"""What a vision-language run trains and how big its images get, decided in pure Python: one answer
for the checks before launch, the memory estimate and the trainer (tuiapp.trainer.models.vision).

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

from tuiapp.core.common.methods import VISION_FULL_KINDS
from tuiapp.core.config.recipe import Recipe, weights_method
from tuiapp.core.data import tiny_vlm
from tuiapp.core.data.images import IMAGE_PLACEHOLDER

PARTS = ("language_model", "projector", "vision_tower")
# image processors whose resolution is dynamic, capped by a pixel count (Qwen2-VL's smart_resize)
MAX_PIXELS_PROCESSORS = re.compile(r"^(Qwen2VL|Qwen2_5_VL|Qwen3VL|Glm4v)ImageProcessor")
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def trained_parts(recipe: Recipe) -> dict[str, bool]:
    """Which parts train: {'language_model': True, 'projector': ..., 'vision_tower': ...}."""
    vision = recipe.vision
    projector = vision.train_projector
    if projector == "auto":
        projector = weights_method(recipe.method).kind in VISION_FULL_KINDS  # dpo: its adapter, else every weight
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
    if not max_pixels or not processor or dynamic_resolution(processor):
        return None  # {}: the model is not here yet; the trainer checks its processor
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
    if dynamic_resolution(processor) or "depth" in vision:  # Qwen's towers: by the image's size
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
    if dynamic_resolution(processor) or "depth" in (config.get("vision_config") or {}):
        return None
    return image_tokens(model, config, processor, (1, 1))


def text_tokens_at_least(messages: list[dict]) -> int:
    """A lower bound of a chat's text tokens: one per whitespace-separated word (tokenizers split
    words apart before they merge pieces) and one per turn's end."""
    return sum(len(str(turn.get("content") or "").replace(IMAGE_PLACEHOLDER, " ").split()) + 1 for turn in messages)


# ---------------------------------------------------------------- parameters, for the memory estimate


def _tower_linears(vision: dict) -> tuple[list[tuple[int, int]], int] | None:
    """The vision tower's linear layers as (in, out) pairs over all its layers, and its parameters
    outside them (embeddings, norms, biases' share excluded); None for an unknown tower."""
    kind = vision.get("model_type", "")
    if kind in ("qwen2_vl", "qwen2_5_vl") or "depth" in vision:
        e = int(vision.get("embed_dim") or vision["hidden_size"])
        depth, patch = int(vision["depth"]), int(vision.get("patch_size", 14))
        inner = int(vision.get("intermediate_size") or e * vision.get("mlp_ratio", 4))
        mlp = [(e, inner), (inner, e)] if "embed_dim" in vision else [(e, inner), (e, inner), (inner, e)]
        block = [(e, 3 * e), (e, e), *mlp]
        norms = 4 * e if "embed_dim" in vision else 2 * e  # LayerNorm (Qwen2-VL) or RMSNorm (Qwen2.5-VL)
        embed = int(vision.get("in_channels", vision.get("in_chans", 3))) * int(vision.get("temporal_patch_size", 2)) \
            * patch * patch * e
        return block * depth, embed + depth * norms
    if not {"hidden_size", "intermediate_size", "num_hidden_layers", "patch_size", "image_size"} <= set(vision):
        return None
    h, i, layers = int(vision["hidden_size"]), int(vision["intermediate_size"]), int(vision["num_hidden_layers"])
    patches = (int(vision["image_size"]) // int(vision["patch_size"])) ** 2
    clip = kind.startswith("clip") or "projection_dim" in vision
    channels = int(vision.get("num_channels", 3))
    embed = channels * int(vision["patch_size"]) ** 2 * h + (0 if clip else h)  # CLIP's patch conv has no bias
    embed += (patches + 1) * h + h + 2 * h if clip else patches * h  # + class token and pre-norm (CLIP)
    block = [(h, h)] * 4 + [(h, i), (i, h)]
    other = embed + layers * 2 * 2 * h + 2 * h  # two LayerNorms per layer, the final one
    linears = block * layers
    if not clip and vision.get("vision_use_head", True) and kind != "idefics3_vision":  # SigLIP's pooling head
        linears = linears + [(h, h), (h, i), (i, h)]
        other += h + 2 * h + 3 * h * h + 3 * h  # its probe, LayerNorm and attention's packed input projection
    return linears, other


def vision_parameters(config: dict) -> dict[str, int] | None:
    """{'vision_tower': N, 'projector': M} parameters of a VLM config (Gemma 3, LLaVA: SigLIP or CLIP
    towers; Qwen2-VL, Qwen2.5-VL); None for a config without a vision part this does not know."""
    vision = config.get("vision_config") or {}
    tower = _tower_linears(vision)
    if tower is None:
        return None
    linears, other = tower
    total = other + sum(a * b + b for a, b in linears)
    text = {**config, **(config.get("text_config") or {})}
    th, kind = int(text.get("hidden_size", 0)), config.get("model_type", "")
    vh = int(vision.get("hidden_size", 0))
    if kind.startswith("gemma3"):
        projector = vh * th + vh  # input projection and soft-embedding norm
    elif kind == "llava":
        layers = config.get("vision_feature_layer", -1)
        width = vh * (len(layers) if isinstance(layers, list) else 1)
        projector = width * th + th + th * th + th
    elif "depth" in vision:  # Qwen's merger: 2x2 patches merged, then a two-layer MLP to the text width
        e = int(vision.get("embed_dim") or vision["hidden_size"])
        merged, out = e * int(vision.get("spatial_merge_size", 2)) ** 2, int(vision.get("out_hidden_size") or th)
        norm = 2 * e if "embed_dim" in vision else e
        projector = norm + merged * merged + merged + merged * out + out
    else:
        return None
    return {"vision_tower": total, "projector": projector}


def vision_lora_parameters(config: dict, rank: int) -> int:
    """LoRA parameters on every linear layer of the vision tower (rank x (in + out) each)."""
    tower = _tower_linears(config.get("vision_config") or {})
    return sum(rank * (a + b) for a, b in tower[0]) if tower else 0


def image_tokens_per_image(model: str, config: dict, max_pixels: int = 0) -> int:
    """The most tokens one image takes (fixed-size processors: their count; dynamic resolution: at
    max_pixels, else Qwen2-VL's default of 1280 x 28 x 28 pixels); 0 when unknown."""
    if tiny_vlm.is_tiny_vlm(model):
        return tiny_vlm.image_tokens(model)
    vision = config.get("vision_config") or {}
    if "depth" in vision:
        merged = (int(vision.get("patch_size", 14)) * int(vision.get("spatial_merge_size", 2))) ** 2
        return (max_pixels or 1280 * 28 * 28) // merged + 2
    return image_tokens(model, config, {}, (1, 1)) or 0


def tower_patches(config: dict, image_tokens: int) -> int:
    """Tokens one image is inside the vision tower (before any pooling or merging)."""
    vision = config.get("vision_config") or {}
    if "depth" in vision:
        return max(0, image_tokens - 2) * int(vision.get("spatial_merge_size", 2)) ** 2
    if vision.get("image_size") and vision.get("patch_size"):
        return (int(vision["image_size"]) // int(vision["patch_size"])) ** 2
    return 0


def with_vision(parts: dict[str, int], config: dict, recipe: Recipe, base: int, adapters: int) -> tuple[int, int]:
    """(total, trainable) parameters of a VLM from its language model's (`base` weights, `adapters`
    LoRA parameters on them; 0 for a full fine-tune) and its vision parts, as [vision] trains them."""
    trained = trained_parts(recipe)
    full = adapters == 0
    tower, projector = parts["vision_tower"], parts["projector"]
    total, trainable = base + tower + projector, 0
    if trained["language_model"]:
        trainable += base if full else adapters
        total += 0 if full else adapters
    if trained["vision_tower"]:
        extra = tower if full else vision_lora_parameters(config, getattr(weights_method(recipe.method), "rank", 8))
        trainable += extra
        total += 0 if full else extra
    if trained["projector"]:
        trainable += projector
        total += 0 if full else projector  # peft's modules_to_save: a trained copy beside the frozen one
    return total, trainable
