"""The DeepSpeed config generated from a recipe ('auto' values are filled by the Trainer)."""

from __future__ import annotations

from tuiapp.core.config.recipe import Recipe


def deepspeed_config(recipe: Recipe) -> dict:
    launch = recipe.launch
    zero: dict = {"stage": launch.zero_stage}
    if launch.zero_stage >= 2:
        zero.update(overlap_comm=False, contiguous_gradients=True, reduce_bucket_size="auto")
    if launch.zero_stage == 3:
        zero.update(
            stage3_gather_16bit_weights_on_model_save=True,
            stage3_prefetch_bucket_size="auto",
            stage3_param_persistence_threshold="auto",
        )
    if launch.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(launch.offload_optimizer, launch.nvme_path)
    if launch.offload_params != "none":
        zero["offload_param"] = _offload(launch.offload_params, launch.nvme_path)
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _offload(device: str, nvme_path: str) -> dict:
    if device == "nvme":
        return {"device": "nvme", "nvme_path": nvme_path, "pin_memory": True}
    return {"device": "cpu", "pin_memory": True}
