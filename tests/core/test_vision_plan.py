"""[vision] before launch: which parts train and at what rate, max_pixels against the image processor,
and image records over train.max_seq_len named with the fix (an image's tokens are never cut)."""

from __future__ import annotations

import json

import pytest
from PIL import Image

from tuiapp.core.config.recipe import Recipe, RecipeError, parse_recipe
from tuiapp.core.data import datasets
from tuiapp.core.plan import vision_plan
from tuiapp.core.prelaunch import vision_checks


def recipe(kind="lora", vision=None, **train) -> Recipe:
    return Recipe.model_validate({"model": {"name": "tiny-vlm"}, "dataset": {"name": "demo:shapes"},
                                  "method": {"kind": kind}, "train": {"packing": False, **train},
                                  "vision": vision or {}})


def findings(r: Recipe):
    return vision_checks.data_findings(r, datasets.inspect_dataset(r.dataset))


def test_defaults_freeze_the_tower_and_train_the_projector_only_in_a_full_fine_tune():
    assert vision_plan.trained_parts(recipe("sft")) == {"language_model": True, "projector": True,
                                                        "vision_tower": False}
    assert vision_plan.trained_parts(recipe("lora")) == {"language_model": True, "projector": False,
                                                         "vision_tower": False}
    r = recipe("sft", {"train_vision_tower": True, "vision_tower_lr": 1e-5}, learning_rate=1e-3)
    assert vision_plan.part_lrs(r) == {"language_model": 1e-3, "projector": 1e-3, "vision_tower": 1e-5}


def test_the_vision_table_is_strict_and_described():
    with pytest.raises(RecipeError, match="unknown key 'train_tower'") as caught:
        parse_recipe('[method]\nkind = "lora"\n[vision]\ntrain_tower = true\n')
    assert "train_vision_tower" in caught.value.fix
    for name, info in Recipe.model_fields["vision"].annotation.model_fields.items():
        assert info.description, name


def test_nothing_to_train_and_lora_without_a_part_for_adapters_are_refused():
    frozen = findings(recipe("sft", {"train_language_model": False, "train_projector": False}))
    assert [f.message for f in frozen if f.level == "error"] == [
        "nothing would train: the language model, the projector and the vision tower are all frozen"]
    projector_only = findings(recipe("lora", {"train_language_model": False, "train_projector": True}))
    (error,) = [f for f in projector_only if f.level == "error"]
    assert "needs a part to put adapters on" in error.message and "'sft' to train the projector alone" in error.fix
    unused = findings(recipe("lora", {"projector_lr": 1e-3}))
    assert [(f.level, f.key) for f in unused if f.level != "info"] == [("warning", "vision.projector_lr")]
    assert not [f for f in findings(recipe("lora", {"train_vision_tower": True})) if f.level != "info"]


def test_max_pixels_is_refused_for_a_fixed_size_processor():
    (error,) = [f for f in findings(recipe("lora", {"max_pixels": 50_000})) if f.level == "error"]
    assert error.key == "vision.max_pixels" and "resizes every image to 32x32 pixels" in error.message
    assert "remove vision.max_pixels" in error.fix


def test_a_record_over_max_seq_len_is_named_with_the_fix():
    (error,) = [f for f in findings(recipe(max_seq_len=16)) if f.level == "error"]
    assert error.key == "train.max_seq_len"
    assert error.message.startswith("record 3 of demo:shapes (and ")
    assert "6 image tokens + at least 12 text tokens, over train.max_seq_len (16)" in error.message
    assert "raise train.max_seq_len above" in error.fix and "drop those records" in error.fix
    assert not [f for f in findings(recipe(max_seq_len=128)) if f.level == "error"]


def qwen2_vl_folder(tmp_path, max_pixels: int):
    folder = tmp_path / "qwen2-vl"
    folder.mkdir()
    text = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096}
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", **text,
        "text_config": {"model_type": "qwen2_vl_text", **text},
        "vision_config": {"depth": 2, "embed_dim": 32, "hidden_size": 64, "num_heads": 2, "patch_size": 14}}))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2,
        "temporal_patch_size": 2, "min_pixels": 3136, "max_pixels": max_pixels}))
    return folder


def image_records(tmp_path, side: int, count: int = 2):
    Image.new("RGB", (side, side), (200, 0, 0)).save(tmp_path / "big.png")
    line = json.dumps({"messages": [{"role": "user", "content": "<image>What colour?"},
                                    {"role": "assistant", "content": "red"}], "images": ["big.png"]})
    (tmp_path / "data.jsonl").write_text((line + "\n") * count)
    return str(tmp_path / "data.jsonl")


def test_dynamic_resolution_counts_image_tokens_from_the_image_size_and_max_pixels(tmp_path):
    from transformers import Qwen2VLImageProcessor

    processor = vision_plan.processor_config(qwen2_vl_folder(tmp_path, 1280 * 28 * 28))
    assert vision_plan.dynamic_resolution(processor) and vision_plan.max_pixels_problem(processor, 10_000) is None
    reference = Qwen2VLImageProcessor()
    for size, cap in (((448, 448), 0), ((640, 480), 0), ((1000, 700), 200_000)):
        patches = reference.get_number_of_image_patches(size[1], size[0], {"max_pixels": cap} if cap else {})
        assert vision_plan.image_tokens("x", {}, processor, size, cap) == patches // 4 + 2


def test_a_large_image_over_max_seq_len_names_max_pixels_in_the_fix(tmp_path):
    folder = qwen2_vl_folder(tmp_path, 1280 * 28 * 28)
    data = image_records(tmp_path, 896)
    r = Recipe.model_validate({"model": {"name": str(folder)}, "dataset": {"name": data},
                               "method": {"kind": "lora"}, "train": {"max_seq_len": 512, "packing": False}})
    (error,) = [f for f in findings(r) if f.level == "error"]
    assert "record 1 of" in error.message and "1026 image tokens" in error.message
    assert "lower vision.max_pixels" in error.fix
    capped = r.model_copy(update={"vision": r.vision.model_copy(update={"max_pixels": 448 * 448})})
    assert not [f for f in findings(capped) if f.level == "error"]


def test_a_vision_table_on_a_text_model_is_a_warning(tmp_path):
    from tuiapp.core.prelaunch import door
    from tuiapp.core.store.runs import RunStore

    text = Recipe.model_validate({"model": {"name": "tiny"}, "method": {"kind": "lora"},
                                  "vision": {"train_vision_tower": True}})
    found = [f for f in door.recipe_findings(text, RunStore(tmp_path), tmp_path) if f.key == "vision"]
    assert [(f.level, f.message) for f in found] == [
        ("warning", "'tiny' is not a vision-language model, so vision.train_vision_tower changes nothing")]
    assert not vision_checks.unused_findings(recipe(vision={"train_vision_tower": True}))  # tiny-vlm
    assert not vision_checks.unused_findings(Recipe.model_validate({"method": {"kind": "lora"}}))
