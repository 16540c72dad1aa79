"""Which methods train on images, checked before launch: sft, lora, dora, qlora (4-bit base on
CUDA) and dpo with a lora or dora adapter; the others refused with the fix."""

from __future__ import annotations

from tuiapp.core.config.recipe import Recipe
from tuiapp.core.data.datasets import DatasetInfo
from tuiapp.core.prelaunch import vision_checks


def _findings(method: dict) -> list:
    recipe = Recipe.model_validate({"model": {"name": "tiny-vlm"}, "method": method})
    info = DatasetInfo(source="demo:shapes", format="messages", count=8, examples=[], with_images=8)
    return [f for f in vision_checks.data_findings(recipe, info)  # the data's findings include the parts'
            if f.level == "error"]


def test_lora_dora_and_qlora_train_on_images_and_prefix_tuning_does_not():
    for kind in ("sft", "lora", "dora", "qlora"):
        assert not _findings({"kind": kind}), kind
    [refused] = _findings({"kind": "prefix"})
    assert refused.key == "method.kind" and "dora" in refused.fix and "qlora" in refused.fix


def test_image_pairs_take_a_lora_or_dora_adapter():
    assert not _findings({"kind": "dpo", "adapter": {"kind": "dora", "rank": 4}})
    [refused] = _findings({"kind": "dpo", "adapter": {"kind": "qlora", "rank": 4}})
    assert refused.key == "method.adapter.kind" and "'lora' or 'dora'" in refused.fix
