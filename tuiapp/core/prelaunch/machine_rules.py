"""Rules of the recipe on this machine's software: CUDA or not, and the libraries a setting needs
(bitsandbytes, torchao, flash_attn, liger-kernel, a C compiler, the optimizer's package, the
trackers). The door (door.py) calls machine_rules in its machine phase.
"""

from __future__ import annotations

import importlib.util
import shutil

from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import is_full, is_quantized
from tuiapp.core.config import trackers
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.prelaunch import optimizer_checks


def bitsandbytes_installed() -> bool:
    return importlib.util.find_spec("bitsandbytes") is not None


def machine_rules(recipe: Recipe, *, cuda: bool, bnb_installed: bool | None = None) -> list[Finding]:
    """Rules that depend on this machine: CUDA and installed libraries."""
    out: list[Finding] = []
    precision = recipe.train.precision
    if precision in ("bf16", "fp16") and not cuda:
        out.append(Finding("error", "train.precision",
                           f"{precision} training needs a CUDA GPU and this machine has none",
                           "set train.precision = 'fp32' or 'auto'"))
    out += fp8_rules(recipe, cuda=cuda)
    if is_quantized(recipe.method.kind):
        if not cuda:
            out.append(Finding("error", "method.kind", "qlora needs a CUDA GPU (4-bit bitsandbytes "
                               "kernels) and this machine has none",
                               "use method.kind = 'lora' on CPU, or run on a CUDA machine"))
        if not (bitsandbytes_installed() if bnb_installed is None else bnb_installed):
            out.append(Finding("error", "method.kind", "qlora needs the bitsandbytes package, which "
                               "is not installed", "pip install bitsandbytes (or use method.kind = 'lora')"))
    out += kernel_rules(recipe, cuda=cuda)
    out += optimizer_checks.rules(recipe, cuda=cuda)  # train.optimizer: device, packages, strategy
    out += trackers.findings(recipe.train.report_to)
    return out


def fp8_rules(recipe: Recipe, *, cuda: bool, torchao_installed: bool | None = None) -> list[Finding]:
    """train.precision = 'fp8' (torchao's float8 training): a CUDA GPU, the torchao package. The GPUs'
    compute capability is checked with the GPUs (fp8_gpu_rules)."""
    if recipe.train.precision != "fp8":
        return []
    if not is_full(recipe.method.kind):
        return [Finding("error", "train.precision", f"fp8 training converts the model's own linear layers, "
                        f"which {recipe.method.kind} does not train in full", "use method.kind = 'sft' or "
                        "'pretrain' with fp8, or set train.precision = 'bf16'")]
    if not cuda:
        return [Finding("error", "train.precision", "fp8 training needs a CUDA GPU with FP8 tensor cores "
                        "(compute capability 8.9+: Ada, Hopper, Blackwell) and this machine has none",
                        "set train.precision = 'auto' (fp32 on CPU)")]
    if not (importlib.util.find_spec("torchao") is not None if torchao_installed is None else torchao_installed):
        return [Finding("error", "train.precision", "fp8 training needs the torchao package, which is not "
                        "installed", "pip install 'llmtui[fp8]' (torchao), or set train.precision = 'bf16'")]
    return []


def _cuda_and_package(key: str, cuda: bool, no_cuda: str, no_cuda_fix: str, module: str, missing: str,
                      missing_fix: str) -> list[Finding]:
    """A setting that needs a CUDA GPU and then a package: the first of the two that is missing."""
    if not cuda:
        return [Finding("error", key, no_cuda, no_cuda_fix)]
    if importlib.util.find_spec(module) is None:
        return [Finding("error", key, missing, missing_fix)]
    return []


def kernel_rules(recipe: Recipe, *, cuda: bool) -> list[Finding]:
    """model.attn_implementation, train.liger_kernel, train.torch_compile on this machine."""
    out: list[Finding] = []
    if recipe.model.attn_implementation == "flash_attention_2":
        out += _cuda_and_package(
            "model.attn_implementation", cuda, "flash_attention_2 needs a CUDA GPU and this machine has none",
            "set model.attn_implementation = 'auto' or 'sdpa'", "flash_attn",
            "flash_attention_2 needs the flash_attn package, which is not installed",
            "pip install flash-attn, or set model.attn_implementation = 'auto'")
    if recipe.train.liger_kernel:
        out += _cuda_and_package(
            "train.liger_kernel", cuda, "liger-kernel's Triton kernels need a CUDA GPU and this machine has none",
            "set train.liger_kernel = false", "liger_kernel",
            "train.liger_kernel needs the liger-kernel package, which is not installed",
            "pip install liger-kernel, or set train.liger_kernel = false")
    if recipe.train.torch_compile and not cuda and not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        out.append(Finding("error", "train.torch_compile", "torch.compile on CPU builds C++ kernels and "
                           "no C compiler (cc, gcc, clang) is on PATH", "install gcc, or set "
                           "train.torch_compile = false"))
    return out
