"""The one door for pre-launch checks (tuiapp.core.prelaunch.door): every rule of both phases is
called through it, each phase's rules fire, and the launch service, the CLI's check commands and
the form import no other check module."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.prelaunch import door
from tuiapp.core.store.runs import RunStore

ROOT = Path(__file__).resolve().parents[2]
# the service, and the CLI commands and form action that check a recipe before a launch
CALLERS = ["tuiapp/core/lifecycle/service.py", "tuiapp/cli/run.py", "tuiapp/cli/recipe.py", "tuiapp/cli/probe.py",
           "tuiapp/ui/actions.py"]


def bad_on_both_phases():
    """qlora with ZeRO-3 (a recipe rule) and bf16 (a machine rule, on a machine without CUDA)."""
    return recipe_from_dict({"method": {"kind": "qlora"}, "launch": {"zero_stage": 3},
                             "train": {"precision": "bf16"}})


def test_every_rule_of_both_lists_is_called_by_the_door(tmp_path, monkeypatch):
    called = []

    def recording(rule):
        def wrapper(ctx):
            called.append(rule)
            return rule(ctx)
        return wrapper

    declared = {name: list(getattr(door, name)) for name in ("RECIPE_RULES", "MACHINE_RULES")}
    for name in declared:
        monkeypatch.setattr(door, name, [recording(rule) for rule in getattr(door, name)])
    store = RunStore(tmp_path / "runs")
    door.all_findings(bad_on_both_phases(), store, tmp_path, gpus=[], cuda=False, free_bytes=10**12)
    assert called == declared["RECIPE_RULES"] + declared["MACHINE_RULES"]  # each once, in the declared order
    called.clear()
    door.recipe_findings(bad_on_both_phases(), store, tmp_path)
    assert called == declared["RECIPE_RULES"]


def test_each_rule_takes_the_context_alone_and_has_its_own_name():
    rules = door.RECIPE_RULES + door.MACHINE_RULES
    assert len({rule.__name__ for rule in rules}) == len(rules)
    for rule in rules:
        assert list(inspect.signature(rule, follow_wrapped=False).parameters) == ["ctx"], rule.__name__


def test_one_rule_of_each_phase_fires(tmp_path):
    store = RunStore(tmp_path / "runs")
    recipe_phase = door.recipe_findings(bad_on_both_phases(), store, tmp_path)
    assert [f.key for f in recipe_phase if f.level == "error"] == ["launch.zero_stage"]
    machine = door.machine_findings(bad_on_both_phases(), store, tmp_path, gpus=[], cuda=False, free_bytes=10**12)
    assert "train.precision" in {f.key for f in machine if f.level == "error"}
    assert "launch.zero_stage" not in {f.key for f in machine}  # the recipe's rules are the other phase's
    assert any(f.message.startswith("memory: about") for f in machine)  # the model-config rules ran
    both = door.all_findings(bad_on_both_phases(), store, tmp_path, gpus=[], cuda=False, free_bytes=10**12)
    errors = [f.key for f in both if f.level == "error"]
    assert errors[0] == "launch.zero_stage" and "train.precision" in errors  # the recipe's first
    assert door.format_findings(both).splitlines()[-1].startswith("preflight: ")


def test_a_good_recipe_passes_both_phases(tmp_path):
    findings = door.all_findings(recipe_from_dict({"method": {"kind": "lora"}}), RunStore(tmp_path / "runs"),
                                 tmp_path, gpus=[], cuda=False, free_bytes=10**12)
    assert not door.has_errors(findings), door.format_findings(findings)
    assert door.format_findings(findings).splitlines()[-1] == "preflight: ok"


def test_a_config_the_estimate_cannot_read_is_said_once(tmp_path):
    odd = door.machine_findings(recipe_from_dict({"method": {"kind": "lora"}}), RunStore(tmp_path / "runs"),
                                tmp_path, model_config={"model_type": "t5"}, gpus=[], cuda=False, free_bytes=1)
    assert [f.level for f in odd if "cannot estimate" in f.message] == ["warning"]
    assert not [f for f in odd if f.key == "train.save_total_limit"]  # disk: after the memory rule gave up


def prelaunch_imports(path: str) -> set[str]:
    """The tuiapp.core.prelaunch modules a file imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse((ROOT / path).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tuiapp.core.prelaunch"):
            if node.module == "tuiapp.core.prelaunch":
                found |= {alias.name for alias in node.names}
            else:
                found.add(node.module.rsplit(".", 1)[-1])
        elif isinstance(node, ast.Import):
            found |= {a.name.rsplit(".", 1)[-1] for a in node.names if a.name.startswith("tuiapp.core.prelaunch.")}
    return found


@pytest.mark.parametrize("path", CALLERS)
def test_the_service_and_the_check_commands_import_only_the_door(path):
    assert prelaunch_imports(path) == {"door"}
