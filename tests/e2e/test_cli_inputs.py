"""Bad recipes and bad datasets: a clear error, exit 2, nothing launched, nothing left behind.
Plus `llmtui data` and `--dry-run`."""

import json

import pytest

from tests.e2e.helpers import llmtui


def assert_clean_failure(result, runs_dir, *needles):
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert not runs_dir.exists() or not any(runs_dir.iterdir())


def write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "recipe, needles",
    [
        ('[train]\nlr = 1\n', ["bad.toml:2", "train.lr", "learning_rate"]),
        ('[method]\nkind = "lora"\nrank = -3\n', ["bad.toml:3", "method.rank"]),
        ('[train\n', ["bad.toml:1", "TOML"]),
        ('[model]\nname = "run:nothing"\n', ["model.name", "no succeeded run"]),
        ('[train]\nprecision = "bf16"\n', ["train.precision", "fp32"]),
    ],
)
def test_bad_recipe(tmp_path, recipe, needles):
    runs = tmp_path / "runs"
    result = llmtui("run", str(write(tmp_path / "bad.toml", recipe)), runs_dir=runs)
    assert_clean_failure(result, runs, *needles)


@pytest.mark.parametrize(
    "name, content, needles",
    [
        ("missing.json", None, ["missing.json", "not found"]),
        ("empty.jsonl", "", ["empty.jsonl"]),
        ("cols.jsonl", '{"question": "a", "answer": "b"}\n', ["cols.jsonl", "question"]),
        ("broken.jsonl", '{"instruction": "a", "output": "b"}\n{"instruction": "c", "outp\n', ["broken.jsonl", ":2"]),
    ],
)
def test_bad_dataset(tmp_path, name, content, needles):
    runs = tmp_path / "runs"
    if content is not None:
        write(tmp_path / name, content)
    recipe = write(tmp_path / "r.toml", f'[dataset]\nname = "{tmp_path / name}"\n[method]\nkind = "lora"\n')
    result = llmtui("run", str(recipe), runs_dir=runs)
    assert_clean_failure(result, runs, *needles)
    validated = llmtui("validate", str(recipe), runs_dir=runs)
    assert validated.returncode == 2


def test_dry_run_prints_the_command_and_creates_nothing(tmp_path):
    runs = tmp_path / "runs"
    result = llmtui("run", "recipes/quickstart.toml", "--dry-run", runs_dir=runs)
    assert result.returncode == 0, result.stderr
    assert "deepspeed.launcher.runner" in result.stdout and "--num_gpus 2" in result.stdout
    assert not runs.exists() or not any(runs.iterdir())


def test_data_shows_examples_as_trained(tmp_path):
    result = llmtui("data", "recipes/tiny-lora.toml", "--show", "2", "--json", runs_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert len(row["input_ids"]) == len(row["labels"])
        assert -100 in row["labels"] and any(label != -100 for label in row["labels"])
        assert "<|im_start|>assistant" in row["text"]
    plain = llmtui("data", "recipes/tiny-lora.toml", "--show", "1", runs_dir=tmp_path)
    assert "⟦" in plain.stdout and "trained" in plain.stdout


def test_schema_and_estimate(tmp_path):
    schema = json.loads(llmtui("schema", runs_dir=tmp_path).stdout)
    assert "train" in schema["properties"]
    est = llmtui("estimate", "recipes/gpu-qwen-0.5b-sft-zero2.toml", "--gpus", "8", "--json", runs_dir=tmp_path)
    assert est.returncode == 0, est.stderr
    assert json.loads(est.stdout)
