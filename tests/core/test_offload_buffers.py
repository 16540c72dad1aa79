"""The GPU buffers of ZeRO-Offload (DeepSpeed 0.19.8) in the memory estimate: the reduction bucket,
and under ZeRO-1/2 the largest parameter's staging buffer and gradient (core/plan/estimate.py)."""

from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.plan.estimate import PRESET_CONFIGS, estimate_recipe, model_state_bytes, offload_gpu_buffers

P, LARGEST, BUCKET = 1_000_000_000, 131_000_000, 4_194_304


def _states(stage, offload="cpu", **kw):
    return model_state_bytes(P, P, stage, 1, offload, "none", "bf16", largest_layer_params=LARGEST,
                             deepspeed_buffers=True, reduce_bucket=BUCKET, **kw)


def test_offload_buffers_follow_deepspeeds_allocations():
    assert offload_gpu_buffers(2, BUCKET, LARGEST, half=True) == BUCKET * 2 + 2 * LARGEST * 2
    assert offload_gpu_buffers(1, BUCKET, LARGEST, half=True) == BUCKET * 4 + 2 * LARGEST * 2  # fp32 bucket
    assert offload_gpu_buffers(3, BUCKET, LARGEST, half=True) == BUCKET * 2  # grad partitions: pinned CPU
    assert offload_gpu_buffers(2, BUCKET, LARGEST, half=False) == BUCKET * 4 + 2 * LARGEST * 4


def test_zero_offload_adds_them_to_the_gpu_and_nothing_else_changes():
    for stage in (1, 2, 3):
        gathered = 4 * LARGEST if stage == 3 else 0  # ZeRO-3's gathered layer, as without offload
        assert _states(stage).buffers == gathered + offload_gpu_buffers(stage, BUCKET, LARGEST, True)
        assert _states(stage).cpu_offload_total == model_state_bytes(P, P, stage, 1, "cpu", "none", "bf16")\
            .cpu_offload_total
    assert _states(2, offload="none").buffers == model_state_bytes(
        P, P, 2, 1, "none", "none", "bf16", largest_layer_params=LARGEST, deepspeed_buffers=True).buffers
    assert model_state_bytes(P, 0, 2, 1, "cpu", "none", "bf16", deepspeed_buffers=True,
                             reduce_bucket=BUCKET).buffers == 0  # nothing trains: no gradients to move


def test_the_recipe_estimate_counts_them_with_hidden_squared_buckets():
    config = PRESET_CONFIGS["meta-llama/Llama-3.2-1B"]
    recipe = lambda offload: recipe_from_dict({  # noqa: E731
        "model": {"name": "meta-llama/Llama-3.2-1B"}, "method": {"kind": "sft"},
        "launch": {"zero_stage": 2, "offload_optimizer": offload}})
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    with_offload = estimate_recipe(recipe("cpu"), config, 1).memory
    expected = offload_gpu_buffers(2, hidden * hidden, vocab * hidden, half=True)
    assert with_offload.buffers == expected  # the fp32 grad partition went to the CPU
    assert estimate_recipe(recipe("none"), config, 1).memory.buffers > 0
