"""CPU dropout from numpy's SFC64 (trainer/loop/cpu_dropout.py): torch's dropout, the same math."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig

from tuiapp.trainer.loop.cpu_dropout import CpuDropout, install


@pytest.mark.parametrize("p", [0.05, 0.5])
def test_keeps_one_minus_p_scaled_and_its_gradient_is_the_mask(p):
    x = torch.randn(64, 1000, requires_grad=True)
    torch.manual_seed(0)
    y = CpuDropout(p).train()(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 4 * ((p * (1 - p) / x.numel()) ** 0.5)
    assert torch.allclose(y[kept], x[kept] / (1 - p))
    y.backward(torch.ones_like(y))
    assert torch.allclose(x.grad, kept.float() / (1 - p))


def test_the_mask_follows_torchs_seed_and_rows_differ():
    x = torch.ones(8, 4096)
    dropout = CpuDropout(0.1).train()
    torch.manual_seed(1)
    first = dropout(x)
    torch.manual_seed(1)
    assert torch.equal(dropout(x), first)  # the Trainer's seed and a resumed RNG state decide it
    torch.manual_seed(2)
    assert not torch.equal(dropout(x), first)
    assert not torch.equal(first[0], first[1])
    assert torch.equal(dropout.eval()(x), x)


def test_install_swaps_loras_dropouts_and_nothing_else():
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=100)
    model = get_peft_model(AutoModelForCausalLM.from_config(config),
                           LoraConfig(r=4, lora_dropout=0.05, target_modules="all-linear"))
    assert install(model) == 2 * 7  # q k v o gate up down in each layer
    assert all(type(m) is CpuDropout for name, m in model.named_modules() if name.endswith("lora_dropout.default"))
    torch.manual_seed(0)
    loss = model(input_ids=torch.randint(0, 100, (2, 16)), labels=torch.randint(0, 100, (2, 16))).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert install(torch.nn.Sequential(torch.nn.Dropout(0.0), torch.nn.Linear(2, 2))) == 0
