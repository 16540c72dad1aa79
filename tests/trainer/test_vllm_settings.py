"""What a grpo/rloo rank hands TRL about vLLM: a colocated engine's share, or the URL and the
weight-sync port of the run's server, which only the supervisor knows (its environment)."""

from __future__ import annotations

import pytest

from tests.core.test_generation_server import server_recipe
from tuiapp.core.plan import generation_server
from tuiapp.trainer.methods.rl import generation_event, trainer_config, vllm_settings


def test_a_rank_reaches_the_runs_server_by_its_environment():
    recipe = server_recipe(method="vllm_server_timeout_s = 300")
    env = generation_server.rank_env("http://127.0.0.1:8123", 51300)
    assert vllm_settings(recipe.method, env) == {"vllm_mode": "server", "vllm_server_base_url": "http://127.0.0.1:8123",
                                                 "vllm_group_port": 51300, "vllm_server_timeout": 300.0}
    with pytest.raises(RuntimeError, match="started no generation server"):
        vllm_settings(recipe.method, {})
    colocated = recipe.method.model_copy(update={"vllm_mode": "colocate"})
    assert vllm_settings(colocated, {}) == {"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3}


def test_trls_config_takes_the_server_settings(monkeypatch, tmp_path):
    recipe = server_recipe()
    for key, value in generation_server.rank_env("http://127.0.0.1:8123", 51300).items():
        monkeypatch.setenv(key, value)
    config = trainer_config(recipe, {"output_dir": str(tmp_path), "per_device_train_batch_size": 8,
                                     "use_cpu": True, "report_to": []})
    assert config.use_vllm and config.vllm_mode == "server" and config.generation_kwargs is None
    stopping = trainer_config(recipe, {"output_dir": str(tmp_path), "per_device_train_batch_size": 8,
                                       "use_cpu": True, "report_to": []}, stop_ids=[3])
    assert stopping.generation_kwargs == {"stop_token_ids": [3]}  # vLLM stops at the turn end (SamplingParams)
    assert config.vllm_server_base_url == "http://127.0.0.1:8123" and config.vllm_group_port == 51300
    event = generation_event(recipe)
    assert event["vllm_mode"] == "server" and event["vllm_server"] == "http://127.0.0.1:8123"
    assert event["vllm_server_gpus"] == 1 and "vllm_gpu_memory_utilization" not in event
