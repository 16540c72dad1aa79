"""DPO on image preference pairs: the records carry their prompt's images, the checks before launch
take them (dpo with a LoRA adapter; other adapters refused), and a real TRL DPOTrainer takes steps on
the tiny VLM through its processor: base weights bit-identical, the adapters and the projector trained
at their own learning rates."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from tuiapp.core.common.errors import DatasetError
from tuiapp.core.config.recipe import DatasetSpec, Recipe
from tuiapp.core.data import datasets
from tuiapp.core.prelaunch import vision_checks

COLOURS = {"red": (255, 0, 0), "blue": (0, 0, 255), "green": (0, 200, 0), "yellow": (250, 250, 0)}


def pair_file(folder, prompt: str = "<image>What colour is it?", images_per_record: int = 1):
    (folder / "images").mkdir(exist_ok=True)
    lines = []
    for index, (name, rgb) in enumerate(COLOURS.items()):
        Image.new("RGB", (32, 32), rgb).save(folder / "images" / f"{index}.png")
        wrong = "blue" if name != "blue" else "red"
        lines.append(json.dumps({"messages": [{"role": "user", "content": prompt}],
                                 "chosen": {"role": "assistant", "content": name},
                                 "rejected": {"role": "assistant", "content": wrong},
                                 "images": [f"images/{index}.png"] * images_per_record}))
    (folder / "pairs.jsonl").write_text("\n".join(lines) + "\n")
    return folder / "pairs.jsonl"


def dpo_recipe(data, adapter="lora", **vision) -> Recipe:
    return Recipe.model_validate({"model": {"name": "tiny-vlm"}, "dataset": {"name": str(data)},
                                  "method": {"kind": "dpo", "adapter": {"kind": adapter, "rank": 4}},
                                  "train": {"max_seq_len": 64, "learning_rate": 1e-2, "packing": False},
                                  "vision": vision})


def test_image_pairs_carry_their_prompts_images(tmp_path):
    data = pair_file(tmp_path)
    (record, *_) = datasets.load_records(DatasetSpec(name=str(data)))
    assert record["prompt"][0]["content"] == "<image>What colour is it?"
    assert record["images"] == [str((tmp_path / "images" / "0.png").resolve())]
    assert record["chosen"] == [{"role": "assistant", "content": "red"}]
    with pytest.raises(DatasetError, match="1 '<image>' placeholder\\(s\\) in the turns but 2 image\\(s\\)"):
        (tmp_path / "two").mkdir()
        datasets.load_records(DatasetSpec(name=str(pair_file(tmp_path / "two", images_per_record=2))))


def test_dpo_on_image_pairs_passes_the_checks_and_other_adapters_are_refused(tmp_path):
    data = pair_file(tmp_path)
    recipe = dpo_recipe(data)
    info = datasets.inspect_dataset(recipe.dataset)
    assert info.kind == "pairs" and info.with_images == 4
    assert not [f for f in vision_checks.data_findings(recipe, info) if f.level == "error"]
    assert not [f for f in vision_checks.data_findings(dpo_recipe(data, "dora"), info) if f.level == "error"]
    (error,) = [f for f in vision_checks.data_findings(dpo_recipe(data, "qlora"), info) if f.level == "error"]
    assert error.key == "method.adapter.kind" and "kind = 'lora' or 'dora'" in error.fix
    sft = recipe.model_copy(update={"method": Recipe.model_validate({"method": {"kind": "sft"}}).method})
    assert any(f.level == "error" and f.key == "dataset.name" for f in vision_checks.data_findings(sft, info))


@pytest.mark.slow
def test_dpo_steps_on_image_pairs_train_the_adapters_and_the_projector(tmp_path, llmtui_cache):
    from tuiapp.trainer.methods import vision_preference
    from tuiapp.trainer.models import vision

    data = pair_file(tmp_path)
    recipe = dpo_recipe(data, train_projector=True, projector_lr=3e-3)
    folder = str(vision.ensure_tiny_vlm("tiny-vlm"))
    processor = vision.load_processor(folder)
    train, held_out = vision_preference.image_pairs(recipe, processor)
    assert held_out is None and len(train) == 4 and isinstance(train[0]["images"][0], Image.Image)
    policy, reference = vision_preference.load_models(recipe, folder, "fp32")
    assert reference is None  # the adapter switched off is the reference
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    kwargs = {"output_dir": str(tmp_path / "out"), "max_steps": 2, "per_device_train_batch_size": 2,
              "learning_rate": 1e-2, "lr_scheduler_type": "constant", "report_to": [], "save_strategy": "no",
              "logging_steps": 1, "use_cpu": True, "remove_unused_columns": False, "dataloader_num_workers": 0}
    trainer = vision_preference.build_trainer(recipe, policy, reference, kwargs, train, held_out, processor, [])
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    changed = {n for n, p in policy.named_parameters() if n in before and not torch.equal(p.detach(), before[n])}
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert changed and changed <= trainable  # the base weights bit-identical
    assert any("lora_B" in n and "language_model" in n for n in changed)
    assert any("multi_modal_projector.modules_to_save.default" in n for n in changed)
    assert not any("lm_head" in n for n in trainable)  # DPO reads the head's weight directly
    lrs = {vision.part_of(n): g["lr"] for g in trainer.optimizer.param_groups for p in g["params"]
           for n, q in policy.named_parameters() if q is p}
    assert lrs == {"language_model": 1e-2, "projector": 3e-3}
    assert trainer.optimizer.param_groups[0]["lr"] == 1e-2  # the logged learning rate is train.learning_rate
