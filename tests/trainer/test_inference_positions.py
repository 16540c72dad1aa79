"""Answers of a model whose positions are a learned table (gpt2's n_positions): generation stops at
the last position instead of failing with IndexError, and a conversation longer than the table is
refused with what to do (llmtui chat, the TUI chat and llmtui serve all answer through it)."""

from __future__ import annotations

import pytest
import torch

from tuiapp.core.common.errors import UserError
from tuiapp.core.config.recipe import GenerateSpec
from tuiapp.trainer.tools import inference

pytestmark = pytest.mark.tiny

POSITIONS = 64


@pytest.fixture(scope="module")
def gpt2(tiny_model):
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2, n_positions=POSITIONS,
                        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
    model = GPT2LMHeadModel(config).eval()
    return inference.Loaded("tuned", "final", model, tokenizer, 0.0)


def test_an_answer_stops_at_the_last_learned_position(gpt2):
    result = inference.generate(gpt2, [{"role": "user", "content": "hi"}], GenerateSpec(max_new_tokens=500))
    assert result["prompt_tokens"] + result["tokens"] <= POSITIONS


def test_a_conversation_longer_than_the_positions_is_refused_with_the_fix(gpt2):
    with pytest.raises(UserError) as caught:  # it was IndexError: index out of range in self
        inference.generate(gpt2, [{"role": "user", "content": "word " * 200}], GenerateSpec(max_new_tokens=5))
    assert f"the model reads at most {POSITIONS}" in caught.value.message
    assert "shorter message" in caught.value.fix
