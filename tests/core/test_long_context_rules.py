"""Pre-launch rules of train.sequence_parallel, tiled MLP, activation offload and RoPE scaling: each
refusal names its key and the fix, before anything launches."""

from __future__ import annotations

import pytest

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.plan import long_context
from tuiapp.core.prelaunch import distill_checks, door
from tuiapp.core.run_folder import sequence_line
from tuiapp.core.store.runs import RunStore

LLAMA = {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
         "rope_theta": 10000.0, "hidden_size": 64}


def recipe(method="sft", train=None, launch=None, model=None, dataset=None):
    return recipe_from_dict({"model": {"name": "tiny", **(model or {})}, "dataset": dataset or {"name": "demo:chat"},
                             "method": {"kind": method} if isinstance(method, str) else method,
                             "train": {"sequence_parallel": 2, **(train or {})}, "launch": {"gpus": 2, **(launch or {})}})


def errors(findings, key=None):
    return [f for f in findings if f.level == "error" and (key is None or f.key == key)]


def test_a_plain_sequence_parallel_recipe_passes_with_its_degree_said():
    found = long_context.rules(recipe())
    assert not errors(found)
    assert any("each rank holds 256 of every 512-token sequence" in f.message for f in found)
    assert not long_context.rules(recipe(train={"sequence_parallel": 1}, launch={"gpus": 1}))


@pytest.mark.parametrize("kind", ["prefix", "prompt", "ptuning", "llama-adapter"])
def test_methods_with_virtual_tokens_are_refused(kind):
    (finding,) = errors(long_context.rules(recipe(kind)))
    assert finding.key == "train.sequence_parallel" and "virtual tokens" in finding.message
    assert "lora" in finding.fix


@pytest.mark.parametrize(("kind", "data"), [
    ("dpo", "demo:prefs"), ("simpo", "demo:prefs"), ("cpo", "demo:prefs"), ("orpo", "demo:prefs"),
    ("kto", "demo:feedback"), ("reward", "demo:prefs"), ("grpo", "demo:arith"), ("rloo", "demo:arith"),
])
def test_preference_and_rl_methods_are_refused_with_the_fix(kind, data):
    found = errors(long_context.rules(recipe(kind, dataset={"name": data})), "train.sequence_parallel")
    (finding,) = [f for f in found if "scores whole sequences" in f.message]
    assert f"method '{kind}'" in finding.message and "sequence_parallel = 1" in finding.fix


def test_ranks_must_be_a_multiple_of_the_degree():
    (finding,) = errors(long_context.rules(recipe(launch={"gpus": 3})), "train.sequence_parallel")
    assert "3 rank(s) do not form groups of 2" in finding.message and "multiple of 2" in finding.fix
    assert errors(long_context.rules(recipe(train={"sequence_parallel": 4}, launch={"gpus": 2})))
    assert not errors(long_context.rules(recipe(launch={"gpus": 4})))  # 2 groups, data-parallel


MIXTURE = {"sources": [{"name": "demo:facts"}, {"name": "demo:chat"}]}


@pytest.mark.parametrize(("setting", "key", "says"), [
    ({"train": {"batching": "tokens"}}, "train.sequence_parallel", "token-budget batches"),
    ({"train": {"micro_batch": "auto"}}, "train.micro_batch", "probes one rank alone"),
    ({"launch": {"strategy": "fsdp"}}, "train.sequence_parallel", "not strategy 'fsdp'"),
    ({"model": {"attn_implementation": "eager"}}, "model.attn_implementation", "eager attention"),
    ({"dataset": MIXTURE}, "train.sequence_parallel", "dataset mixture"),
])
def test_features_that_cannot_run_under_it_are_refused(setting, key, says):
    (finding,) = errors(long_context.rules(recipe(**setting)), key)
    assert says in finding.message and finding.fix


def test_distillation_is_refused_under_it():
    distill = {"kind": "distill", "teacher": "tiny-teacher", "mode": "online"}  # online: no teacher cache to size
    (finding,) = errors(distill_checks.findings(recipe(distill)), "train.sequence_parallel")
    assert "whole sequences' logits" in finding.message and finding.fix == "set train.sequence_parallel = 1"
    assert not errors(distill_checks.findings(recipe(distill, train={"sequence_parallel": 1})))


def test_a_length_not_divisible_is_padded_and_said_so():
    r = recipe(train={"max_seq_len": 301, "packing": False})
    assert any(f.level == "info" and "padded" in f.message for f in long_context.rules(r))
    assert long_context.per_rank_tokens(r) == 151 and long_context.sp_padded_length(r) == 302
    packed = recipe(train={"max_seq_len": 301, "micro_batch": 4})  # one flattened row of the micro batch
    assert long_context.sp_padded_length(packed) == 1204


def test_heads_and_kv_heads_must_divide():
    r = recipe(train={"sequence_parallel": 3}, launch={"gpus": 3})
    found = errors(long_context.config_rules(r, LLAMA))
    assert any("4 attention heads do not divide by 3" in f.message for f in found)
    assert any("2 key/value heads" in f.message for f in found)
    assert len(found) == 2 and all(f.key == "train.sequence_parallel" and "divisor" in f.fix for f in found)
    r4 = recipe(train={"sequence_parallel": 4}, launch={"gpus": 4})
    assert not errors(long_context.config_rules(r4, LLAMA))  # 2 KV heads replicated to 4


def test_rope_scaling_needs_a_rope_model_and_max_positions_are_checked():
    r = recipe(model={"rope_scaling": {"type": "yarn", "factor": 4}}, train={"max_seq_len": 2048})
    assert not errors(long_context.config_rules(r, LLAMA))  # 512 x 4 positions
    gpt2 = {"model_type": "gpt2", "n_head": 4, "n_positions": 512}
    (finding,) = errors(long_context.config_rules(r, gpt2))
    assert finding.key == "model.rope_scaling" and "no rotary" in finding.message
    long = recipe(train={"max_seq_len": 4096})
    assert any(f.key == "train.max_seq_len" and "past the model's 512" in f.message
               for f in long_context.config_rules(long, LLAMA))


def test_bad_rope_scaling_is_a_recipe_error():
    with pytest.raises(RecipeError) as err:
        recipe(model={"rope_scaling": {"type": "ntk", "factor": 2}})
    assert "model.rope_scaling" in str(err.value)
    with pytest.raises(RecipeError):
        recipe(model={"rope_scaling": {"type": "linear", "factor": 1}})


def test_offload_and_tiling_where_they_cannot_run():
    r = recipe(train={"sequence_parallel": 1, "tiled_mlp": True, "activation_offload": True},
               launch={"strategy": "pipeline", "gpus": 2})
    keys = {f.key for f in errors(long_context.rules(r))}
    assert keys == {"train.tiled_mlp", "train.activation_offload"}
    cpu = long_context.config_rules(recipe(train={"activation_offload": True}), LLAMA, cuda=False)
    assert any(f.key == "train.activation_offload" and f.level == "warning" for f in cpu)


def test_the_pre_launch_checks_carry_the_rules(tmp_path):
    found = door.recipe_findings(recipe("prefix"), RunStore(tmp_path), base_dir=tmp_path)
    assert any(f.key == "train.sequence_parallel" and f.level == "error" for f in found)


def test_the_estimate_counts_a_rank_s_share_of_the_sequence_and_the_longest_that_fits():
    from tuiapp.core.plan import estimate

    config = estimate.TINY_CONFIG
    whole = estimate.estimate_recipe(recipe(train={"sequence_parallel": 1, "max_seq_len": 2048}, launch={"gpus": 1}),
                                     config, 1, cuda=False)
    split = estimate.estimate_recipe(recipe(train={"max_seq_len": 2048}), config, 2, cuda=False)
    assert split.memory.activations == whole.memory.activations // 2
    tiled = estimate.estimate_recipe(recipe(train={"max_seq_len": 2048, "tiled_mlp": True}), config, 2, cuda=False)
    assert tiled.memory.activations < split.memory.activations
    offloaded = estimate.estimate_recipe(recipe(train={"max_seq_len": 2048, "activation_offload": True}), config, 2)
    assert offloaded.memory.activations < estimate.estimate_recipe(recipe(train={"max_seq_len": 2048}), config,
                                                                   2).memory.activations
    est = estimate.estimate_recipe(recipe(launch={"gpus": 4}), config, 4, gpu_memory_bytes=2 * 10**8)
    degrees = [n for n, _ in est.longest]
    assert degrees == [1, 2, 4]
    lengths = [seq for _, seq in est.longest]
    assert lengths[0] > 0 and lengths[1] > lengths[0] and lengths[2] > lengths[1]
    assert "longest sequence that fits: degree 1: " in estimate.format_estimate(est)


def test_show_gives_the_degree_and_the_per_rank_sequence(tmp_path):
    (tmp_path / "recipe.toml").write_text("[train]\nsequence_parallel = 2\nmax_seq_len = 2048\n")
    (line,) = sequence_line.show_lines(tmp_path)
    assert "parallel degree 2: each rank holds 1,024 of every 2,048-token sequence" in line
    (tmp_path / "recipe.toml").write_text("[train]\nmax_seq_len = 2048\n")
    assert sequence_line.show_lines(tmp_path) == []


def test_tiled_mlp_is_refused_where_no_deepspeed_engine_trains():
    one_rank = recipe(train={"sequence_parallel": 1, "tiled_mlp": True}, launch={"gpus": 1})
    (finding,) = errors(long_context.rules(one_rank))
    assert finding.key == "train.tiled_mlp" and "without DeepSpeed's engine" in finding.message
    assert not errors(long_context.rules(one_rank, cuda=True))  # on a GPU DeepSpeed's engine trains it
    ddp = recipe(train={"sequence_parallel": 1, "tiled_mlp": True}, launch={"strategy": "ddp"})
    assert errors(long_context.rules(ddp), "train.tiled_mlp")
    assert not errors(long_context.rules(recipe(train={"tiled_mlp": True})))  # 2 ranks, degree 2


def test_tiling_and_offload_are_refused_for_trl_methods_and_sequence_parallel_for_vlms():
    dpo = recipe("dpo", train={"sequence_parallel": 1, "tiled_mlp": True, "activation_offload": True},
                 dataset={"name": "demo:preference"}, launch={"gpus": 1})
    assert {f.key for f in errors(long_context.rules(dpo, cuda=True))} == {"train.tiled_mlp",
                                                                           "train.activation_offload"}
    vlm = {"model_type": "qwen2_5_vl", "vision_config": {"depth": 2}, "text_config": LLAMA}
    (finding,) = errors(long_context.config_rules(recipe(), vlm))
    assert "vision-language" in finding.message and finding.fix == "set train.sequence_parallel = 1"


def test_tiled_loss_is_refused_where_another_loss_is_computed_and_counted_as_one_slice():
    plain = recipe(train={"sequence_parallel": 1, "tiled_loss": True}, launch={"gpus": 1})
    assert not errors(long_context.rules(plain))
    refused = {
        "dpo": recipe("dpo", train={"sequence_parallel": 1, "tiled_loss": True}, dataset={"name": "demo:preference"},
                      launch={"gpus": 1}),
        "pipeline": recipe(train={"sequence_parallel": 1, "tiled_loss": True}, launch={"strategy": "pipeline"}),
        "liger": recipe(train={"sequence_parallel": 1, "tiled_loss": True, "liger_kernel": True}, launch={"gpus": 1}),
        "router loss": recipe(train={"sequence_parallel": 1, "tiled_loss": True}, launch={"gpus": 1},
                              model={"router_aux_loss_coef": 0.01}),
    }
    for why, r in refused.items():
        (finding,) = errors(long_context.rules(r), "train.tiled_loss")
        assert finding.fix == "set train.tiled_loss = false", why
    vlm = {"model_type": "qwen2_5_vl", "vision_config": {"depth": 2}, "text_config": LLAMA}
    assert errors(long_context.config_rules(plain, vlm), "train.tiled_loss")
    assert not errors(long_context.config_rules(plain, LLAMA), "train.tiled_loss")
    assert errors(long_context.config_rules(plain, {**LLAMA, "num_local_experts": 4, "output_router_logits": True}),
                  "train.tiled_loss")

    from tuiapp.core.plan import estimate

    config, long = estimate.TINY_CONFIG, {"sequence_parallel": 1, "max_seq_len": 8192}
    whole = estimate.estimate_recipe(recipe(train=long, launch={"gpus": 1}), config, 1, cuda=False)
    tiled = estimate.estimate_recipe(recipe(train={**long, "tiled_loss": True}, launch={"gpus": 1}), config, 1,
                                     cuda=False)
    assert tiled.memory.activations < whole.memory.activations
    assert long_context.loss_slice_tokens(32000) == 2048 and long_context.loss_slice_tokens(152064) == 256
