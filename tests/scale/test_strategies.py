"""The trainer's strategy pieces of TrainingArguments (no process group needed)."""

from __future__ import annotations

from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.trainer.loop import strategies


def test_deepspeed_pieces():
    kwargs = strategies.training_kwargs(recipe_from_dict({"method": {"kind": "lora"}, "launch": {"zero_stage": 2}}), cuda=False)
    assert kwargs["deepspeed"]["zero_optimization"]["stage"] == 2
    assert kwargs["accelerator_config"] == {"use_configured_state": True}
    assert "accelerator_config" not in strategies.training_kwargs(recipe_from_dict({"method": {"kind": "lora"}}), cuda=True)


def test_ddp_pieces():
    recipe = recipe_from_dict({"method": {"kind": "lora"}, "launch": {"strategy": "ddp"}})
    assert strategies.training_kwargs(recipe, cuda=False) == {
        "ddp_backend": "gloo", "use_cpu": True, "ddp_find_unused_parameters": False}
    assert strategies.training_kwargs(recipe, cuda=True)["ddp_backend"] == "nccl"


def test_fsdp_pieces():
    recipe = recipe_from_dict({"method": {"kind": "lora"}, "launch": {"strategy": "fsdp", "fsdp_cpu_offload": True}})
    kwargs = strategies.training_kwargs(recipe, cuda=False)
    assert kwargs["fsdp"] is True and "deepspeed" not in kwargs
    assert kwargs["fsdp_config"]["version"] == 2 and "cpu_offload" not in kwargs["fsdp_config"]  # needs CUDA
    assert kwargs["fsdp_config"]["state_dict_type"] == "FULL_STATE_DICT"
    assert (kwargs["use_cpu"], kwargs["ddp_backend"]) == (True, "gloo")
    on_gpu = strategies.training_kwargs(recipe, cuda=True)
    assert on_gpu["fsdp_config"]["cpu_offload"] is True and (on_gpu["use_cpu"], on_gpu["ddp_backend"]) == (False, "nccl")


def test_one_cpu_rank_at_zero0_trains_without_deepspeeds_engine(tmp_path, monkeypatch):
    zero0 = recipe_from_dict({"method": {"kind": "lora"}})
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert strategies.training_kwargs(zero0, cuda=False, run_dir=tmp_path) == {"use_cpu": True}
    assert not strategies.joined_early(zero0, tmp_path)  # no process group to start either
    assert "deepspeed" in strategies.training_kwargs(zero0, cuda=True)  # a GPU keeps DeepSpeed's precision paths
    zero1 = recipe_from_dict({"method": {"kind": "lora"}, "launch": {"zero_stage": 1}})
    assert "deepspeed" in strategies.training_kwargs(zero1, cuda=False)
    # a run whose checkpoints DeepSpeed wrote (before this, or resumed from one) goes on with DeepSpeed
    (tmp_path / "checkpoints" / "checkpoint-4" / "global_step4").mkdir(parents=True)
    assert "deepspeed" in strategies.training_kwargs(zero0, cuda=False, run_dir=tmp_path)
    assert strategies.joined_early(zero0, tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert "deepspeed" in strategies.training_kwargs(zero0, cuda=False)
