"""What trains in a vision-language model ([vision]): after a few real Trainer steps on the tiny VLMs,
frozen parts are bit-identical and trained ones changed, each part's learning rate is an optimizer
param group of its own; max_pixels caps a dynamic-resolution processor and is refused by a fixed-size
one; an example over max_seq_len is an error, never cut."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from tuiapp.core.common.errors import DatasetError, RecipeError
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.plan import estimate, vision_plan
from tuiapp.trainer.models import vision

CHAT = [{"role": "user", "content": "<image>What colour is it?"}, {"role": "assistant", "content": "red"}]


def _records(tmp_path, count=4) -> list[dict]:
    records = []
    for index in range(count):
        path = tmp_path / f"{index}.png"
        Image.new("RGB", (24, 16), (40 * index, 0, 200)).save(path)
        records.append({"messages": json.dumps(CHAT), "images": [str(path)]})
    return records


def _train(name: str, recipe: Recipe, tmp_path):
    """Two real Trainer steps; (model, weights before, the trainer)."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    class PartTrainer(vision.PartLearningRates, Trainer):
        pass

    folder = str(vision.ensure_tiny_vlm(name))
    processor = vision.load_processor(folder)
    model = vision.apply_vision_method(vision.load_vision_model(recipe, folder, "fp32"), recipe)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=2,
                             learning_rate=recipe.train.learning_rate, lr_scheduler_type="constant",
                             report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                             remove_unused_columns=False, dataloader_num_workers=0)
    trainer = PartTrainer(model=model, args=args, train_dataset=Dataset.from_list(_records(tmp_path)),
                          data_collator=vision.VisionCollator(processor, recipe.train.max_seq_len))
    trainer.part_lrs = vision.part_param_lrs(model, recipe)
    trainer.train()
    return model, before, trainer


def _changed(model, before) -> dict[str, set[str]]:
    """{'changed': parts with a changed tensor, 'same': parts with an unchanged one} by part."""
    out: dict[str, set[str]] = {"changed": set(), "same": set()}
    for name, param in model.named_parameters():
        if name in before:
            key = "same" if torch.equal(param.detach(), before[name]) else "changed"
            out[key].add(vision.part_of(name))
    return out


def _lrs(trainer) -> dict[str, set[float]]:
    """{part: the learning rates of the optimizer groups holding its parameters}."""
    part_of = {id(p): vision.part_of(n) for n, p in trainer.model.named_parameters()}
    out: dict[str, set[float]] = {}
    for group in trainer.optimizer.param_groups:
        for param in group["params"]:
            out.setdefault(part_of[id(param)], set()).add(group["lr"])
    return out


@pytest.mark.slow
def test_full_fine_tune_trains_the_projector_at_its_own_rate_and_keeps_the_tower_frozen(tmp_path, llmtui_cache):
    recipe = Recipe.model_validate({"model": {"name": "tiny-llava"}, "method": {"kind": "sft"},
                                    "train": {"learning_rate": 1e-2}, "vision": {"projector_lr": 3e-3}})
    model, before, trainer = _train("tiny-llava", recipe, tmp_path)
    seen = _changed(model, before)
    assert seen["same"] == {"vision_tower"}  # every tower tensor identical, nothing else untouched
    assert seen["changed"] == {"language_model", "projector"}
    assert not any(p.requires_grad for n, p in model.named_parameters() if vision.part_of(n) == "vision_tower")
    assert _lrs(trainer) == {"language_model": {1e-2}, "projector": {3e-3}}


@pytest.mark.slow
def test_lora_on_the_tower_with_the_projector_whole_and_the_language_model_frozen(tmp_path, llmtui_cache):
    recipe = Recipe.model_validate({"model": {"name": "tiny-vlm"}, "method": {"kind": "lora", "rank": 4},
                                    "train": {"learning_rate": 1e-2},
                                    "vision": {"train_language_model": False, "train_vision_tower": True,
                                               "train_projector": True, "vision_tower_lr": 2e-3}})
    model, before, trainer = _train("tiny-vlm", recipe, tmp_path)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {vision.part_of(n) for n in trainable} == {"vision_tower", "projector"}
    assert all("lora_" in n for n in trainable if vision.part_of(n) == "vision_tower")
    assert all("modules_to_save" in n for n in trainable if vision.part_of(n) == "projector")
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and changed <= trainable  # every base weight bit-identical
    assert any("vision_tower" in n and "lora_B" in n for n in changed)
    assert any("modules_to_save" in n for n in changed)
    assert _lrs(trainer) == {"vision_tower": {2e-3}, "projector": {1e-2}}
    tower_adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert tower_adapters == vision_plan.vision_lora_parameters(estimate.load_model_config("tiny-vlm"), 4)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(vision.TINY_VLMS))
def test_the_estimate_counts_the_real_vision_parts(name, llmtui_cache):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(vision.ensure_tiny_vlm(name)))
    assert vision_plan.vision_parameters(estimate.load_model_config(name)) == _part_counts(model)
    config = model.config.to_dict()
    assert vision_plan.vision_parameters(config) == _part_counts(model)  # from the saved config too
    total = sum(p.numel() for p in model.parameters())
    recipe = Recipe.model_validate({"model": {"name": name}, "method": {"kind": "sft"}})
    estimated = estimate.estimate_recipe(recipe, estimate.load_model_config(name), 1, cuda=False).total_params
    assert total <= estimated <= total * 1.4  # the language model's vocab is an upper bound


def _part_counts(model) -> dict[str, int]:
    counts = {"vision_tower": 0, "projector": 0}
    for name, param in model.named_parameters():
        if vision.part_of(name) in counts:
            counts[vision.part_of(name)] += param.numel()
    return counts


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl"])
def test_the_estimate_counts_qwen_vision_parts_as_transformers_builds_them(family):
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLConfig, Qwen2VLConfig

    text = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2}
    config = Qwen2VLConfig(text_config=text, vision_config={"depth": 2, "embed_dim": 32, "hidden_size": 64,
                                                              "num_heads": 2, "mlp_ratio": 4}) \
        if family == "qwen2_vl" else Qwen2_5_VLConfig(text_config=text, vision_config={
            "depth": 2, "hidden_size": 32, "intermediate_size": 48, "out_hidden_size": 64, "num_heads": 2})
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    assert vision_plan.vision_parameters(config.to_dict()) == _part_counts(model)


def test_max_pixels_caps_a_dynamic_processor_and_is_refused_by_a_fixed_one(llmtui_cache):
    from transformers import Qwen2VLImageProcessor

    qwen = Qwen2VLImageProcessor()
    image = Image.new("RGB", (448, 448))
    full = qwen(images=[image], return_tensors="pt")["image_grid_thw"].prod().item()
    vision.apply_max_pixels(qwen, 112 * 112)
    capped = qwen(images=[image], return_tensors="pt")["image_grid_thw"].prod().item()
    assert (full, capped) == (32 * 32, 8 * 8)

    gemma = vision.load_processor(str(vision.ensure_tiny_vlm("tiny-vlm")))
    with pytest.raises(RecipeError, match="resizes every image to 32x32 pixels") as caught:
        vision.apply_max_pixels(gemma, 112 * 112)
    assert caught.value.key == "vision.max_pixels" and "remove vision.max_pixels" in caught.value.fix


@pytest.mark.slow
def test_an_example_over_max_seq_len_is_an_error_never_cut(tmp_path, llmtui_cache):
    processor = vision.load_processor(str(vision.ensure_tiny_vlm("tiny-llava")))
    records = _records(tmp_path, 2)
    with pytest.raises(DatasetError, match=r"record 1 \(and 1 more of the first 1000\): \d+ tokens with its images, "
                       r"over train.max_seq_len \(20\)") as caught:
        vision.check_lengths(records, vision.VisionCollator(processor), 20, "data.jsonl")
    assert "lower vision.max_pixels" in caught.value.fix and "drop the record" in caught.value.fix
    with pytest.raises(DatasetError, match="an example: \\d+ tokens with its images"):
        vision.VisionCollator(processor, 20)(records)  # the trainer's collator: an error, not a cut
    assert vision.VisionCollator(processor, 64)(records)["input_ids"].shape[1] <= 64


@pytest.mark.slow
def test_dora_trains_its_magnitudes_and_directions_on_a_vlm(tmp_path, llmtui_cache):
    """DoRA on images: weight-decomposed adapters (magnitude vectors beside the LoRA matrices) on the
    language model, the vision tower and projector frozen, the base weights untouched."""
    recipe = Recipe.model_validate({"model": {"name": "tiny-vlm"}, "method": {"kind": "dora", "rank": 4},
                                    "train": {"learning_rate": 1e-2}})
    model, before, _ = _train("tiny-vlm", recipe, tmp_path)
    magnitudes = [n for n, p in model.named_parameters() if "lora_magnitude_vector" in n and p.requires_grad]
    assert magnitudes and all(vision.part_of(n) == "language_model" for n in magnitudes)
    changed = {n for n, p in model.named_parameters() if n in before and not torch.equal(p.detach(), before[n])}
    assert any("lora_magnitude_vector" in n for n in changed) and any("lora_B" in n for n in changed)
    assert not any("base_layer" in n or vision.part_of(n) != "language_model" for n in changed)
