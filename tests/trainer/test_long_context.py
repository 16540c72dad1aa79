"""The rank-side pieces of long context that run without a process group: the sequence-parallel
collator, packed boundaries from position ids, tiled MLP (same values and gradients), activation
offload's hooks and RoPE scaling on a real config."""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.trainer.models import long_context, varlen


def test_collator_adds_positions_pads_to_the_degree_and_drops_1d_tensors():
    flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    collate = long_context.SequenceParallelCollator(flat, 4, pad_token_id=0)
    batch = collate([{"input_ids": [5, 6, 7], "labels": [5, 6, 7]}, {"input_ids": [8, 9], "labels": [8, 9]}])
    assert not set(long_context.DROPPED_KEYS) & set(batch)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]  # padding continues the last example
    assert batch["labels"].tolist()[0][5:] == [-100] * 3

    def padded(features):
        return {"input_ids": torch.tensor([[1, 2, 3], [4, 5, 0]]), "labels": torch.tensor([[1, 2, 3], [4, 5, -100]]),
                "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}

    fixed = long_context.SequenceParallelCollator(padded, 2, pad_token_id=0, fixed_length=6)(None)
    assert fixed["input_ids"].shape == (2, 6) and fixed["position_ids"][0].tolist() == list(range(6))
    assert fixed["attention_mask"].sum().item() == 5


def test_boundaries_from_positions_keep_packed_examples_apart():
    varlen.install()
    attend = long_context.boundaries_from_positions(varlen.sdpa_per_example)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 8) for _ in range(3))
    module = torch.nn.Module()
    module.is_causal = True
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    out, _ = attend(module, q, k, v, None, position_ids=positions)
    first = sdpa_attention_forward(module, q[:, :, :3], k[:, :, :3], v[:, :, :3], None, is_causal=True)[0]
    second = sdpa_attention_forward(module, q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], None, is_causal=True)[0]
    assert torch.allclose(out, torch.cat([first, second], dim=1), atol=1e-6)
    whole, _ = attend(module, q, k, v, None, position_ids=torch.arange(7).unsqueeze(0))  # one example: as it is
    assert torch.allclose(whole, sdpa_attention_forward(module, q, k, v, None, is_causal=True)[0], atol=1e-6)


def tiny_llama(**extra):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, **extra)
    return LlamaForCausalLM(config)


def test_tiled_mlp_gives_the_same_loss_and_gradients():
    ids = torch.randint(0, 64, (1, 80), generator=torch.Generator().manual_seed(1))
    plain, tiled = tiny_llama(), tiny_llama()
    assert long_context.apply_tiled_mlp(tiled) == 2  # one MLP per layer, in 80/16 = 5 slices
    losses = []
    for model in (plain, tiled):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) < 1e-5
    for a, b in zip(plain.parameters(), tiled.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-5)


def test_activation_offload_hooks_leave_the_result_unchanged():
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(2))
    plain, offloaded = tiny_llama(), tiny_llama()
    long_context.offload_activations(offloaded)  # on CPU: save_on_cpu without pinning still runs
    a, b = plain(input_ids=ids, labels=ids).loss, offloaded(input_ids=ids, labels=ids).loss
    a.backward()
    b.backward()
    assert torch.allclose(a, b) and torch.allclose(plain.lm_head.weight.grad, offloaded.lm_head.weight.grad)


def test_rope_scaling_becomes_the_config_transformers_reads():
    recipe = recipe_from_dict({"model": {"name": "tiny", "rope_scaling": {"type": "yarn", "factor": 4},
                                         "max_position_embeddings": 1024},
                               "dataset": {"name": "demo:chat"}, "method": {"kind": "sft"}})
    model = tiny_llama()
    overrides = long_context.rope_overrides(recipe, model.config)
    assert overrides["rope_parameters"] == {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                            "original_max_position_embeddings": 256}
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, **overrides)
    scaled = LlamaForCausalLM(config)
    assert scaled.model.rotary_emb.rope_type == "yarn" and config.max_position_embeddings == 1024


def _tiled_vs_plain(make, labels_of=lambda ids: ids, slice_tokens=7):
    ids = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(3))
    labels = labels_of(ids)
    plain, tiled = make(), make()
    long_context.apply_tiled_loss(tiled)
    results = []
    for model in (plain, tiled):
        model.train()
        if model is tiled:  # small slices: several per batch
            keep, targets = long_context._trained(labels, None, 0)
            outputs = model.get_decoder()(input_ids=ids)
            loss = long_context.tiled_loss(model, outputs.last_hidden_state[keep], targets, slice_tokens=slice_tokens)
            assert torch.allclose(loss, model(input_ids=ids, labels=labels).loss, atol=1e-6)  # the patched forward
            assert model(input_ids=ids, labels=labels).logits is None  # no logits tensor is made in training
        else:
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        results.append(loss.item())
    assert abs(results[0] - results[1]) < 1e-5
    for a, b in zip(plain.parameters(), tiled.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=1e-5)
    tiled.eval()
    with torch.no_grad():  # evaluation runs the model's own forward, logits and all
        assert tiled(input_ids=ids, labels=labels).logits.shape == (2, 40, 64)


def test_tiled_loss_gives_the_same_loss_and_gradients():
    _tiled_vs_plain(tiny_llama)


def test_tiled_loss_skips_the_prompts_like_the_models_own_loss():
    def prompts_masked(ids):
        labels = ids.clone()
        labels[:, :15] = -100
        return labels

    _tiled_vs_plain(tiny_llama, prompts_masked)


def test_tiled_loss_applies_gemmas_final_softcapping():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    def gemma():
        torch.manual_seed(0)
        return Gemma2ForCausalLM(Gemma2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                              num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                              final_logit_softcapping=2.0, attn_implementation="eager"))

    _tiled_vs_plain(gemma)


def test_tiled_loss_refuses_a_forward_that_adds_to_the_loss():
    """A family whose forward adds to lm_head + cross-entropy (here a router's auxiliary loss) is caught on
    the first training batch, with the key to turn off."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    model = MixtralForCausalLM(MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=2, num_local_experts=4,
                                             num_experts_per_tok=2, output_router_logits=True,
                                             router_aux_loss_coef=0.5))
    long_context.apply_tiled_loss(model)
    model.train()
    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    with pytest.raises(long_context.TiledLossMismatch, match="set train.tiled_loss = false"):
        model(input_ids=ids, labels=ids)
