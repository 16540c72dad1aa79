"""The memory estimate of a vision-language recipe counts the vision tower and the projector (trained or
frozen, as [vision] says) and the image tokens per example; their counts match the real models' (the
trainer's tests build them: tests/trainer/test_vision_parts.py)."""

from __future__ import annotations

from tuiapp.core.config.recipe import Recipe
from tuiapp.core.data import tiny_vlm
from tuiapp.core.plan import estimate, vision_plan


def _estimate(kind: str, vision: dict | None = None, name: str = "tiny-llava", **train):
    recipe = Recipe.model_validate({"model": {"name": name}, "method": {"kind": kind, **({"rank": 4} if kind != "sft"
                                                                                        else {})},
                                    "train": train, "vision": vision or {}})
    return estimate.estimate_recipe(recipe, estimate.load_model_config(name), 1, cuda=False)


def test_the_vision_parts_are_counted_frozen_or_trained():
    config = estimate.load_model_config("tiny-llava")
    parts = vision_plan.vision_parameters(config)
    language = estimate.count_parameters(config)
    assert parts == {"vision_tower": 15392, "projector": 6272}  # as the real tiny-llava holds them
    full = _estimate("sft")
    assert full.total_params == language + 15392 + 6272
    assert full.trainable_params == language + 6272  # the tower frozen, the projector trained
    tower = _estimate("sft", {"train_vision_tower": True})
    assert tower.trainable_params == full.total_params
    assert tower.memory.activations > full.memory.activations  # the tower's activations are kept now
    lora = _estimate("lora")
    adapters = estimate.trainable_parameters(config, lora_method := Recipe.model_validate(
        {"method": {"kind": "lora", "rank": 4}}).method)
    assert lora_method.rank == 4 and lora.trainable_params == adapters
    assert lora.total_params == language + adapters + 15392 + 6272
    both = _estimate("lora", {"train_vision_tower": True, "train_projector": True, "train_language_model": False})
    tower_adapters = vision_plan.vision_lora_parameters(config, 4)
    assert tower_adapters == 4 * (4 * (32 + 32) + (32 + 64) + (64 + 32))
    assert both.trainable_params == tower_adapters + 6272


def test_image_tokens_are_shown_per_image():
    text = estimate.format_estimate(_estimate("lora", name="tiny-vlm"))
    assert ("images       vision tower 23.8K params (frozen), projector 2.1K (frozen), up to "
            f"{tiny_vlm.image_tokens('tiny-vlm')} tokens per image, inside max_seq_len") in text
    assert _estimate("lora", name="tiny-vlm").vision["image_tokens"] == 6
    assert _estimate("lora", name="tiny").vision is None


def test_dynamic_resolution_image_tokens_follow_max_pixels():
    config = {"model_type": "qwen2_5_vl", "hidden_size": 2048, "vision_config": {
        "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "out_hidden_size": 2048, "patch_size": 14,
        "spatial_merge_size": 2, "num_heads": 16}}
    assert vision_plan.image_tokens_per_image("Qwen/Qwen2.5-VL-3B-Instruct", config) == 1282
    assert vision_plan.image_tokens_per_image("Qwen/Qwen2.5-VL-3B-Instruct", config, 448 * 448) == 258
    assert vision_plan.tower_patches(config, 258) == 1024
    parts = vision_plan.vision_parameters(config)
    assert 660e6 < parts["vision_tower"] + parts["projector"] < 680e6  # Qwen2.5-VL's 670M vision encoder
