"""Bad recipes and bad datasets: a clear error, exit 2, nothing launched, nothing left behind.
Plus `llmtui data` and `--dry-run`."""

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.helpers import ROOT, llmtui


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
        ('[train]\nlr = 1\n[method]\nkind = "lora"\n', ["bad.toml:2", "train.lr", "learning_rate"]),
        ('[method]\nkind = "lora"\nrank = -3\n', ["bad.toml:3", "method.rank"]),
        ('[train\n', ["bad.toml:1", "TOML"]),
        ('[model]\nname = "run:nothing"\n[method]\nkind = "lora"\n', ["model.name", "no succeeded run"]),
        ('[train]\nprecision = "bf16"\n[method]\nkind = "lora"\n', ["train.precision", "fp32"]),
        ("", ["bad.toml", "method.kind", "missing", "lora", "llama-adapter"]),  # an empty file trains nothing
        ('[model]\nname = "nobody/not-cached-model"\n[method]\nkind = "lora"\n',
         ["model.name", "nobody/not-cached-model", "hf download nobody/not-cached-model"]),
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
    assert "deepspeed.launcher.launch" in result.stdout and '{"localhost": [0, 1]}' in result.stdout
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.slow  # a torch child process: 7-19 s here
def test_data_shows_examples_as_trained(tmp_path):
    result = llmtui("data", "recipes/tiny-lora.toml", "--show", "2", "--json", runs_dir=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)  # one JSON document: the list of examples
    assert [row["index"] for row in rows] == [0, 1]
    for row in rows:
        assert len(row["input_ids"]) == len(row["labels"])
        assert -100 in row["labels"] and any(label != -100 for label in row["labels"])
        assert "<|im_start|>assistant" in row["text"]
        # the mask as decoded runs (what the TUI's data tab marks): the prompt masked, the answer trained
        assert "".join(s["text"] for s in row["segments"]) == row["text"]
        assert [s["trained"] for s in row["segments"]][:2] == [False, True]
        assert row["segments"][0]["text"].startswith("<|im_start|>user")
    plain = llmtui("data", "recipes/tiny-lora.toml", "--show", "1", runs_dir=tmp_path)
    assert "⟦" in plain.stdout and "trained" in plain.stdout


def test_schema_and_estimate(tmp_path):
    schema = json.loads(llmtui("schema", runs_dir=tmp_path).stdout)
    assert "train" in schema["properties"]
    est = llmtui("estimate", "recipes/gpu-qwen-0.5b-sft-zero2.toml", "--gpus", "8", "--json", runs_dir=tmp_path)
    assert est.returncode == 0, est.stderr
    assert json.loads(est.stdout)


# ---------------------------------------------------------------- --json output is one document


def fresh_env(tmp_path):
    """A machine where nothing ran yet: empty llmtui, HF and torch extension caches."""
    env = {**os.environ, "LLMTUI_CACHE": str(tmp_path / "llmtui-cache"), "HF_HOME": str(tmp_path / "hf"),
           "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch-ext"), "HF_HUB_OFFLINE": "1"}
    for name in ("HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE"):
        env.pop(name, None)
    return env


def llmtui_json(tmp_path, *args):
    cmd = [sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(tmp_path / "runs"), *args]
    result = subprocess.run(cmd, cwd=ROOT, env=fresh_env(tmp_path), capture_output=True, text=True, timeout=600,
                            stdin=subprocess.DEVNULL)
    try:
        document = json.loads(result.stdout)  # exactly one JSON document, nothing before or after it
    except ValueError:
        raise AssertionError(f"{args}: stdout is not one JSON document:\n{result.stdout[:2000]}\n"
                             f"stderr:\n{result.stderr[-2000:]}") from None
    return result, document


@pytest.mark.slow
def test_json_output_is_pure_on_a_fresh_machine(tmp_path):
    # `llmtui data` imports torch, transformers and DeepSpeed (whose logger says 'Setting
    # accelerator to CPU' on stdout) and builds the tiny model into the empty cache
    result, rows = llmtui_json(tmp_path, "data", "recipes/tiny-lora.toml", "--show", "2", "--json")
    assert result.returncode == 0, result.stderr
    assert len(rows) == 2 and all(len(r["input_ids"]) == len(r["labels"]) for r in rows)
    result, est = llmtui_json(tmp_path, "estimate", "recipes/tiny-lora.toml", "--json")
    assert result.returncode == 0 and est["memory"]["total"] > 0
    result, runs = llmtui_json(tmp_path, "runs", "--json")
    assert result.returncode == 0 and runs == []
    result, schema = llmtui_json(tmp_path, "schema")
    assert "method" in schema["required"]


@pytest.mark.slow  # a torch child process: 7-19 s here
def test_json_errors_are_one_document_too(tmp_path):
    missing = str(tmp_path / "missing.toml")
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    bad_data = tmp_path / "bad-data.toml"
    bad_data.write_text(f'[dataset]\nname = "{tmp_path / "nope.jsonl"}"\n[method]\nkind = "lora"\n')
    for args, key in [
        (["estimate", missing, "--json"], None),
        (["estimate", str(empty), "--json"], "method.kind"),
        (["data", str(empty), "--json"], "method.kind"),
        (["data", str(bad_data), "--json"], "dataset.name"),
    ]:
        result, document = llmtui_json(tmp_path, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert document["error"]["key"] == key and document["error"]["message"], args
        assert "error:" in result.stderr and "Traceback" not in result.stderr
