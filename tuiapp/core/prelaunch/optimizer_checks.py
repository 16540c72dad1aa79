"""train.optimizer before launch: each kind refused where it cannot run, with the reason and the fix."""

from __future__ import annotations

import importlib.util

from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import is_full
from tuiapp.core.config.optimizer import TRAITS
from tuiapp.core.config.recipe import Recipe, weights_method

KEY = "train.optimizer"


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def rules(recipe: Recipe, *, cuda: bool, is_installed=installed) -> list[Finding]:
    spec, launch = recipe.train.optimizer, recipe.launch
    kind, traits = spec.kind, TRAITS[spec.kind]
    strategy = getattr(launch, "strategy", "deepspeed")
    out: list[Finding] = []

    def refuse(message: str, fix: str) -> None:
        out.append(Finding("error", KEY, message, fix))

    if kind == "adamw":
        return out
    if strategy == "pipeline":
        refuse(f"strategy 'pipeline' steps its stages with AdamW only, not {kind}",
               "set train.optimizer = 'adamw', or launch.strategy = 'deepspeed' (or 'ddp')")
        return out
    if traits.get("cuda") and not cuda:
        refuse(f"{kind} needs a CUDA GPU ({traits['package'][0]} "
               "runs its states there) and this machine has none",
               "on CPU use train.optimizer = 'adafactor' (factored states) or 'lion' (4 bytes a parameter) for "
               "less memory than AdamW, or run on a CUDA machine")
    package = traits.get("package")
    if package and not is_installed(package[0]):
        refuse(f"{kind} needs the {package[0]} package, which is not installed", f"pip install '{package[1]}'")
    if traits.get("projected"):
        if strategy in ("deepspeed", "fsdp"):
            refuse(f"{kind} projects whole weight matrices, and {strategy} hands the optimizer flat or sharded "
                   "pieces of them", f"set launch.strategy = 'ddp' for {kind}, or another train.optimizer")
        if not is_full(weights_method(recipe.method).kind):
            refuse(f"{kind} projects the full weights' gradients: it does not apply to adapters",
                   "train every weight (method.kind 'sft', no [method.adapter]) or use another optimizer")
    if kind == "muon":
        if strategy == "fsdp":
            refuse("muon orthogonalizes whole weight matrices, and FSDP shards each one across the ranks",
                   "set launch.strategy = 'deepspeed' (DeepSpeed's ZeRO Muon) or 'ddp'")
        if strategy == "deepspeed" and launch.offload_optimizer != "none":
            refuse("DeepSpeed's ZeRO Muon is not run with optimizer offload here (its momentum stays with the "
                   "partitions it orthogonalizes)", "set launch.offload_optimizer = 'none', or use 'adamw'")
    if kind == "schedule_free_adamw":
        if strategy == "deepspeed" and launch.zero_stage >= 1:
            refuse("schedule_free_adamw switches between train and eval weights, which DeepSpeed's ZeRO "
                   "optimizer wrapper does not pass on", "set launch.zero_stage = 0 or launch.strategy = 'ddp'")
        if recipe.train.scheduler != "constant":
            out.append(Finding("warning", "train.scheduler", "schedule_free_adamw needs no decaying schedule "
                               f"(it averages its iterates); '{recipe.train.scheduler}' still decays the rate",
                               "set train.scheduler = 'constant' (warmup_ratio still warms up)"))
    return out
