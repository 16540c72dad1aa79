"""core/common/methods.py: a method is one row. Every kind of the recipe's method union has a row
with every trait, and the kind sets derived from the table are those the modules wrote by hand before."""

from __future__ import annotations

import ast
import typing
from dataclasses import fields
from pathlib import Path

import pytest

from tests.source_tree import parsed, tuiapp_files
from tuiapp.core.common import methods
from tuiapp.core.common.methods import METHODS, TRAITS, MethodTraits, kinds
from tuiapp.core.config import recipe

ROOT = Path(__file__).resolve().parents[1]


def _union_kinds() -> list[str]:
    """The `kind` literal of every model in the recipe's discriminated method union."""
    union = typing.get_args(recipe.Method)[0]
    return [typing.get_args(model.model_fields["kind"].annotation)[0] for model in typing.get_args(union)]


def test_every_kind_of_the_method_union_has_a_row():
    missing = [kind for kind in _union_kinds() if kind not in METHODS]
    assert not missing, f"add a row to core/common/methods.py METHODS for: {missing}"
    assert set(METHODS) == set(_union_kinds()), "a row names a kind the recipe does not know"
    assert recipe.METHOD_KINDS == list(METHODS)


@pytest.mark.parametrize("kind", list(METHODS))
def test_every_row_has_a_value_for_every_trait(kind):
    row = METHODS[kind]
    assert isinstance(row, MethodTraits)
    for field in fields(MethodTraits):
        value = getattr(row, field.name)
        assert value is not None and value != "", f"{kind}: no value for {field.name}"
        allowed = typing.get_args(typing.get_type_hints(MethodTraits)[field.name])
        if allowed:  # a Literal: one of its values
            assert value in allowed, f"{kind}.{field.name} = {value!r}, not one of {allowed}"
    assert TRAITS == tuple(f.name for f in fields(MethodTraits))


# The sets as the modules wrote them out before the table (behaviour unchanged).
OLD = {
    "PREFERENCE_KINDS": {"dpo", "simpo", "cpo", "orpo", "kto", "reward"},  # core/common/kinds.py
    "RL_KINDS": {"grpo", "rloo"},  # core/common/kinds.py
    "REFERENCE_KINDS": {"dpo", "kto"},  # core/config/recipe.py
    "UNPAIRED_KINDS": {"kto"},  # core/config/recipe.py
    "ADAPTER_KINDS": {"lora", "qlora", "dora", "prefix", "prompt", "ptuning", "ia3", "adapter",
                      "llama-adapter"},  # core/config/recipe.py
    "NO_PACKING_KINDS": {"prefix", "prompt", "ptuning", "llama-adapter"},  # core/config/recipe.py
    "LORA_KINDS": {"lora", "dora", "qlora"},  # core/plan/model_profile.py
    "PIPELINE_KINDS": {"pretrain", "sft"},  # core/plan/pipeline_plan.py PIPELINE_METHODS
    "MERGE_ADAPTER_KINDS": {"lora", "qlora"},  # core/after/merging.py ADAPTER_KINDS
    "MERGE_FULL_KINDS": {"sft", "pretrain"},  # core/after/merging.py FULL_KINDS
    "VISION_FULL_KINDS": {"sft"},  # core/plan/vision_plan.py FULL_KINDS
    "VISION_KINDS": {"sft", "lora", "dora", "qlora", "dpo"},  # core/prelaunch/vision_checks.py VISION_METHODS
    "UNMERGEABLE": {"prefix", "prompt", "ptuning", "llama-adapter"},  # core/prelaunch/model_check.py
    "VIRTUAL_TOKEN_KINDS": {"prefix", "prompt", "ptuning"},  # trainer/loop/trained_logits.py, after/targets.py
    "FULL_KINDS": {"pretrain", "sft"},  # the ("pretrain", "sft") tuples
}


@pytest.mark.parametrize("name", sorted(OLD))
def test_derived_sets_equal_the_old_ones(name):
    assert set(getattr(methods, name)) == OLD[name]


def test_the_trait_helpers_equal_the_old_comparisons():
    for kind in [*METHODS, None, "", "unknown"]:
        assert methods.is_full(kind) == (kind in ("pretrain", "sft"))
        assert methods.is_lora(kind) == (kind in ("lora", "dora", "qlora"))
        assert methods.is_quantized(kind) == (kind == "qlora")
        assert methods.is_reward_model(kind) == (kind == "reward")
        assert methods.trains_on_text(kind) == (kind == "pretrain")
        assert methods.is_trl(kind) == (kind in OLD["PREFERENCE_KINDS"] | OLD["RL_KINDS"])
        assert methods.mergeable(kind) == (kind not in OLD["UNMERGEABLE"])
        assert methods.has_magnitudes(kind) == (kind == "dora")
        assert methods.adapts_experts(kind) == (kind == "lora")
        assert methods.is_distill(kind) == (kind == "distill")
        assert methods.virtual_at(kind) == {"prefix": "past", "prompt": "input", "ptuning": "input"}.get(kind, "none")
    assert kinds(checkpointing=False) == {"prefix"}
    assert kinds(from_config=True) == {"pretrain"}
    assert {k: methods.peft_of(k) for k in ("adapter", "ia3", "llama-adapter")} == {
        "adapter": "bottleneck", "ia3": "ia3", "llama-adapter": "llama_adapter"}
    assert {k for k, t in METHODS.items() if t.sequences == 2} == OLD["PREFERENCE_KINDS"]
    assert {k for k, t in METHODS.items() if t.extra_copies} == OLD["REFERENCE_KINDS"] | OLD["RL_KINDS"]
    assert {k: t.record_kind for k, t in METHODS.items() if t.family != "adapter"} == {
        "pretrain": "text", "sft": "chat", "dpo": "pairs", "simpo": "pairs", "cpo": "pairs", "orpo": "pairs",
        "kto": "unpaired", "reward": "pairs", "grpo": "prompts", "rloo": "prompts", "distill": "chat"}


def test_the_trainer_has_a_builder_for_every_family():
    """trainer/run.py's BUILDERS (read from the source: importing the trainer loads torch)."""
    tree = ast.parse((ROOT / "tuiapp/trainer/run.py").read_text(encoding="utf-8"))
    builders = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                    and any(getattr(t, "id", "") == "BUILDERS" for t in node.targets))
    assert {key.value for key in builders.keys} == {t.family for t in METHODS.values()}


def test_no_kind_set_is_written_out_outside_the_table():
    """A set or tuple of two or more method kinds, assigned to a name in tuiapp, is the table's job."""
    found = []
    for path in tuiapp_files():
        if path.name == "methods.py" and path.parent.name == "common":
            continue
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Set, ast.Tuple, ast.List)):
                names = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
                if len(names) >= 2 and all(n in METHODS for n in names):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"derive these from core/common/methods.py: {found}"


def test_ordered_and_serving_sets_are_unchanged():
    assert methods.ADAPTER_TABLE_KINDS == ["lora", "dora", "qlora"]  # recipe.py's ADAPTER_CHOICES, in its order
    assert recipe.ADAPTER_CHOICES == ["lora", "dora", "qlora"]
    assert methods.VLLM_ADAPTER_KINDS == {"lora", "qlora", "dpo", "simpo", "cpo", "orpo", "kto"}  # cli/serve.py
    assert methods.VISION_KINDS == ("sft", "lora", "qlora", "dora", "dpo")  # the table's order
    assert methods.PIPELINE_KINDS == ("pretrain", "sft")


def _kind_comparisons(path: Path) -> list[str]:
    """`x.kind == 'lora'`, `kind in ('sft', 'pretrain')`, `.get('method') != 'reward'`: a method kind
    compared by its name."""
    found = []
    for node in ast.walk(parsed(path)):
        if not isinstance(node, ast.Compare):
            continue
        left = node.left
        named = (isinstance(left, ast.Name) and left.id == "kind") or \
            (isinstance(left, ast.Attribute) and left.attr == "kind") or \
            (isinstance(left, ast.Call) and getattr(left.func, "attr", "") == "get" and left.args and
             getattr(left.args[0], "value", None) in ("method", "weights")) or \
            (isinstance(left, ast.Call) and getattr(left.func, "id", "") == "getattr" and len(left.args) > 1 and
             getattr(left.args[1], "value", None) == "kind")
        for right in node.comparators:
            values = [getattr(e, "value", None) for e in right.elts] if isinstance(right, (ast.Tuple, ast.Set, ast.List)) else \
                [getattr(right, "value", None)]
            if named and values and all(isinstance(v, str) and v in METHODS for v in values):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_method_kinds_are_compared_by_name_only_in_the_methods_own_modules():
    """Elsewhere a kind is asked for its traits (core/common/methods.py), so a new kind needs no edits
    there; the methods' own modules (trainer/methods/) tell their kinds apart."""
    found = []
    for path in tuiapp_files():
        if path.parent.name == "methods" or path == ROOT / "tuiapp/core/common/methods.py":
            continue
        found += _kind_comparisons(path)
    assert not found, f"ask core/common/methods.py for a trait instead: {found}"
