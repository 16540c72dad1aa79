"""Every preset in recipes/ validates, and the tiny ones pass the static checks."""

from pathlib import Path

import pytest

from tuiapp.core.config.recipe import load_recipe
from tuiapp.core.prelaunch import door
from tuiapp.core.store.runs import RunStore

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "recipes").glob("*.toml"))


def test_there_is_a_preset_for_every_method():
    kinds = {load_recipe(p).method.kind for p in PRESETS}
    assert kinds >= {"pretrain", "sft", "lora", "qlora", "dora", "prefix", "prompt", "ptuning", "ia3", "adapter",
                     "llama-adapter", "dpo", "simpo", "cpo", "orpo", "kto", "reward", "grpo", "rloo", "distill"}


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_preset_validates(path, tmp_path):
    recipe = load_recipe(path)
    if recipe.model.name == "tiny":
        findings = door.recipe_findings(recipe, RunStore(tmp_path), base_dir=ROOT)
        assert not door.has_errors(findings), door.format_findings(findings)
