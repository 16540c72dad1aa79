"""Dropout on the CPU from a fast generator: the same math, a third of the time.

torch draws a CPU dropout mask with its Mersenne Twister, one number per element, on one thread:
at 2 threads LoRA's dropout (peft draws a mask before each adapted projection) took a quarter of
a small model's step. Here the mask comes from numpy's SFC64, seeded from torch's generator on each
call (so `torch.manual_seed`, the Trainer's seed and a resumed RNG state still decide it): an
element is kept when a uniform 32-bit draw is at least p·2³² (probability 1 - p to within 2⁻³²,
finer than torch's float draw), and kept elements are scaled by 1/(1 - p). The backward keeps the
boolean mask, as torch's does. Tensors on a GPU use torch's own dropout.
"""

from __future__ import annotations

import numpy as np
import torch


def keep_mask(shape: torch.Size, p: float) -> torch.Tensor:
    """A boolean mask, each element True with probability 1 - p."""
    count = int(np.prod(shape, dtype=np.int64))
    seed = int(torch.randint(0, 2**62, (1,)).item())  # torch's generator decides the stream
    draws = np.random.SFC64(seed).random_raw((count + 1) // 2).view(np.uint32)[:count]
    return torch.from_numpy(draws >= np.uint32(min(int(p * 2**32), 2**32 - 1))).view(shape)


class _MaskedScale(torch.autograd.Function):
    """x·mask·scale with the mask saved for the backward: one fused pass each way, as torch's own."""

    @staticmethod
    def forward(ctx, x, mask, scale):
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return torch.ops.aten.native_dropout_backward(x, mask, scale)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return torch.ops.aten.native_dropout_backward(grad, mask, ctx.scale), None, None


class CpuDropout(torch.nn.Dropout):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0 or x.device.type != "cpu" or self.inplace:
            return super().forward(x)
        if self.p >= 1:
            return x * 0.0
        return _MaskedScale.apply(x, keep_mask(x.shape, self.p), 1.0 / (1.0 - self.p))


def install(model: torch.nn.Module) -> int:
    """Turn the model's dropout modules (p > 0) into CpuDropout, keeping p and mode; returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Dropout and module.p > 0:
            module.__class__ = CpuDropout
            count += 1
    return count
