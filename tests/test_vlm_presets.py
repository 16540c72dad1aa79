"""The GPU preset of a ~3 B vision-language model: it validates offline (its config is one of the
estimate's presets, its data demo:shapes), the estimate counts its vision tower and fits a 24 GB GPU,
and without CUDA it is refused before launch with the fix. With CUDA, the rules pass on this machine
(tests/e2e/test_vision_training.py trains its [vision] settings on the tiny VLM there)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuiapp.core.config.recipe import load_recipe
from tuiapp.core.data import datasets
from tuiapp.core.machine import gpus
from tuiapp.core.plan import estimate, vision_plan
from tuiapp.core.prelaunch import vision_checks
from tuiapp.core.prelaunch.machine_rules import machine_rules
from tuiapp.core.prelaunch.recipe_rules import recipe_rules

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "recipes" / "gpu-qwen2.5-vl-3b-lora.toml"


def check_rules(recipe, *, cuda, bnb_installed=None):
    """The recipe's rules and this machine's software rules together."""
    return recipe_rules(recipe) + machine_rules(recipe, cuda=cuda, bnb_installed=bnb_installed)


def test_the_vlm_preset_validates_and_its_data_checks_pass():
    recipe = load_recipe(PRESET)
    assert vision_plan.trained_parts(recipe) == {"language_model": True, "projector": True, "vision_tower": False}
    assert vision_plan.part_lrs(recipe) == {"language_model": 1e-4, "projector": 2e-5}
    assert vision_checks.is_vision_model(recipe.model.name) is True
    info = datasets.inspect_dataset(recipe.dataset, base_dir=ROOT)
    assert info.with_images and not vision_checks.data_findings(recipe, info, ROOT)


def test_the_estimate_counts_its_vision_tower_and_fits_a_24gb_gpu():
    recipe = load_recipe(PRESET)
    est = estimate.estimate_recipe(recipe, estimate.load_model_config(recipe.model.name), 1, gpu_memory_bytes=24e9)
    assert 3.6e9 < est.total_params < 3.9e9  # Qwen2.5-VL-3B: 3.75 B with its 670 M vision encoder
    assert est.vision["trains"] == ["language_model", "projector"] and est.vision["image_tokens"] == 514
    assert est.fits, estimate.format_estimate(est)


def test_without_cuda_it_is_refused_with_the_fix():
    recipe = load_recipe(PRESET)
    errors = [f for f in check_rules(recipe, cuda=False) if f.level == "error"]
    assert [(f.key, f.message) for f in errors] == [
        ("train.precision", "bf16 training needs a CUDA GPU and this machine has none")]
    assert "train.precision" in errors[0].fix


@pytest.mark.skipif(not gpus.cuda_available(), reason="needs a CUDA GPU")
def test_with_cuda_the_machine_rules_pass():
    recipe = load_recipe(PRESET)
    assert not [f for f in check_rules(recipe, cuda=True) if f.level == "error"]
