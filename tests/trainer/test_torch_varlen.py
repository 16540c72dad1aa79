"""torch's varlen attention on packed rows (trainer/models/torch_varlen.py): the function against a plain
attention per example (forward and gradients, GQA), a packed tiny model's loss against its examples
apart under eager, and the choice `model.attn_implementation = "auto"` makes (core.plan.model_profile).
On CPU tensors the function runs its fallback (sdpa per example); the CUDA test runs the kernel."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, DataCollatorWithFlattening, LlamaConfig, Qwen2Config

from tuiapp.core.plan.model_profile import TORCH_VARLEN, ModelProfile, attention_kernel, choose_attention
from tuiapp.trainer.models import torch_varlen, varlen

LENGTHS = [9, 23, 1, 14]
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=300, use_cache=False)


def _reference(query, key, value, lengths, scale):
    """Plain causal attention per example (matmul + softmax), GQA by repeating the KV heads."""
    group = query.shape[0] // key.shape[0]
    key, value = key.repeat_interleave(group, 0), value.repeat_interleave(group, 0)
    out, start = [], 0
    for n in lengths:
        q, k, v = (t[:, start:start + n].float() for t in (query, key, value))
        scores = q @ k.transpose(-1, -2) * scale
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1).to(q.device), float("-inf"))
        out.append((scores.softmax(-1) @ v).transpose(0, 1))
        start += n
    return torch.cat(out).to(query.dtype)


def _qkv(device="cpu", dtype=torch.float32, heads=(8, 2), dim=16):
    generator = torch.Generator().manual_seed(0)
    total = sum(LENGTHS)
    make = lambda h: torch.randn(h, total, dim, generator=generator).to(device, dtype).requires_grad_()  # noqa: E731
    return make(heads[0]), make(heads[1]), make(heads[1])


def _cu(device="cpu"):
    return torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32, device=device)


def _check_against_reference(device, dtype, atol):
    query, key, value = _qkv(device, dtype)
    scale = 1 / math.sqrt(query.shape[-1])
    out = torch_varlen.packed_attention(query, key, value, _cu(device), max(LENGTHS), scaling=scale)
    ref_inputs = [t.detach().clone().requires_grad_() for t in (query, key, value)]
    ref = _reference(*ref_inputs, LENGTHS, scale)
    assert out.shape == (sum(LENGTHS), 8, 16)
    assert torch.allclose(out.float(), ref.float(), atol=atol)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    for mine, theirs in zip((query, key, value), ref_inputs, strict=True):
        assert torch.allclose(mine.grad.float(), theirs.grad.float(), atol=atol * 4)


def test_packed_attention_matches_attention_per_example_on_cpu():
    _check_against_reference("cpu", torch.float32, 1e-5)  # the fallback: sdpa per example, GQA


@pytest.mark.skipif(not torch_varlen.available(), reason="needs a CUDA GPU of compute capability 8.0+")
def test_varlen_kernel_matches_attention_per_example_on_cuda():
    _check_against_reference("cuda", torch.bfloat16, 3e-2)


def _kernel_of(signature: str):
    """A stand-in for torch's varlen_attn with one release's signature (the kernel itself needs CUDA): the
    plain reference on (tokens, heads, dim) tensors; without enable_gqa it refuses unequal head counts."""
    def run(query, key, value, cu_q, cu_k, max_q, max_k, causal, scale, gqa):
        assert causal and max_q == max_k == max(LENGTHS) and torch.equal(cu_q, cu_k)
        assert gqa or query.shape[1] == key.shape[1], "this signature has no grouped-query attention"
        scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
        return _reference(query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), LENGTHS, scale)

    if signature == "2.13":
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                        window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
            return run(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size == (-1, 0), scale,
                       enable_gqa)
    elif signature == "2.11":
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                        window_size=(-1, -1)):
            return run(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size == (-1, 0), scale, False)
    else:
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
            return run(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, None, False)
    return varlen_attn


@pytest.mark.parametrize("signature", ["2.13", "2.11", "2.10"])
def test_the_kernel_call_fits_each_torch_releases_signature(monkeypatch, signature):
    """torch 2.10-2.12's varlen_attn lacks enable_gqa (2.11 on the H200 refused it), 2.10 also scale and
    window_size: KV heads are repeated, a model's own scale folded into the query, causal said either way."""
    from torch.nn.attention import varlen as torch_module

    monkeypatch.setattr(torch_module, "varlen_attn", _kernel_of(signature))
    torch_varlen._varlen_params.cache_clear()
    try:
        query, key, value = (t.detach() for t in _qkv())
        scale = 0.3  # not 1/sqrt(dim): a model's own scaling
        out = torch_varlen._varlen_call(query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), _cu(),
                                        max(LENGTHS), scale)
        assert torch.allclose(out, _reference(query, key, value, LENGTHS, scale), atol=1e-5)
    finally:
        torch_varlen._varlen_params.cache_clear()


def test_kernel_fits_only_what_it_runs_as_meant():
    assert torch_varlen.kernel_fits(64, torch.bfloat16)
    assert torch_varlen.kernel_fits(256, torch.float16)
    assert not torch_varlen.kernel_fits(64, torch.float32)
    assert not torch_varlen.kernel_fits(320, torch.bfloat16)
    assert not torch_varlen.kernel_fits(60, torch.bfloat16)
    assert not torch_varlen.kernel_fits(64, torch.bfloat16, softcap=50.0)
    assert not torch_varlen.kernel_fits(64, torch.bfloat16, window=16, longest=32)
    assert torch_varlen.kernel_fits(64, torch.bfloat16, window=64, longest=32)  # inside the window: causal
    assert not torch_varlen.kernel_fits(64, torch.bfloat16, dropout=0.1)


def _examples():
    generator = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, 300, (n,), generator=generator).tolist(),
             "labels": torch.randint(0, 300, (n,), generator=generator).tolist()} for n in LENGTHS if n > 1]


@pytest.mark.parametrize("config", [LlamaConfig, Qwen2Config], ids=["llama", "qwen2"])
def test_packed_row_through_torch_varlen_loses_what_eager_loses_apart(config):
    torch_varlen.install()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(**SHAPE), attn_implementation=TORCH_VARLEN)
    torch_varlen.mark_packed_rows(model)
    assert varlen.runs_varlen(model.config._attn_implementation, cuda=True)  # the flattening collator
    examples = _examples()
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(examples)
    loss = model(**batch).loss
    loss.backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.config._attn_implementation = "eager"
    total, count = 0.0, 0
    for example in examples:
        n = len(example["labels"]) - 1
        out = model(input_ids=torch.tensor([example["input_ids"]]), labels=torch.tensor([example["labels"]]))
        total, count = total + out.loss * n, count + n
    (total / count).backward()
    assert loss.item() == pytest.approx((total / count).item(), abs=1e-5)
    for mine, theirs in zip(packed_grads, (p.grad for p in model.parameters()), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5)
    assert torch_varlen._row["tokens"] is None  # forgotten after the forward


def test_unpacked_and_padded_batches_keep_their_mask():
    torch_varlen.install()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(LlamaConfig(**SHAPE), attn_implementation=TORCH_VARLEN).eval()
    torch_varlen.mark_packed_rows(model)
    ids = torch.randint(0, 300, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding, as generation pads
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits[1, 4:]
        alone = model(input_ids=ids[1:, 4:]).logits[0]
    assert torch.allclose(padded, alone, atol=1e-5)


def _profile(attention=("flash_attention_2", "sdpa", "flex_attention", "eager"), **facts):
    return ModelProfile({"model_type": "llama", "architecture": "LlamaForCausalLM", "attention": list(attention),
                         "attention_facts": {"head_dim": 64, **facts}})


def _auto(profile, *, cuda=True, flash=False, precision="bf16", packed=True, kernel=None):
    return choose_attention(profile, "auto", cuda=cuda, flash_installed=flash, precision=precision, packed=packed,
                            varlen_kernel=kernel)[0]


def test_auto_picks_torch_varlen_on_cuda_for_packed_batches_without_flash_attn():
    llama = _profile()
    assert _auto(llama) == TORCH_VARLEN
    assert _auto(llama, precision="auto") == TORCH_VARLEN
    assert _auto(llama, flash=True) == "flash_attention_2"  # flash-attn installed: its own kernels
    assert _auto(llama, packed=False) == "sdpa"  # nothing to split: sdpa's fused kernels
    assert _auto(llama, cuda=False, precision="fp32") == "sdpa"  # CPU: sdpa per example (varlen.py)
    assert _auto(llama, precision="fp32") == "sdpa"  # the kernel takes half precision only
    assert _auto(llama, kernel=False) == "sdpa"  # a GPU older than Ampere
    assert _auto(_profile(attention=("sdpa", "eager"))) == "sdpa"  # passes no boundaries to its attention


def test_auto_falls_back_where_the_varlen_kernel_cannot_run_the_model():
    assert _auto(_profile(sliding_window=4096)) == "flex_attention"
    chosen, findings = choose_attention(_profile(softcap=50.0), "auto", cuda=True, flash_installed=False,
                                        precision="bf16", packed=True)
    assert chosen == "flex_attention" and "softcapping" in findings[0].message
    assert _auto(_profile(head_dim=320)) == "flex_attention"
    assert _auto(_profile(attention=("flash_attention_2", "sdpa", "eager"), softcap=30.0)) == "sdpa"
    assert _auto(_profile(attention=("flash_attention_2", "eager"), sliding_window=512)) == "eager"


def test_model_plan_names_the_kernel_that_runs():
    assert "varlen_attn" in attention_kernel(TORCH_VARLEN, cuda=True, packed=True)
    assert "per packed example" in attention_kernel(TORCH_VARLEN, cuda=False, packed=True)
    assert "document mask" in attention_kernel("flex_attention", cuda=True, packed=True)
    assert "flash-attn 2" in attention_kernel("flash_attention_2", cuda=True, packed=True)
    assert "block-diagonal" in attention_kernel("sdpa", cuda=True, packed=True)


def test_the_profile_records_what_decides_the_kernel():
    from transformers import Gemma2Config, MistralConfig

    from tuiapp.trainer.models.profile import attention_facts

    assert attention_facts(LlamaConfig(**SHAPE)) == {"head_dim": 8, "sliding_window": None, "softcap": None}
    assert attention_facts(MistralConfig(**SHAPE, sliding_window=64))["sliding_window"] == 64
    assert attention_facts(Qwen2Config(**SHAPE, sliding_window=64))["sliding_window"] is None  # off by default
    gemma = attention_facts(Gemma2Config(**SHAPE, head_dim=16))
    assert gemma["softcap"] and gemma["sliding_window"] and gemma["head_dim"] == 16
