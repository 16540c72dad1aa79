"""core.prelaunch.dry_step without a child: what a verdict becomes at preflight, what keys its cache,
and when the step is off or does not apply."""

from tuiapp.core.config.recipe import Recipe
from tuiapp.core.prelaunch import dry_step


def _recipe(kind="lora", **train):
    return Recipe.model_validate({"model": {"name": "tiny"}, "method": {"kind": kind}, "train": train})


def test_a_failed_step_is_an_error_with_the_trainers_message_the_architecture_and_the_method():
    answer = {"ok": False, "error": "ValueError: lora.ParamWrapper does not work with lora_dropout != 0."}
    (finding,) = dry_step.findings_of(answer, _recipe(), "DeepseekV3ForCausalLM (deepseek_v3)")
    assert finding.level == "error" and finding.key == "method.kind" and finding.fix
    assert finding.message.startswith("lora on DeepseekV3ForCausalLM (deepseek_v3) failed its dry step")
    assert finding.message.endswith(answer["error"])
    assert "dropout = 0" in finding.fix  # a failure seen before gets its fix
    (unknown,) = dry_step.findings_of({"ok": False, "error": "KeyError: 'x'"}, _recipe(), "m")
    assert "report it with this message" in unknown.fix


def test_a_recipe_error_keeps_its_own_key_and_fix():
    answer = {"ok": False, "error": "bad targets", "key": "method.target_modules", "fix": "use 'all-linear'"}
    (finding,) = dry_step.findings_of(answer, _recipe(), "m")
    assert (finding.key, finding.fix) == ("method.target_modules", "use 'all-linear'")


def test_a_pass_says_nothing_a_skip_is_a_note_and_no_verdict_a_warning():
    assert dry_step.findings_of({"ok": True}, _recipe(), "m") == []
    assert dry_step.findings_of(None, _recipe(), "m") == []
    assert dry_step.findings_of({"skipped": "grpo generates"}, _recipe(), "m")[0].level == "info"
    late = dry_step.findings_of({"error": "the dry step took over 300s", "transient": True}, _recipe(), "m")
    assert late[0].level == "warning" and "LLMTUI_DRY_TIMEOUT_S" in late[0].fix


def test_the_cache_key_follows_the_config_the_method_and_what_the_step_reads(monkeypatch):
    base = dry_step.cache_key(_recipe(), b"{}")
    assert dry_step.cache_key(_recipe(), b"{}") == base
    assert dry_step.cache_key(_recipe(), b'{"a": 1}') != base  # another config
    assert dry_step.cache_key(_recipe("dora"), b"{}") != base  # another method section
    assert dry_step.cache_key(_recipe(packing=False), b"{}") != base  # packing changes the step
    assert dry_step.cache_key(_recipe(max_steps=7), b"{}") == base  # the step runs one step anyway
    monkeypatch.setenv(dry_step.PLUGINS_ENV, "tests.plugins.broken_backward")
    assert dry_step.cache_key(_recipe(), b"{}") != base  # a patched trainer is another trainer


def test_off_by_env_and_not_for_a_model_that_is_not_here(monkeypatch, tmp_path):
    monkeypatch.setenv("LLMTUI_DRY_STEP", "0")
    assert not dry_step.enabled() and dry_step.dry_findings(_recipe(), tmp_path) == []
    monkeypatch.setenv("LLMTUI_DRY_STEP", "1")
    missing = Recipe.model_validate({"model": {"name": str(tmp_path / "nothing")}, "method": {"kind": "lora"}})
    before = dry_step.CHILD_RUNS["count"]
    assert dry_step.dry_findings(missing, tmp_path) == []  # the model check reports it; no child
    assert dry_step.CHILD_RUNS["count"] == before
