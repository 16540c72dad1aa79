"""Logits only at the trained positions: the same loss and gradients as the full logits, on packed
and padded SFT batches of the tiny model, through the model and through the real Trainer."""

import pytest
import torch
import torch.nn as nn
from transformers import DataCollatorForSeq2Seq, TrainingArguments

from tuiapp.core.config.recipe import Recipe
from tuiapp.trainer.dataset.data import build_datasets, make_collator
from tuiapp.trainer.loop import trained_logits
from tuiapp.trainer.methods.adapters import apply_method
from tuiapp.trainer.models import varlen
from tuiapp.trainer.models.model import load_model, load_tokenizer
from tuiapp.trainer.run import RunTrainer


def sft_recipe(tiny_model, kind: str = "lora", **method) -> Recipe:
    return Recipe.model_validate({
        "name": "t", "model": {"name": str(tiny_model)}, "dataset": {"name": "demo:chat"},
        "method": {"kind": kind, **({"dropout": 0.0} if kind == "lora" else {}), **method},
        "train": {"micro_batch": 4, "max_seq_len": 256},
    })


@pytest.fixture(scope="module")
def lora_setup(tiny_model, llmtui_cache):
    recipe = sft_recipe(tiny_model)
    tokenizer = load_tokenizer(str(tiny_model), False)
    train_set, _ = build_datasets(recipe, tokenizer, llmtui_cache)
    return recipe, tokenizer, train_set


def lora_model(recipe, tiny_model):
    torch.manual_seed(0)
    model = apply_method(load_model(recipe, str(tiny_model), "fp32"), recipe, str(tiny_model))
    with torch.no_grad():  # B starts at zero; give the adapters a gradient path through both factors
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.02)
    return model.train()


def loss_and_grads(model, batch):
    model.zero_grad()
    out = model(**batch)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return out, grads


@pytest.mark.slow  # over 1.5 s on 2 quiet cores
@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_the_loss_and_gradients_match_the_full_logits(lora_setup, tiny_model, layout):
    recipe, tokenizer, train_set = lora_setup
    varlen.install()
    examples = [train_set[i] for i in range(4)]
    if layout == "packed":
        batch = make_collator(recipe, tokenizer, varlen_attention=True)(examples)
        assert "cu_seq_lens_q" in batch  # one flattened row, as packed SFT trains
    else:
        batch = DataCollatorForSeq2Seq(tokenizer, padding=True)(examples)
    model = lora_model(recipe, tiny_model)
    full, full_grads = loss_and_grads(model, dict(batch))
    narrowed = trained_logits.narrowed(dict(batch))
    kept, kept_grads = loss_and_grads(model, narrowed)

    trained = int((narrowed["shift_labels"] != -100).sum())
    assert trained == int((batch["labels"][..., 1:] != -100).sum()) > 0
    assert kept.logits.shape == (trained, model.config.vocab_size)  # fewer rows than positions
    assert trained < batch["labels"].numel()
    torch.testing.assert_close(kept.loss, full.loss, rtol=1e-6, atol=1e-6)
    assert full_grads.keys() == kept_grads.keys() and full_grads
    for name, grad in full_grads.items():
        torch.testing.assert_close(kept_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow  # over ~3.5 s on 2 busy cores (10.7 s in the fast tier)
def test_the_trainer_logs_the_same_losses(lora_setup, tiny_model, tmp_path):
    recipe, tokenizer, train_set = lora_setup
    varlen.install()
    losses, projected = {}, {False: 0, True: 0}
    for only in (False, True):
        model = lora_model(recipe, tiny_model)
        model.get_base_model().lm_head.register_forward_hook(
            lambda module, args, out, only=only: projected.__setitem__(only, projected[only] + out.shape[:-1].numel()))
        args = TrainingArguments(output_dir=str(tmp_path / str(only)), per_device_train_batch_size=4, max_steps=4,
                                 logging_steps=1, learning_rate=1e-3, report_to=[], save_strategy="no",
                                 disable_tqdm=True, remove_unused_columns=False, seed=0, use_cpu=True)
        trainer = RunTrainer(model=model, args=args, train_dataset=train_set, processing_class=tokenizer,
                             data_collator=make_collator(recipe, tokenizer, varlen_attention=True))
        trainer.trained_logits_only = only
        trainer.train()
        losses[only] = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(losses[True]) == 4
    assert 0 < projected[True] < projected[False]  # the narrowed run projected only the trained positions
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)


def test_where_it_applies(lora_setup, tiny_model):
    recipe, _, _ = lora_setup
    model = load_model(recipe, str(tiny_model), "fp32")
    assert trained_logits.applies(model, "sft", fused_loss=False)
    assert trained_logits.applies(apply_method(model, recipe, str(tiny_model)), "lora", fused_loss=False)
    for kind in ("prefix", "prompt", "ptuning", "pretrain"):  # virtual tokens shift positions; pretrain trains all
        assert not trained_logits.applies(model, kind, fused_loss=False)
    assert not trained_logits.applies(model, "lora", fused_loss=True)  # Liger's fused loss holds no logits

    class RemoteCode(nn.Module):  # a model from outside transformers.models: its slicing is unknown
        def forward(self, input_ids, logits_to_keep=0):
            return input_ids

    assert not trained_logits.applies(RemoteCode(), "lora", fused_loss=False)


def test_batches_without_labels_or_already_narrowed_pass_unchanged():
    ids = torch.tensor([[1, 2, 3]])
    assert trained_logits.narrowed({"input_ids": ids}) == {"input_ids": ids}
    labels = torch.tensor([[-100, 5, 6, -100, 7]])
    narrowed = trained_logits.narrowed({"input_ids": ids, "labels": labels})
    assert narrowed["logits_to_keep"].tolist() == [[True, True, False, True, False]]
    assert narrowed["shift_labels"].tolist() == [5, 6, 7]
    assert trained_logits.narrowed(narrowed) is narrowed
