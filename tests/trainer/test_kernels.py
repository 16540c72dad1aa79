"""Kernel switches (model.attn_implementation, train.liger_kernel, train.torch_compile) and token-budget
batches: validation before launch, what the estimate counts, sdpa/eager loss parity on the tiny model,
and the batch sampler's invariants."""

import os

import pytest
import torch

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.config.recipe import Recipe, batch_fill_hint, batching_label
from tuiapp.core.plan.estimate import estimate_recipe, format_estimate
from tuiapp.core.plan.launcher import torch_extensions_dir
from tuiapp.core.prelaunch.machine_rules import machine_rules
from tuiapp.core.prelaunch.recipe_rules import recipe_rules
from tuiapp.trainer.dataset.packing import PackedRowsCollator, TokenBudgetBatches, budget_batches
from tuiapp.trainer.models.bundled import resolve_model_path
from tuiapp.trainer.models.model import attn_implementation, load_model, load_tokenizer

TINY_CONFIG = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 128, "intermediate_size": 344,
               "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
               "max_position_embeddings": 512, "tie_word_embeddings": True}


def check_rules(recipe, *, cuda, bnb_installed=None):
    """The recipe's rules and this machine's software rules together."""
    return recipe_rules(recipe) + machine_rules(recipe, cuda=cuda, bnb_installed=bnb_installed)


def recipe(**sections) -> Recipe:
    data = {"name": "k", "method": {"kind": "lora"}}
    for key, value in sections.items():
        data[key] = value
    return Recipe.model_validate(data)


def errors(r: Recipe, cuda: bool = False) -> dict[str, str]:
    return {f.key: f.message for f in check_rules(r, cuda=cuda, bnb_installed=False) if f.level == "error"}


def test_gpu_only_kernels_fail_on_cpu_before_launch_naming_their_key():
    found = errors(recipe(model={"attn_implementation": "flash_attention_2"}, train={"liger_kernel": True}))
    assert "CUDA" in found["model.attn_implementation"] and "CUDA" in found["train.liger_kernel"]
    assert not errors(recipe(model={"attn_implementation": "sdpa"}))
    assert not errors(recipe(model={"attn_implementation": "eager"}, train={"torch_compile": True}))


def test_torch_compile_on_cpu_needs_a_c_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no cc, gcc or clang
    found = errors(recipe(train={"torch_compile": True}))
    assert "C compiler" in found["train.torch_compile"]


def test_the_schema_refuses_an_unknown_attention_kernel():
    with pytest.raises(ValueError, match="attn_implementation"):
        recipe(model={"attn_implementation": "flash_attention_9"})


def test_auto_attention_is_sdpa_without_cuda_and_flash_on_cpu_is_a_recipe_error():
    assert attn_implementation("auto", "fp32", cuda=False) == "sdpa"
    assert attn_implementation("eager", "fp32", cuda=False) == "eager"
    with pytest.raises(RecipeError, match="attn_implementation"):
        attn_implementation("flash_attention_2", "bf16", cuda=False)


def test_token_batching_rules():
    assert "train.batching" in errors(recipe(method={"kind": "pretrain"}, train={"batching": "tokens"}))
    assert "train.batching" in errors(recipe(method={"kind": "dpo"}, train={"batching": "tokens"}))
    assert "train.batching" in errors(recipe(train={"batching": "tokens", "packing": False}))
    assert "train.tokens_per_batch" in errors(recipe(train={"batching": "tokens", "tokens_per_batch": 100,
                                                            "max_seq_len": 128}))
    assert not errors(recipe(train={"batching": "tokens", "tokens_per_batch": 4096}))


def test_the_estimate_counts_what_the_switches_change():
    def activations(**train) -> int:
        model = {"attn_implementation": train.pop("attn", "auto")}
        r = recipe(model=model, train={"max_seq_len": 512, "micro_batch": 4, **train})
        return estimate_recipe(r, TINY_CONFIG, 1, cuda=True).memory.activations

    assert activations(attn="eager") > activations(attn="sdpa") == activations()
    assert activations(liger_kernel=True) < activations()
    assert activations(batching="tokens", tokens_per_batch=4096) == activations(micro_batch=8)
    text = format_estimate(estimate_recipe(recipe(model={"attn_implementation": "eager"},
                                                  train={"liger_kernel": True}), TINY_CONFIG, 1, cuda=True))
    assert "eager attention" in text and "liger fused loss" in text


def test_batching_label_of_recorded_recipes():
    assert batching_label(None) == "examples" and batching_label({"train": {}}) == "examples"
    assert batching_label({"train": {"batching": "tokens", "tokens_per_batch": 4096}}) == "tokens (4096 per micro batch)"
    assert batching_label({"train": {"batching": "tokens", "micro_batch": 8, "max_seq_len": 512}}) \
        == "tokens (4096 per micro batch)"


def test_a_packed_run_whose_steps_held_little_is_told_of_token_batches():
    sft = {"method": {"kind": "sft"}, "train": {"micro_batch": 8, "max_seq_len": 1024, "grad_accum": 2}}
    room = 8 * 1024 * 2 * 4  # a step's tokens on 4 ranks
    hint = batch_fill_hint(sft, [0.3 * room, 0.45 * room, 0.9 * room], world=4)  # the median step: 45 %
    assert hint.startswith("steps held 45% of their room (8 x 1024 tokens a micro batch") and \
        'train.batching = "tokens" fills' in hint
    assert batch_fill_hint(sft, [0.7 * room], world=4) is None  # full enough
    assert batch_fill_hint(sft, [0.45 * room], world=2) is None  # on 2 ranks those steps were 90 % full
    for other in ({"train": {**sft["train"], "batching": "tokens"}},  # already filled
                  {"train": {**sft["train"], "packing": False}},  # unpacked: rows are padded, not filled
                  {"method": {"kind": "pretrain"}},  # full blocks already
                  {"method": {"kind": "dpo"}},  # pairs are never packed
                  {"train": {**sft["train"], "micro_batch": "auto"}}):
        assert batch_fill_hint({**sft, **other}, [0.1 * room], world=4) is None, other
    assert batch_fill_hint(sft, [], world=4) is None and batch_fill_hint(None, [1.0], world=1) is None


def test_token_budget_batches_cover_every_example_once_within_budget():
    lengths = [(i * 37) % 120 + 8 for i in range(203)]
    batches = budget_batches(lengths, 512, seed=3)
    assert sorted(i for b in batches for i in b) == list(range(203))
    assert all(sum(lengths[i] for i in b) <= 512 for b in batches)
    assert sum(sum(lengths[i] for i in b) for b in batches[:-1]) / (len(batches) - 1) > 512 - max(lengths)
    ranks = [TokenBudgetBatches(lengths, 512, seed=3, rank=r, world=2) for r in range(2)]
    mine = [list(s) for s in ranks]
    assert len(mine[0]) == len(mine[1]) == len(ranks[0]) >= len(batches) // 2
    assert not {i for b in mine[0] for i in b} & {i for b in mine[1] for i in b}
    ranks[0].set_epoch(1)
    assert list(ranks[0]) != mine[0]  # a new shuffle each epoch


def test_torch_extensions_dir_is_per_environment_unless_set(tmp_path):
    env = {"LLMTUI_CACHE": str(tmp_path)}
    folder = torch_extensions_dir(env)
    assert folder.startswith(str(tmp_path / "torch_extensions")) and folder == torch_extensions_dir(env)
    assert torch_extensions_dir({**env, "TORCH_EXTENSIONS_DIR": "/x"}) == "/x"


@pytest.mark.slow  # over 1.5 s on 2 quiet cores
@pytest.mark.tiny
def test_sdpa_and_eager_attention_give_the_same_losses(llmtui_cache):
    """Three AdamW steps on packed rows (position ids restart per example) from the same seed. Both
    are fp32 on CPU and differ only in how the softmax is summed, ~1e-7 relative per op; after
    three steps of lr 1e-2 the losses agree to 1e-4 (a masking bug would differ by > 1e-2)."""
    path = resolve_model_path("tiny")
    tokenizer = load_tokenizer(path, False)
    texts = ["The capital of France is Paris.", "Cows say moo.", "Two plus two is four, said the teacher.",
             "Water boils at one hundred degrees."]
    features = [{"input_ids": ids, "labels": ids} for ids in tokenizer(texts)["input_ids"]]
    batch = PackedRowsCollator(24, tokenizer.pad_token_id)(features)
    assert batch["input_ids"].shape[0] < len(texts)  # packed: several examples share a row
    losses = {}
    for kind in ("sdpa", "eager"):
        r = recipe(model={"attn_implementation": kind}, method={"kind": "sft"}, train={"seed": 7})
        torch.manual_seed(7)
        model = load_model(r, str(path), "fp32")
        assert model.config._attn_implementation == kind
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[kind] = []
        for _ in range(3):
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses[kind].append(loss.item())
    assert losses["sdpa"] == pytest.approx(losses["eager"], rel=1e-4)
    assert losses["sdpa"][-1] < losses["sdpa"][0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_attention_takes_flash_attention_on_cuda_when_installed():
    import importlib.util

    expected = "flash_attention_2" if importlib.util.find_spec("flash_attn") else "sdpa"
    assert attn_implementation("auto", "bf16", cuda=True) == expected
    assert os.environ.get("CUDA_VISIBLE_DEVICES") != ""
