"""trainer/methods/adapters.py: every adapter kind of the method table has a builder, and what each
builder wraps trains exactly the parameters the estimate counts for it (core/plan/estimate.py's
ADAPTER_PARAMETERS, itself checked against peft's own configs in tests/core/test_estimate.py)."""

from __future__ import annotations

import json

import pytest

from tuiapp.core.common.methods import ADAPTER_KINDS, is_quantized
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.plan.estimate import ADAPTER_PARAMETERS, trainable_parameters
from tuiapp.trainer.methods.adapters import BUILDERS, apply_method
from tuiapp.trainer.models.model import load_model

pytestmark = pytest.mark.tiny


def test_every_adapter_kind_has_a_builder_and_a_parameter_count():
    assert set(BUILDERS) == ADAPTER_KINDS, "add the kind's builder to trainer/methods/adapters.py BUILDERS"
    assert set(ADAPTER_PARAMETERS) == ADAPTER_KINDS, "add the kind's count to core/plan/estimate.py ADAPTER_PARAMETERS"


@pytest.mark.parametrize("kind", sorted(k for k in ADAPTER_KINDS if not is_quantized(k)))  # qlora: CUDA
def test_the_built_adapter_trains_what_the_estimate_counts(kind, tiny_model):
    recipe = Recipe.model_validate({"name": "t", "model": {"name": str(tiny_model)}, "dataset": {"name": "demo:chat"},
                                    "method": {"kind": kind}, "train": {"max_seq_len": 64}})
    model = apply_method(load_model(recipe, str(tiny_model), "fp32"), recipe, str(tiny_model))
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    config = json.loads((tiny_model / "config.json").read_text())
    assert trained == trainable_parameters(config, recipe.method) > 0
