"""Pipeline plans: the split by parameter count, the bubble, per-stage memory, and the rules of
strategy 'pipeline', each one on its own."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tuiapp.core.common.errors import RecipeError, UserError
from tuiapp.core.config.recipe import load_recipe, parse_recipe
from tuiapp.core.plan import cluster, pipeline_plan
from tuiapp.core.plan.estimate import GB, PRESET_CONFIGS, TINY_CONFIG, format_estimate
from tuiapp.core.prelaunch.recipe_rules import recipe_rules
from tuiapp.core.prelaunch.resources import memory_estimate

ROOT = Path(__file__).resolve().parents[2]


def pipeline_recipe(*overrides: str):
    return load_recipe(ROOT / "recipes/tiny-pipeline-pretrain.toml", list(overrides))


def keys(findings, level="error"):
    return [f.key for f in findings if f.level == level]


def test_tiny_model_splits_into_equal_halves():
    stages = pipeline_plan.split_layers(TINY_CONFIG, 2)
    assert [(s.first_layer, s.last_layer) for s in stages] == [(0, 2), (2, 4)]
    embed, block, norm, head = pipeline_plan.component_params(TINY_CONFIG)
    assert stages[0].params == embed + 2 * block
    assert stages[1].params == 2 * block + norm + head  # the tied head's copy counts on the last stage


def test_one_layer_per_stage_and_too_many_stages():
    assert [s.layers for s in pipeline_plan.split_layers(TINY_CONFIG, 4)] == [1, 1, 1, 1]
    with pytest.raises(UserError) as err:
        pipeline_plan.split_layers(TINY_CONFIG, 5)
    assert err.value.key == "launch.pipeline_stages" and "at most" not in err.value.fix and "4" in err.value.fix


@pytest.mark.parametrize("name,stages", [("Qwen/Qwen2.5-0.5B", 3), ("meta-llama/Llama-3.2-1B", 4),
                                         ("TinyLlama/TinyLlama-1.1B-Chat-v1.0", 3)])
def test_split_is_the_best_possible_by_parameters(name, stages):
    """Against every way of cutting the layers: no split has a smaller largest stage."""
    config = PRESET_CONFIGS[name]
    plan = pipeline_plan.split_layers(config, stages)
    embed, block, norm, head = pipeline_plan.component_params(config)
    layers = plan[-1].last_layer
    assert plan[0].first_layer == 0 and all(a.last_layer == b.first_layer for a, b in zip(plan, plan[1:], strict=False))

    def largest(cuts):
        bounds = [0, *cuts, layers]
        sizes = [(b - a) * block for a, b in zip(bounds, bounds[1:], strict=False)]
        sizes[0] += embed
        sizes[-1] += norm + head
        return max(sizes)

    best = min(largest(c) for c in itertools.combinations(range(1, layers), stages - 1))
    assert max(s.params for s in plan) == best
    assert plan[0].layers < plan[1].layers  # the embeddings weigh on the first stage


def test_bubble_fraction():
    assert pipeline_plan.bubble_fraction(2, 4) == pytest.approx(1 / 5)
    assert pipeline_plan.bubble_fraction(4, 16) == pytest.approx(3 / 19)
    assert pipeline_plan.bubble_fraction(1, 8) == 0.0


def test_in_flight_microbatches_per_schedule():
    assert pipeline_plan.in_flight("gpipe", 0, 4, 16) == 16
    assert [pipeline_plan.in_flight("1f1b", k, 4, 16) for k in range(4)] == [4, 3, 2, 1]
    assert pipeline_plan.in_flight("1f1b", 0, 4, 2) == 2


def test_stage_memory_gpipe_holds_more_activations_than_1f1b():
    onef = pipeline_plan.stage_memory(pipeline_recipe("launch.microbatches=8"), TINY_CONFIG, "fp32")
    gpipe = pipeline_plan.stage_memory(pipeline_recipe("launch.microbatches=8", "launch.pipeline_schedule='gpipe'"),
                                       TINY_CONFIG, "fp32")
    assert gpipe[0]["activations_bytes"] == 4 * onef[0]["activations_bytes"]  # 8 in flight against 2
    for stage in onef:  # fp32 Adam: 4 + 4 + 8 bytes per parameter of the stage
        assert stage["params_bytes"] + stage["grads_bytes"] + stage["optimizer_bytes"] == 16 * stage["params"]


def test_estimate_shows_split_bubble_and_largest_stage():
    est = memory_estimate(pipeline_recipe(), TINY_CONFIG, gpus=[], cuda=False)
    assert est.pipeline["stages"] == 2 and est.pipeline["bubble"] == pytest.approx(0.2)
    largest = max(s["total_bytes"] for s in est.pipeline["per_stage"])
    assert est.memory.total == largest
    text = format_estimate(est)
    assert "pipeline     2 stages x 1 replica(s), 4 micro-batches of 2, 1f1b, bubble (p-1)/(m+p-1) = 20%" in text
    assert "0-1" in text and "2-3" in text


def test_estimate_of_a_large_model_over_many_stages():
    recipe = load_recipe(ROOT / "recipes/tiny-pipeline-pretrain.toml",
                         ["model.name='meta-llama/Llama-3.1-8B'", "launch.pipeline_stages=4", "launch.gpus=8",
                          "launch.microbatches=8", "train.precision='bf16'"])
    info = pipeline_plan.plan(recipe, PRESET_CONFIGS["meta-llama/Llama-3.1-8B"], "bf16", 8)
    assert info["replicas"] == 2 and sum(s["layers"] for s in info["per_stage"]) == 32
    states = [s["params_bytes"] + s["grads_bytes"] + s["optimizer_bytes"] for s in info["per_stage"]]
    assert max(states) < 16 * 8.1e9 / 3.5 and max(states) / GB > 25  # about a quarter of 16P each


def test_the_presets_pass_the_rules():
    for name in ("tiny-pipeline-pretrain", "tiny-pipeline-sft"):
        recipe = load_recipe(ROOT / f"recipes/{name}.toml")
        assert keys(recipe_rules(recipe)) == []
        assert keys(pipeline_plan.model_rules(recipe, TINY_CONFIG)) == []


@pytest.mark.parametrize("overrides,key,fix", [
    (["launch.microbatches=1"], "launch.microbatches", "at least 2"),
    (["launch.microbatches=3"], "launch.microbatches", "one of [2, 4, 8]"),
    (["launch.zero_stage=2"], "launch.zero_stage", "launch.zero_stage = 0"),
    (["method.kind='lora'"], "method.kind", "'pretrain' or 'sft'"),
    (["launch.gpus=3"], "launch.pipeline_stages", "multiple of 2"),
    (["train.early_stopping_patience=2"], "train.early_stopping_patience", "= 0"),
    (["train.precision='fp16'"], "train.precision", "'bf16'"),
    (["train.batching='tokens'"], "train.batching", "'examples'"),
])
def test_rule_names_key_and_fix(overrides, key, fix):
    findings = [f for f in pipeline_plan.rules(pipeline_recipe(*overrides)) if f.level == "error"]
    assert [f.key for f in findings] == [key]
    assert fix in findings[0].fix


def test_rules_about_the_model():
    recipe = pipeline_recipe("launch.pipeline_stages=5", "launch.microbatches=8", "launch.gpus=5")
    [finding] = pipeline_plan.model_rules(recipe, TINY_CONFIG)
    assert finding.key == "launch.pipeline_stages" and "at most 4" in finding.fix
    gpt2 = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12,
            "n_positions": 1024}
    [finding] = pipeline_plan.model_rules(pipeline_recipe(), gpt2)
    assert finding.key == "model.name" and "gpt2" in finding.message
    assert pipeline_plan.model_rules(pipeline_recipe("launch.strategy='deepspeed'"), gpt2) == []


def test_other_strategies_have_no_pipeline_rules():
    assert pipeline_plan.rules(pipeline_recipe("launch.strategy='deepspeed'", "launch.microbatches=1")) == []


def test_bad_schedule_names_the_key():
    text = (ROOT / "recipes/tiny-pipeline-pretrain.toml").read_text().replace('"1f1b"', '"zigzag"')
    with pytest.raises(RecipeError) as err:
        parse_recipe(text, "p.toml")
    assert "pipeline_schedule" in str(err.value) and "gpipe" in str(err.value)


def test_pipeline_ranks_start_through_the_deepspeed_launcher(tmp_path):
    launch = pipeline_recipe().launch
    built = cluster.build_launch(tmp_path / "run", launch, 0, port=29555)
    assert built.argv[1:4] == ["-u", "-m", "deepspeed.launcher.launch"]
    assert "--world_info=eyJsb2NhbGhvc3QiOiBbMCwgMV19" in built.argv  # {"localhost": [0, 1]}
    assert not cluster.is_scaled(launch)


def test_the_split_is_shown_and_an_uneven_one_gets_a_better_count():
    [info] = pipeline_plan.model_rules(pipeline_recipe(), TINY_CONFIG)
    assert info.level == "info" and "layers 0-1 (664,064 params) | 2-3 (664,192 params)" in info.message
    assert "bubble 20%" in info.message
    recipe = pipeline_recipe("launch.pipeline_stages=16", "launch.microbatches=16", "launch.gpus=16",
                             "train.micro_batch=16")
    found = pipeline_plan.model_rules(recipe, PRESET_CONFIGS["meta-llama/Llama-3.2-1B"])
    [warning] = [f for f in found if f.level == "warning"]
    assert "uneven" in warning.message and warning.fix.startswith("try launch.pipeline_stages = ")
    better = int(warning.fix.rsplit(" ", 1)[1])
    sizes = [s.params for s in pipeline_plan.split_layers(PRESET_CONFIGS["meta-llama/Llama-3.2-1B"], better)]
    assert max(sizes) <= 1.5 * min(sizes)
