"""Strategy x method x ZeRO x hosts rules in recipe_rules.recipe_rules, one by one."""

from __future__ import annotations

import pytest

from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.prelaunch.recipe_rules import recipe_rules


def errors(**sections) -> dict[str, str]:
    return {f.key: f.message for f in recipe_rules(recipe_from_dict({"method": {"kind": "lora"}, **sections})) if f.level == "error"}


def test_defaults_pass_and_strategy_defaults_to_deepspeed():
    recipe = recipe_from_dict({"method": {"kind": "lora"}})
    assert recipe.launch.strategy == "deepspeed" and recipe.launch.hosts == [] and recipe_rules(recipe) == []


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
@pytest.mark.parametrize("key, value", [("zero_stage", 2), ("offload_optimizer", "cpu"), ("offload_params", "cpu")])
def test_zero_keys_are_errors_outside_deepspeed(strategy, key, value):
    launch = {"strategy": strategy, key: value}
    if key != "zero_stage":
        launch["zero_stage"] = 3 if key == "offload_params" else 2
    found = errors(launch=launch)
    assert f"launch.{key}" in found and strategy in found[f"launch.{key}"]


def test_fsdp_cpu_offload_needs_fsdp():
    assert "launch.fsdp_cpu_offload" in errors(launch={"fsdp_cpu_offload": True})
    assert errors(launch={"fsdp_cpu_offload": True, "strategy": "fsdp"}) == {}


@pytest.mark.parametrize("kind", ["prefix", "prompt", "ptuning"])
def test_prompt_learning_is_refused_with_fsdp(kind):
    found = errors(method={"kind": kind}, launch={"strategy": "fsdp"})
    assert "FSDP" in found["launch.strategy"]
    assert errors(method={"kind": kind}, launch={"strategy": "ddp"}) == {}


@pytest.mark.parametrize("kind", ["lora", "dora", "ia3", "adapter", "llama-adapter", "sft", "pretrain"])
def test_methods_that_train_under_fsdp(kind):
    assert errors(method={"kind": kind}, launch={"strategy": "fsdp"}) == {}


def test_qlora_with_fsdp_is_refused():
    assert "launch.strategy" in errors(method={"kind": "qlora"}, launch={"strategy": "fsdp"})
    assert "launch.strategy" not in errors(method={"kind": "qlora"}, launch={"strategy": "ddp"})


def test_include_and_exclude_rules():
    hosts = ["a slots=2", "b slots=2"]
    assert "launch.exclude" in errors(launch={"hosts": hosts, "include": "a", "exclude": "b"})
    assert "launch.include" in errors(launch={"hosts": hosts, "include": "a", "nodes": 1})
    assert "launch.include" in errors(launch={"include": "a"})
    assert errors(launch={"hosts": hosts, "include": "a@b:1"}) == {}


def test_hosts_rules(tmp_path, monkeypatch):
    assert "launch.nodes" in errors(launch={"hosts": ["a slots=1"], "nodes": 2})
    assert "launch.hosts" in errors(launch={"hosts": ["a slots=1", "b slots=1"], "strategy": "ddp"})
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hosts.txt").write_text("a slots=2\nb\n")
    found = errors(launch={"hosts": "hosts.txt"})
    assert found["launch.hosts"].startswith("hosts.txt:2: bad hostfile line 'b'")
    assert "launch.hosts" in errors(launch={"hosts": "missing.txt"})
