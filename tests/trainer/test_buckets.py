"""Packed batch lengths bucketed to a multiple of 64 on a GPU (trainer/dataset/buckets.py): the padding is a
segment of its own, so the loss and gradients through torch_varlen and through eager rows are those
of the batch without it, and the non-padding token count is unchanged."""

import pytest
import torch
from transformers import AutoModelForCausalLM, DataCollatorWithFlattening, LlamaConfig

from tuiapp.core.plan.model_profile import TORCH_VARLEN
from tuiapp.trainer.dataset.buckets import BUCKET, BucketedLengths, bucket_multiple
from tuiapp.trainer.dataset.packing import PackedRowsCollator
from tuiapp.trainer.models import torch_varlen

SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=300, use_cache=False)
PAD = 0


def _examples():
    generator = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(1, 300, (n,), generator=generator).tolist(),
             "labels": torch.randint(1, 300, (n,), generator=generator).tolist()} for n in (9, 23, 14)]


def _loss_and_grads(model, batch):
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("attention, collator", [
    (TORCH_VARLEN, DataCollatorWithFlattening(return_flash_attn_kwargs=True)),
    ("eager", PackedRowsCollator(32, PAD)),
], ids=["torch_varlen-flattened", "eager-rows"])
def test_a_bucketed_batch_trains_as_the_batch_without_padding(attention, collator):
    torch_varlen.install()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPE), attn_implementation=attention)
    torch_varlen.mark_packed_rows(model)
    plain = collator(_examples())
    bucketed = BucketedLengths(collator, BUCKET, PAD)(_examples())
    assert bucketed["input_ids"].shape[1] % BUCKET == 0 and bucketed["input_ids"].shape[1] > plain["input_ids"].shape[1]
    assert (bucketed["input_ids"] != PAD).sum() == (plain["input_ids"] != PAD).sum()
    if "cu_seq_lens_q" in bucketed:
        assert bucketed["cu_seq_lens_q"].tolist() == [*plain["cu_seq_lens_q"].tolist(), BUCKET]
    loss, grads = _loss_and_grads(model, plain)
    loss_b, grads_b = _loss_and_grads(model, bucketed)
    assert loss_b == pytest.approx(loss, abs=1e-5)
    for a, b in zip(grads, grads_b, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_only_a_gpu_buckets_and_a_full_bucket_is_left_alone():
    assert bucket_multiple(cuda=True) == BUCKET and bucket_multiple(cuda=False) == 0
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    examples = [{"input_ids": list(range(1, 65)), "labels": list(range(1, 65))}]
    assert BucketedLengths(collator, BUCKET, PAD)(examples)["input_ids"].shape[1] == 64
    assert BucketedLengths(collator, 0, PAD)(_examples())["input_ids"].shape[1] == 46
