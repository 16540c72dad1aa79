"""method 'distill' before launch: a teacher with another tokenizer, or none at all, is refused
naming method.teacher; the recipe rules it cannot train under; the teacher in the memory estimate."""

import json
from pathlib import Path

from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.plan import distill as plan_distill
from tuiapp.core.plan import estimate
from tuiapp.core.prelaunch import distill_checks, door
from tuiapp.core.store.runs import RunStore

VOCAB = {f"tok{i}": i for i in range(100)}


def _folder(root: Path, name: str, vocab: dict[str, int], size: int) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**estimate.TINY_CONFIG, "vocab_size": size}))
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}, "added_tokens": [
        {"id": len(vocab), "content": "<|pad|>"}]}))
    return folder


def _recipe(teacher: str, extra: str = "") -> object:
    return parse_recipe(f'[method]\nkind = "distill"\nteacher = "{teacher}"\n{extra}', "r.toml")


def test_another_tokenizer_is_refused_naming_the_key(tmp_path):
    student = _folder(tmp_path, "student", VOCAB, 128)
    swapped = dict(VOCAB, tok0=1, tok1=0)
    other = _folder(tmp_path, "other", swapped, 128)
    same = _folder(tmp_path, "same", VOCAB, 128)
    wider = _folder(tmp_path, "wider", VOCAB, 256)
    found = distill_checks.vocabulary_findings(str(student), str(other), None, tmp_path)
    assert [f.key for f in found] == ["method.teacher"] and found[0].level == "error"
    assert "'tok0'" in found[0].message and "same tokenizer" in found[0].fix
    found = distill_checks.vocabulary_findings(str(student), str(wider), None, tmp_path)
    assert found[0].key == "method.teacher" and "256" in found[0].message and "128" in found[0].message
    assert distill_checks.vocabulary_findings(str(student), str(same), None, tmp_path) == []
    assert distill_checks.vocabulary_findings("tiny", "tiny-teacher", None, tmp_path) == []


def test_a_missing_teacher_and_packing_are_refused_before_launch(tmp_path):
    recipe = _recipe("no/such/teacher", "[train]\npacking = true")
    findings = door.recipe_findings(recipe, RunStore(tmp_path / "runs"), base_dir=tmp_path)
    errors = {f.key: f for f in findings if f.level == "error"}
    assert "no such folder" in errors["method.teacher"].message and "method.teacher" in errors["method.teacher"].fix
    assert "train.packing" in errors
    ok = door.recipe_findings(_recipe("tiny-teacher"), RunStore(tmp_path / "runs"), base_dir=tmp_path)
    assert not [f for f in ok if f.key == "method.teacher"]


def test_the_estimate_counts_the_teachers_weights():
    config = dict(estimate.TINY_CONFIG)
    sft = estimate.estimate_recipe(parse_recipe('[method]\nkind = "sft"', "r.toml"), config, 1, cuda=False)
    distill = estimate.estimate_recipe(_recipe("tiny-teacher"), config, 1, cuda=False)
    teacher = estimate.count_parameters(estimate.teacher_config("tiny-teacher")) * 4  # fp32 on the CPU
    assert teacher > estimate.count_parameters(config) * 4
    # offline (the default): the teacher is loaded alone for its top-k pass and freed before the student loads
    assert distill.memory.reference == sft.memory.reference and distill.memory.teacher_pass == teacher
    assert distill.memory.total == max(distill.memory.training, teacher)
    assert "teacher" in estimate.format_estimate(distill) and distill.to_json()["memory"]["teacher_pass"] == teacher
    # online: beside the student at every step
    online = estimate.estimate_recipe(_recipe("tiny-teacher", 'mode = "online"'), config, 1, cuda=False)
    assert online.memory.reference - sft.memory.reference == teacher and online.memory.teacher_pass == 0
    assert online.memory.total == online.memory.training > distill.memory.training


def test_an_offline_teacher_larger_than_the_training_is_the_peak():
    tiny = dict(estimate.TINY_CONFIG, num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                num_attention_heads=2, num_key_value_heads=2)  # a student far smaller than its teacher
    extra = '[method.adapter]\nkind = "lora"\n[train]\nmax_seq_len = 16\nmicro_batch = 1'
    lora = estimate.estimate_recipe(_recipe("tiny-teacher", extra), tiny, 1, cuda=False)
    assert lora.memory.teacher_pass > lora.memory.training
    assert lora.memory.total == lora.memory.teacher_pass
    assert "(the teacher's pass)" in estimate.format_estimate(lora)


def test_a_teacher_from_an_earlier_run_is_resolved_and_checked(tmp_path):
    """method.teacher = 'run:NAME': the final model of the latest succeeded run named NAME, as model.name's;
    none yet is an error naming method.teacher; the resolved folder goes through the teacher's checks."""
    import pytest

    from tuiapp.core.common.errors import UserError
    from tuiapp.core.config.recipe import recipe_from_dict

    store = RunStore(tmp_path / "runs")
    student = _folder(tmp_path, "student", VOCAB, 128)
    recipe = parse_recipe(f'[model]\nname = "{student}"\n[method]\nkind = "distill"\nteacher = "run:big"', "r.toml")
    with pytest.raises(UserError) as info:
        door.resolve_recipe(recipe, store)
    assert info.value.key == "method.teacher" and "'big'" in info.value.message
    [finding] = [f for f in door.recipe_findings(recipe, store, tmp_path) if f.level == "error"]
    assert finding.key == "method.teacher" and "train that run first" in finding.fix
    earlier = store.create(recipe_from_dict({"name": "big", "method": {"kind": "sft"}}))
    final = _folder(earlier.final_path.parent, earlier.final_path.name, dict(VOCAB, tok0=1, tok1=0), 128)
    import numpy as np
    from safetensors.numpy import save

    (final / "model.safetensors").write_bytes(save({"lm_head.weight": np.zeros((4, 4), dtype=np.float32)}))
    earlier.update(status="succeeded")
    resolved, ref = door.resolve_recipe(recipe, store)
    assert resolved.method.teacher == str(final.resolve()) and recipe.method.teacher == "run:big"
    errors = [f for f in door.recipe_findings(recipe, store, tmp_path) if f.key == "method.teacher"]
    assert errors and "'tok0'" in errors[0].message  # its tokenizer differs from the student's


def test_the_bundled_student_is_smaller_than_the_tiny_model_with_its_tokenizer():
    student, tiny = estimate.load_model_config("tiny-student"), estimate.load_model_config("tiny")
    assert student["num_hidden_layers"] < tiny["num_hidden_layers"] and student["hidden_size"] < tiny["hidden_size"]
    assert student["vocab_size"] == tiny["vocab_size"]
    assert estimate.count_parameters(student) < estimate.count_parameters(tiny) / 3
    assert distill_checks.vocabulary_findings("tiny-student", "tiny-teacher", None) == []


def test_the_chain_preset_names_its_missing_teacher_run(tmp_path):
    from tuiapp.core.config.recipe import load_recipe

    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / "tiny-distill.toml")
    assert recipe.model.name == "tiny-student" and recipe.method.teacher == "run:tiny-distill-teacher"
    found = door.recipe_findings(recipe, RunStore(tmp_path / "runs"), base_dir=tmp_path)
    errors = [f for f in found if f.level == "error"]
    assert [f.key for f in errors] == ["method.teacher"], door.format_findings(found)
    assert "tiny-distill-teacher" in errors[0].message and "train that run first" in errors[0].fix


def test_the_teacher_cache_size_and_the_disk_it_needs():
    offline = _recipe("tiny-teacher", 'top_k = 64\n[dataset]\nname = "demo:facts"\nmax_samples = 200\n'
                      '[train]\nmax_seq_len = 32')
    size = plan_distill.teacher_cache_size(offline)
    assert size["examples"] == 200 and 200 <= size["tokens"] <= 200 * 32  # each example cut at max_seq_len
    assert size["bytes"] == plan_distill.topk_cache_bytes(size["tokens"], 200, 64) == size["tokens"] * 64 * 8 + 201 * 8
    online = _recipe("tiny-teacher", 'mode = "online"\n[dataset]\nname = "demo:facts"')
    assert plan_distill.teacher_cache_size(online) is None
    assert distill_checks.cache_disk_findings(offline, free_bytes=10 ** 12) == []
    full = distill_checks.cache_disk_findings(offline, free_bytes=1000)
    assert [f.key for f in full] == ["method.top_k"] and full[0].level == "error" and "top_k 64" in full[0].message
    assert "smaller method.top_k" in full[0].fix
    assert plan_distill.teacher_cache_text(size).startswith("disk         teacher cache ")


def test_a_served_teacher_that_does_not_answer_or_runs_online_is_refused_before_launch(tmp_path):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    (finding,) = [f for f in distill_checks.findings(_recipe(url), tmp_path) if f.level == "error"]
    assert finding.key == "method.teacher" and f"{url}/v1 did not answer" in finding.message
    assert "llmtui serve RUN --port P" in finding.fix
    (online,) = [f for f in distill_checks.findings(_recipe(url, 'mode = "online"'), tmp_path) if f.level == "error"]
    assert online.key == "method.mode" and "set method.mode = 'offline'" in online.fix
    assert plan_distill.served_teacher(url) and not plan_distill.served_teacher("run:teacher")
    assert estimate.teacher_parameters(url) == 0  # its own server holds it
