"""trainer.dry's shrunken copy: transformers' own full-size configs of the families found beyond the zoo,
shrunk to two layers and a width of 64, keep their class and their attention and expert layout."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tuiapp.trainer.models.profile import _kv_layout, _moe_facts
from tuiapp.trainer.tools.dry import shrink_config, step_recipe


@pytest.mark.parametrize("model_type", ["stablelm", "deepseek_v3", "falcon", "phimoe", "qwen3_moe", "gemma2"])
def test_a_shrunken_copy_keeps_the_class_and_the_layout(model_type):
    full = AutoConfig.for_model(model_type)
    small = shrink_config(full)
    assert small is not full and type(small) is type(full)
    assert full.num_hidden_layers > 2 and small.num_hidden_layers == 2 and small.hidden_size == 64
    kv_full, kv_small = _kv_layout(full), _kv_layout(small)
    assert kv_small["latent"] == kv_full["latent"]
    assert (kv_small["kv_heads"] == 1) == (kv_full["kv_heads"] == 1)  # multi-query stays multi-query
    assert (kv_small["kv_heads"] < kv_small["heads"]) == (kv_full["kv_heads"] < kv_full["heads"])  # grouped
    assert bool(_moe_facts(small)) == bool(_moe_facts(full))
    if getattr(full, "first_k_dense_replace", None):
        assert small.first_k_dense_replace == 1  # a dense layer, then one of experts
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(small)
    assert sum(p.numel() for p in model.parameters()) < 30_000_000  # the vocabulary is most of it


def test_a_small_model_is_kept_as_it_is():
    config = AutoConfig.for_model("llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    assert shrink_config(config) is config


def test_the_step_recipe_is_one_step_on_a_few_examples_of_the_recipes_own_data(tmp_path):
    data = {"name": "x", "model": {"name": "big"}, "dataset": {"name": "data/train.jsonl", "eval_split": 0.1},
            "method": {"kind": "lora", "rank": 8}, "train": {"max_steps": 1000, "micro_batch": "auto",
                                                             "eval_steps": 50, "max_seq_len": 4096},
            "launch": {"gpus": 8, "zero_stage": 3}}
    step = step_recipe(data, tmp_path / "small")
    assert step["method"] == data["method"] and step["dataset"]["name"] == "data/train.jsonl"
    assert step["model"]["name"] == str(tmp_path / "small")
    assert step["train"]["max_steps"] == 1 and step["train"]["eval_steps"] == 0 and step["train"]["micro_batch"] == 2
    assert step["train"]["max_seq_len"] == 256 and step["dataset"]["max_samples"] == 8
    assert step["launch"] == {"gpus": 1}


@pytest.mark.slow  # a few seconds each on a busy 2-core machine (real weights: DeepSeek's vocabulary)
@pytest.mark.parametrize("model_type", ["deepseek_v3", "falcon", "stablelm", "phimoe"])
def test_a_shrunken_copy_takes_a_forward_and_backward(model_type):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(shrink_config(AutoConfig.for_model(model_type)))
    ids = torch.randint(0, 100, (1, 12))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and model.get_input_embeddings().weight.grad is not None


def test_a_pretraining_step_recipe_fills_a_block_of_its_own_text(tmp_path, tiny_model):
    """demo:text's paragraphs are ~30 tokens: 8 of them did not fill one 256-token block, and the dry
    step refused a valid long-context pretraining recipe ('no training blocks'); it takes 64 now."""
    from transformers import AutoTokenizer

    from tuiapp.core.config.recipe import recipe_from_dict
    from tuiapp.trainer.dataset.data import build_datasets

    data = {"name": "x", "model": {"name": "tiny"}, "dataset": {"name": "demo:text"},
            "method": {"kind": "pretrain"}, "train": {"max_steps": 20, "max_seq_len": 4096}}
    step = recipe_from_dict(step_recipe(data, tiny_model))
    assert step.dataset.max_samples == 64 and step.train.max_seq_len == 256
    train, _ = build_datasets(step, AutoTokenizer.from_pretrained(tiny_model), tmp_path / "cache")
    assert len(train) >= 1 and len(train[0]["input_ids"]) == 256


@pytest.mark.slow  # one real (shrunken) step in this process
def test_examples_whose_answers_start_past_the_steps_length_are_not_judged_by_it(tmp_path, tiny_model, monkeypatch):
    """An SFT recipe of 1,024 tokens whose answers start after ~300 tokens trains as it is; the dry
    step's 256 tokens cut every answer off, and that was a refusal ('no training examples with a
    trained token') of a valid recipe. The step says it was skipped instead."""
    import json
    import socket

    from tuiapp.trainer.tools.dry import dry_step

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for key, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)).items():
        monkeypatch.setenv(key, value)
    data = tmp_path / "long.jsonl"
    long_question = " ".join(["the capital of France is Paris"] * 60)
    data.write_text("".join(json.dumps({"instruction": f"{long_question} {i}", "input": "", "output": "Paris"}) + "\n"
                            for i in range(8)))
    recipe = tmp_path / "long.toml"
    recipe.write_text(f'name = "long"\n[model]\nname = "tiny"\n[dataset]\nname = "{data}"\n'
                      '[method]\nkind = "sft"\n[train]\nmax_seq_len = 1024\nmax_steps = 2\n')
    verdict = dry_step(recipe, tmp_path / "work")
    assert "256 tokens" in verdict.get("skipped", ""), verdict
