"""train.precision = "fp8": torchao's float8 training on the linear layers (Ada/Hopper GPUs).

The run trains in bf16 (autocast, DeepSpeed's bf16 path, bf16 activations); the model's linear
layers are swapped for torchao's Float8Linear, whose matmuls run in float8 with dynamic per-tensor
scaling (`torchao.float8.convert_to_float8_training`), the way axolotl and LLaMA-Factory offer it.
The output head stays in bf16 (its logits set the loss), and so does any linear whose sizes the
float8 matmul cannot take (multiples of 16). Preflight refuses fp8 on CPU, without torchao, and on
GPUs of compute capability below 8.9 (core.prelaunch.machine_rules.fp8_rules, resources.fp8_gpu_rules).
"""

from __future__ import annotations

import torch

SKIPPED = ("lm_head", "embed_out", "output")  # the head: its logits carry the loss


def converts(module: torch.nn.Module, name: str) -> bool:
    """A linear layer float8 training takes: not the head, both sizes multiples of 16."""
    return (isinstance(module, torch.nn.Linear) and name.split(".")[-1] not in SKIPPED
            and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def convert(model: torch.nn.Module) -> int:
    """Swap `model`'s linear layers for torchao's Float8Linear (in place); returns how many."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    names = [name for name, module in model.named_modules() if converts(module, name)]
    convert_to_float8_training(model, config=Float8LinearConfig(), module_filter_fn=converts)
    return len(names)
