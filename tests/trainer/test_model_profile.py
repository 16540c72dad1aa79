"""The model profile and the decisions made from it, on the project's zoo of real architectures.

Every (architecture, method) pair gets its preflight verdict here, from the configs alone; the
full tier trains each accepted pair (tests/e2e/test_models.py). The README's support table is
these verdicts.
"""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.zoo_matrix import METHODS, table, verdicts, zoo_recipe
from tuiapp.core.plan.model_profile import ModelProfile, choose_attention, plan_model
from tuiapp.trainer.models.zoo import ZOO, zoo_config, zoo_profile

pytestmark = pytest.mark.tiny
ROOT = Path(__file__).resolve().parents[2]
MOE = ("qwen3_moe", "mixtral", "olmoe", "deepseek_v3", "phimoe")


@pytest.fixture(scope="module")
def rows(tiny_model):
    return list(verdicts())


@pytest.fixture(scope="module")
def profiles(tiny_model):
    return {arch: ModelProfile(zoo_profile(arch)) for arch in ZOO}


def test_the_zoo_has_the_architectures_users_bring():
    assert {"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "gpt2", "gpt_neox",
            "olmo2"} <= set(ZOO)
    assert len(set(MOE) & set(ZOO)) >= 2


def test_the_readme_table_is_the_zoo_verdicts(rows):
    assert len(rows) == len(ZOO) * len(METHODS)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert table(rows) in readme, "README's table is stale: python -m tests.zoo_matrix table"


def test_every_refusal_names_the_architecture_the_method_and_a_fix(rows):
    refused = [r for r in rows if r["verdict"] == "refused"]
    assert refused
    for row in refused:
        first = row["findings"][0]
        assert first["level"] == "error" and first["fix"], row
        assert row["arch"] in first["message"], row


def test_what_failed_after_launch_is_now_decided_before_it(rows, profiles):
    verdict = {(r["arch"], r["method"]): r for r in rows}
    # llama-adapter: peft's adaption prompt knows only a few model types
    for arch in ("gpt_neox", "olmo2", "phi3", "qwen2", "qwen3", "qwen3_moe"):
        row = verdict[arch, "llama-adapter"]
        assert row["verdict"] == "refused" and "lora" in row["findings"][0]["fix"]
    assert verdict["llama", "llama-adapter"]["verdict"] == "trains"
    # ia3 without peft defaults: targets chosen from the model's roles, and said
    for arch in ("olmo2", "phi3", "qwen3_moe"):
        row = verdict[arch, "ia3"]
        assert row["verdict"] == "trains" and "rescales" in row["findings"][0]["message"], row
    # gemma2 has no sdpa: 'auto' takes eager
    gemma = plan_model(profiles["gemma2"], zoo_recipe("gemma2", "sft"), cuda=False, flash_installed=False)
    assert gemma.attention == "eager"
    assert plan_model(profiles["qwen3"], zoo_recipe("qwen3", "sft"), cuda=False,
                      flash_installed=False).attention == "sdpa"


def test_moe_lora_adapts_the_experts_only_without_dropout(profiles):
    for arch in MOE:
        recipe = zoo_recipe(arch, "lora")
        with_dropout = plan_model(profiles[arch], recipe, cuda=False, flash_installed=False)
        assert "experts" not in " ".join(with_dropout.lora_targets)
        assert set(with_dropout.lora_targets) >= set(profiles[arch].roles["attention"])
        # peft moves linears named like the experts' old projections onto them (DeepSeek-V3's dense
        # gate_proj/up_proj/down_proj): with dropout those stay out too (ValueError from lora.ParamWrapper)
        renamed = set((profiles[arch].data["peft"] or {}).get("expert_names") or [])
        assert not renamed & set(with_dropout.lora_targets), arch
        assert any("dropout = 0" in (f.fix or "") for f in with_dropout.findings)
        recipe.method.dropout = 0.0
        assert plan_model(profiles[arch], recipe, cuda=False, flash_installed=False).lora_targets == "all-linear"
        dora = zoo_recipe(arch, "dora")  # peft refuses DoRA on fused expert weights, dropout or not
        dora.method.dropout = 0.0
        assert "experts" not in " ".join(plan_model(profiles[arch], dora, cuda=False, flash_installed=False).lora_targets)


def test_prefix_tuning_is_refused_for_latent_and_multi_query_attention(profiles):
    for arch, words in (("deepseek_v3", "latent"), ("falcon", "multi-query")):
        errors = plan_model(profiles[arch], zoo_recipe(arch, "prefix"), cuda=False, flash_installed=False).errors()
        assert errors and words in errors[0].message and "prompt" in errors[0].fix, arch
    for arch in ("llama", "qwen3", "mistral"):  # grouped-query heads that peft counts: accepted
        assert not plan_model(profiles[arch], zoo_recipe(arch, "prefix"), cuda=False, flash_installed=False).errors()


def test_unknown_lora_targets_are_refused_with_the_models_linears(profiles):
    recipe = zoo_recipe("gpt2", "lora")
    recipe.method.target_modules = ["q_proj", "v_proj"]
    plan = plan_model(profiles["gpt2"], recipe, cuda=False, flash_installed=False)
    assert plan.errors() and "c_attn" in plan.errors()[0].message


def test_attention_choice_follows_what_the_architecture_supports(profiles):
    gemma = profiles["gemma2"]
    assert "sdpa" not in gemma.attention and "eager" in gemma.attention
    assert choose_attention(gemma, "auto", cuda=True, flash_installed=True, precision="bf16")[0] == "flash_attention_2"
    assert choose_attention(gemma, "auto", cuda=True, flash_installed=False, precision="bf16")[0] == "eager"
    chosen, findings = choose_attention(gemma, "sdpa", cuda=False, flash_installed=False, precision="fp32")
    assert findings[0].level == "error" and "'auto' (chooses eager here)" in findings[0].fix
    assert choose_attention(profiles["llama"], "auto", cuda=True, flash_installed=False, precision="bf16")[0] == "sdpa"


def test_profile_counts_equal_the_instantiated_models(tiny_model, profiles):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    for arch, profile in profiles.items():
        model = AutoModelForCausalLM.from_config(zoo_config(arch, len(tokenizer), tokenizer.eos_token_id,
                                                            tokenizer.pad_token_id))
        total = sum(p.numel() for p in model.parameters())
        assert profile.total_parameters == total, arch
        experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
        if arch in MOE:
            k, n = profile.moe["active_experts"], profile.moe["experts"]
            assert experts > 0 and profile.active_parameters == total - experts + experts * k // n
            assert profile.roles.get("router"), arch
        else:
            assert experts == 0 and profile.active_parameters == total
        linear = {name.split(".")[-1] for name, m in model.named_modules()
                  if isinstance(m, torch.nn.Linear) and name != "lm_head"}
        assert linear <= profile.linear_names, arch


def test_moe_keys_are_refused_on_a_dense_model(profiles):
    for key, value in (("experts_implementation", "eager"), ("router_aux_loss_coef", 0.01)):
        dense, moe = zoo_recipe("llama", "lora"), zoo_recipe("qwen3_moe", "lora")
        setattr(dense.model, key, value)
        setattr(moe.model, key, value)
        errors = plan_model(profiles["llama"], dense, cuda=False, flash_installed=False).errors()
        assert errors and errors[0].key == f"model.{key}" and "not a mixture of experts" in errors[0].message
        assert not plan_model(profiles["qwen3_moe"], moe, cuda=False, flash_installed=False).errors()


def test_expert_counts_reach_the_config_under_the_names_libraries_read(profiles):
    """PhiMoE names its experts num_local_experts; TRL's load-balancing loss (DPO, KTO) reads
    config.num_experts (AttributeError after launch). load_model gives the config the profile's counts."""
    from transformers import AutoConfig

    from tuiapp.trainer.models.moe import name_experts

    phimoe = AutoConfig.for_model("phimoe", num_local_experts=4, num_experts_per_tok=2)
    assert not hasattr(phimoe, "num_experts")
    name_experts(phimoe, profiles["phimoe"].moe)
    assert phimoe.num_experts == phimoe.num_local_experts == 4 and phimoe.num_experts_per_tok == 2
    qwen = AutoConfig.for_model("qwen3_moe", num_experts=8, num_experts_per_tok=2)
    name_experts(qwen, {"experts": 4, "active_experts": 1})  # names it has are never changed
    assert (qwen.num_experts, qwen.num_experts_per_tok) == (8, 2)
    llama = AutoConfig.for_model("llama")
    name_experts(llama, None)  # a dense model: nothing added
    assert not hasattr(llama, "num_experts")
