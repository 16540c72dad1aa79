"""sdpa per packed example (trainer/models/varlen.py) on real architectures: the same loss as the
examples run apart, no tokens × tokens mask while every layer runs per example, and the mask
(and the whole-row sdpa) kept where a sliding window is shorter than an example."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    DataCollatorWithFlattening,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    StableLmConfig,
)
from transformers.masking_utils import sdpa_mask

from tuiapp.trainer.models import varlen

SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=300, use_cache=False, attn_implementation="sdpa")
LENGTHS = [9, 23, 14]


def _examples():
    generator = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, 300, (n,), generator=generator).tolist(),
             "labels": torch.randint(0, 300, (n,), generator=generator).tolist()} for n in LENGTHS]


def _apart(model, examples) -> float:
    total = count = 0
    for example in examples:
        ids, labels = torch.tensor([example["input_ids"]]), torch.tensor([example["labels"]])
        total += model(input_ids=ids, labels=labels).loss.item() * (len(example["labels"]) - 1)
        count += len(example["labels"]) - 1
    return total / count


@pytest.mark.parametrize("config, maskless", [
    (LlamaConfig(**SHAPE), True),
    ("lora", True),  # peft calls the causal LM's forward itself; the decoder's hooks still see the row
    (MistralConfig(**SHAPE, sliding_window=64), True),  # every example inside the window: plain causal
    (MistralConfig(**SHAPE, sliding_window=16), False),  # one example is longer than the window
    (Qwen2Config(**SHAPE, use_sliding_window=True, sliding_window=16, max_window_layers=1), False),
    # StableLM's decoder layer hands its attention no boundaries: it runs on those of the row (was a RuntimeError)
    (StableLmConfig(**SHAPE), True),
], ids=["llama", "llama-lora", "mistral-wide-window", "mistral-short-window", "qwen2-sliding-layers", "stablelm"])
def test_packed_row_loses_what_its_examples_lose_apart(config, maskless, monkeypatch):
    varlen.install()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPE) if config == "lora" else config).eval()
    varlen.skip_packed_mask(model)  # as load_model does, before peft wraps the model
    if config == "lora":
        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    examples = _examples()
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(examples)
    built, whole_row = [], []
    monkeypatch.setattr(varlen, "sdpa_mask", lambda *a, **k: built.append(k["q_length"]) or sdpa_mask(*a, **k))
    real_forward = varlen.sdpa_attention_forward
    monkeypatch.setattr(varlen, "sdpa_attention_forward", lambda m, q, *a, **k: whole_row.append(q.shape[2])
                        or real_forward(m, q, *a, **k))
    with torch.no_grad():
        packed = model(**batch).loss.item()
    row = sum(LENGTHS)
    assert (row not in built) == maskless
    assert (row in whole_row) == (not maskless)  # a short window: that layer runs the row with its mask
    monkeypatch.undo()
    with torch.no_grad():
        assert packed == pytest.approx(_apart(model, examples), abs=1e-5)
    assert varlen._maskless_row["tokens"] is None  # forgotten after the forward


def test_unpacked_batches_keep_their_mask():
    varlen.install()
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPE)).eval()
    varlen.skip_packed_mask(model)
    ids = torch.randint(0, 300, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits[1, 4:]
        alone = model(input_ids=ids[1:, 4:]).logits[0]
    assert torch.allclose(padded, alone, atol=1e-5)
