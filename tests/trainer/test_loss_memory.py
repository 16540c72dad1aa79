"""The estimate's logits term against the tensors a real training step holds.

`estimate.activation_bytes` counts LOSS_BYTES_PER_LOGIT for each logit: the three fp32 copies live at the
start of the loss's backward (the log-softmax output saved for it, the NLL's gradient, the log-softmax's
gradient). Here a real causal LM's step (forward with labels, the outputs dropped but the loss as the
Trainer does, backward) is profiled at two vocabulary sizes: the live peak of its allocations grows by
that many bytes per added logit, in fp32 and in bf16 (transformers' loss upcasts the logits).
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tuiapp.core.plan.estimate import LOSS_BYTES_PER_LOGIT, TINY_CONFIG, activation_bytes

TOKENS = 256


def live_peak(vocab: int, dtype: torch.dtype) -> int:
    """The highest sum of the live allocations during one step, in bytes (torch.profiler's memory events)."""
    keys = {k: v for k, v in TINY_CONFIG.items() if k != "architectures"}
    config = LlamaConfig(**{**keys, "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
                            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2})
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype).train()
    ids = torch.randint(0, vocab, (1, TOKENS))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = model(input_ids=ids, labels=ids).loss  # the Trainer keeps the loss only
        loss.backward()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, size in events:
        live += size
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_logits_term_counts_what_the_loss_backward_holds(dtype):
    small, large = live_peak(2048, dtype), live_peak(4096, dtype)
    per_logit = (large - small) / (TOKENS * 2048)
    # the embedding's gradient grows with the vocabulary too (64 fp32 values per added row, 1/8 of a byte per
    # logit here), the rest is the loss's copies of the logits
    assert LOSS_BYTES_PER_LOGIT <= per_logit < LOSS_BYTES_PER_LOGIT + 0.5, per_logit
    counted = activation_bytes(seq_len=TOKENS, micro_batch=1, hidden=64, heads=2, layers=0, vocab=4096,
                               checkpointing=False, bytes_per_value=2 if dtype == torch.bfloat16 else 4)
    assert counted == TOKENS * 4096 * LOSS_BYTES_PER_LOGIT
