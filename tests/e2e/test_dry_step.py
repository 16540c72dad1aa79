"""The dry step before launch (core.prelaunch.dry_step + trainer.dry): one real step on a shrunken copy of
the model catches what the rules do not, its verdict is cached, and the families found beyond the zoo are
decided before launch."""

import json

import pytest

from tests.e2e.helpers import llmtui
from tests.zoo_matrix import METHODS, verdicts, zoo_recipe
from tuiapp.core.prelaunch import door, dry_step
from tuiapp.core.store.runs import RunStore

MESSAGE = "lora's backward is broken on purpose (tests.plugins.broken_backward)"  # the plugin's own

pytestmark = [pytest.mark.slow, pytest.mark.extended]  # `make test-extended`: over the full tier's budget for now


@pytest.fixture
def dry_on(monkeypatch):
    monkeypatch.setenv("LLMTUI_DRY_STEP", "1")


def _recipe(tmp_path, method="lora"):
    path = tmp_path / ".recipes" / "r.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'name = "dry"\n[model]\nname = "tiny"\n[dataset]\nname = "demo:facts"\nmax_samples = 16\n'
                    f'[method]\nkind = "{method}"\n[train]\nmax_steps = 2\nmicro_batch = 2\nmax_seq_len = 64\n')
    return path


def test_a_method_broken_in_its_first_backward_is_caught_before_launch(tmp_path, runs_dir, dry_on, monkeypatch):
    monkeypatch.setenv(dry_step.PLUGINS_ENV, "tests.plugins.broken_backward")
    result = llmtui("run", str(_recipe(tmp_path, "lora")), runs_dir=runs_dir, timeout=600)
    assert result.returncode == 2, result.stdout + result.stderr
    assert MESSAGE in result.stderr and "failed its dry step" in result.stderr, result.stderr
    assert "lora on" in result.stderr and "Traceback" not in result.stderr
    assert not runs_dir.exists() or not [p for p in runs_dir.iterdir() if not p.name.startswith(".")]
    # `llmtui model --dry` runs the same step: lora refused with the trainer's message, ia3 passes
    report = llmtui("model", "tiny", "--dry", "lora", "ia3", "--json", runs_dir=runs_dir, timeout=600)
    assert report.returncode == 0, report.stderr
    methods = json.loads(report.stdout)["methods"]
    assert methods["lora"]["verdict"] == "refused" and methods["lora"]["dry"] == "failed"
    assert MESSAGE in methods["lora"]["notes"][0]["message"]
    assert methods["ia3"]["verdict"] == "trains" and methods["ia3"]["dry"] == "passed"
    assert "dry" not in methods["sft"]  # not asked for


def test_the_verdict_is_cached_so_a_second_preflight_starts_no_child(tmp_path, dry_on, tiny_model):
    from tuiapp.core.config.recipe import parse_recipe

    path = _recipe(tmp_path, "sft")
    recipe = parse_recipe(path.read_text(), str(path))
    store = RunStore(tmp_path / "runs")
    before = dry_step.CHILD_RUNS["count"]
    first = door.all_findings(recipe, store, tmp_path)
    assert dry_step.CHILD_RUNS["count"] == before + 1
    assert not door.has_errors(first), first
    key = dry_step.cache_key(recipe, b"tiny")
    cached = json.loads(dry_step.cache_file(key).read_text())
    assert cached["ok"] is True and "error" not in cached
    second = door.all_findings(recipe, store, tmp_path)
    assert dry_step.CHILD_RUNS["count"] == before + 1  # the cache answered
    assert {f.message for f in second} == {f.message for f in first}
    assert dry_step.verdict(recipe, tmp_path)["cached"] is True
    other = parse_recipe(_recipe(tmp_path, "lora").read_text())  # another method section: another verdict
    assert dry_step.cache_key(other, b"tiny") != key


def test_the_families_beyond_the_zoo_are_decided_before_launch(tmp_path, tiny_model):
    """StableLM, DeepSeek-V3, Falcon and PhiMoE × every method: refused by the plan (with its fix) or
    one real step of the dry step passes; the four failures found after launch are gone."""
    from tuiapp.trainer.models.zoo import DRY_DECIDED, ensure_zoo_model

    rows = list(verdicts(sorted(DRY_DECIDED)))
    assert len(rows) == len(DRY_DECIDED) * len(METHODS)
    refused = {(r["arch"], r["method"]) for r in rows if r["verdict"] == "refused"}
    assert {("deepseek_v3", "prefix"), ("falcon", "prefix")} <= refused  # MLA and multi-query: refused, with a fix
    prefix = {r["arch"]: r["findings"][0] for r in rows if r["method"] == "prefix" and r["verdict"] == "refused"}
    assert "latent" in prefix["deepseek_v3"]["message"] and "multi-query" in prefix["falcon"]["message"]
    assert all(f["fix"] for f in prefix.values())
    accepted = [(r["arch"], r["method"]) for r in rows if r["verdict"] == "trains"]
    recipes = [zoo_recipe(str(ensure_zoo_model(arch)), method) for arch, method in accepted]
    answers = dry_step.run_child(recipes, tmp_path, timeout=900)
    failed = [(pair, a) for pair, a in zip(accepted, answers, strict=True) if not a.get("ok")]
    assert not failed, failed
    # the plan keeps LoRA off DeepSeek's fused experts (and the dense linears peft renames onto them)
    lora = next(r for r in rows if (r["arch"], r["method"]) == ("deepseek_v3", "lora"))
    assert any("peft would move those names" in f["message"] for f in lora["findings"]), lora
