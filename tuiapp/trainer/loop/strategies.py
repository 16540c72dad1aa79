"""The distributed strategy of a run: DeepSpeed (default), PyTorch FSDP or plain DDP.

Each strategy contributes its own TrainingArguments pieces and its own process-group start;
`tuiapp.trainer.run` stays the same for all three. DeepSpeed ranks are started by DeepSpeed's
launcher; FSDP and DDP ranks by torchrun (`python -m torch.distributed.run`).

On CPU:
- deepspeed: accelerate would not start DeepSpeed's process group without CUDA, so a
  `PartialState(backend="gloo")` is created first with ACCELERATE_USE_DEEPSPEED set, and the
  Trainer reuses it (`use_configured_state`). One rank at ZeRO-0 (`engine_free`) trains without
  DeepSpeed's engine: it would shard and reduce nothing, and its per-step wrapper costs time.
- ddp: `use_cpu=True` + `ddp_backend="gloo"`: accelerate's MULTI_CPU type, which is DDP.
- fsdp: accelerate 1.15 only turns an FSDP plugin on for GPU-like distributed types; on CPU it
  quietly falls back to DDP. `enable_cpu_fsdp` switches the (shared) accelerator state to FSDP
  after the Trainer built its Accelerator, so the model really is sharded with FSDP2
  (`fully_shard` over a CPU device mesh, gloo collectives).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tuiapp.core.config.recipe import Recipe
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.trainer.loop.ds_config import deepspeed_config


def strategy_of(recipe: Recipe) -> str:
    return getattr(recipe.launch, "strategy", "deepspeed")


def engine_free(recipe: Recipe, run_dir: Path | None = None) -> bool:
    """A DeepSpeed run that trains through the Trainer's own loop: one CPU rank at ZeRO-0, where
    the engine has nothing to shard or reduce (the same math: fp32, the same AdamW, clipping and
    schedule). On a GPU DeepSpeed stays: its bf16/fp16 paths are what the memory estimate counts.
    A run whose checkpoints DeepSpeed wrote keeps it, so they resume as they were saved."""
    if strategy_of(recipe) != "deepspeed" or recipe.launch.zero_stage != 0 or torch.cuda.is_available():
        return False
    if int(os.environ.get("WORLD_SIZE", "1")) != 1:
        return False
    return run_dir is None or not any(RunDir(run_dir).checkpoints.glob("checkpoint-*/global_step*"))


def fsdp_config(recipe: Recipe, cuda: bool = True) -> dict:
    """The Trainer's `fsdp_config` (FSDP2, full state dict so the final model is plain HF).
    CPU offload needs an accelerator to offload from: on CPU it is left out (preflight warns)."""
    config = {
        "version": 2,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "state_dict_type": "FULL_STATE_DICT",
        "reshard_after_forward": True,
        "cpu_ram_efficient_loading": False,
    }
    if getattr(recipe.launch, "fsdp_cpu_offload", False) and cuda:
        config["cpu_offload"] = True
    return config


def training_kwargs(recipe: Recipe, cuda: bool | None = None, run_dir: Path | None = None) -> dict:
    """TrainingArguments keywords that depend on the strategy."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    strategy = strategy_of(recipe)
    if not cuda and engine_free(recipe, run_dir):
        return {"use_cpu": True}
    if strategy == "deepspeed":
        extra: dict = {"deepspeed": deepspeed_config(recipe)}
        if not cuda:
            extra["accelerator_config"] = {"use_configured_state": True}
        return extra
    extra = {"ddp_backend": "nccl" if cuda else "gloo", "use_cpu": not cuda}
    if strategy == "ddp":
        extra["ddp_find_unused_parameters"] = False
        return extra
    extra["fsdp"] = True
    extra["fsdp_config"] = fsdp_config(recipe, cuda)
    return extra


def joined_early(recipe: Recipe, run_dir: Path | None = None) -> bool:
    """DeepSpeed on CPU starts its process group before TrainingArguments (prepare_distributed)."""
    return strategy_of(recipe) == "deepspeed" and not torch.cuda.is_available() \
        and int(os.environ.get("WORLD_SIZE", "1")) >= 1 and not engine_free(recipe, run_dir)


def prepare_distributed(recipe: Recipe, run_dir: Path | None = None) -> None:
    """Start what must exist before TrainingArguments (only DeepSpeed on CPU needs it)."""
    if not joined_early(recipe, run_dir):
        return
    import accelerate

    from tuiapp.trainer import phases

    phases.enter("building ops")  # DeepSpeed's CPU comm op: JIT-compiled on a machine's first run
    from deepspeed.comm.torch import build_shm_op

    build_shm_op()  # cached afterwards; the process group below then only loads it
    phases.enter("joining ranks")
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    accelerate.PartialState(backend="gloo")


class StrategyMixin:
    """Mixed into the run's Trainer: after the Accelerator exists, turn FSDP on for CPU."""

    def create_accelerator_and_postprocess(self) -> None:
        super().create_accelerator_and_postprocess()
        enable_cpu_fsdp(self)


def enable_cpu_fsdp(trainer) -> bool:
    """Make accelerate use the FSDP plugin on a CPU process group (see the module docstring).

    Called right after the Trainer is built and before `train()`. Returns True when it changed
    the state. A no-op with CUDA, for other strategies, or when accelerate already chose FSDP.
    """
    from accelerate.utils import DistributedType

    args = trainer.args
    if not getattr(args, "fsdp", None) or torch.cuda.is_available():
        return False
    accelerator = trainer.accelerator
    state = accelerator.state
    if state.distributed_type == DistributedType.FSDP:
        return False
    if state.distributed_type != DistributedType.MULTI_CPU:
        return False
    from accelerate.state import PartialState
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    # AcceleratorState copies PartialState's fields each time it is built: change both
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    state.distributed_type = DistributedType.FSDP
    state.fsdp_plugin = plugin
    trainer.is_fsdp_enabled = True
    return True
