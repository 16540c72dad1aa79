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
        ('[model]\nname = "tiny"\n[train]\nprecision = "bf16"\n[method]\nkind = "lora"\n', ["train.precision", "fp32"]),
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
    recipe = write(tmp_path / "r.toml", f'[model]\nname = "tiny"\n[dataset]\nname = "{tmp_path / name}"\n[method]\nkind = "lora"\n')
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
    bad_data.write_text(f'[model]\nname = "tiny"\n[dataset]\nname = "{tmp_path / "nope.jsonl"}"\n[method]\nkind = "lora"\n')
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


@pytest.mark.slow  # four CLI processes: 14 s here
def test_show_and_probe_json_errors_are_one_document(tmp_path):
    empty = write(tmp_path / "empty.toml", "")
    bad_data = write(tmp_path / "bad-data.toml", f'[model]\nname = "tiny"\n[dataset]\nname = "{tmp_path / "nope.jsonl"}"\n[method]\nkind = "lora"\n')
    for args, key in [
        (["show", "no-such-run", "--json"], None),
        (["probe", str(empty), "--json"], "method.kind"),
        (["probe", str(bad_data), "--json"], "dataset.name"),
        (["probe", "recipes/tiny-lora.toml", "--memory-limit", "12XB", "--json"], None),
    ]:
        result, document = llmtui_json(tmp_path, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert document["error"]["key"] == key and document["error"]["message"], (args, document)
        assert "Traceback" not in result.stderr and result.stderr.strip(), args
    assert document["error"]["fix"] and "12XB" in document["error"]["message"]


# ---------------------------------------------------------------- preflight bounds (issue: pass, then fail in a rank)
# In-process: the same `llmtui` main, without a process start per case.


def cli(capsys, runs, *args) -> tuple[int, str, str]:
    from tuiapp.cli.main import main

    code = main(["--runs-dir", str(runs), *args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_refused(code, out, err, runs, *needles):
    assert code == 2, out + err
    assert "Traceback" not in out + err
    for needle in needles:
        assert needle in err, err
    assert not runs.exists() or not [p for p in runs.iterdir() if not p.name.startswith(".")]


TINY_LORA = str(ROOT / "recipes/tiny-lora.toml")


@pytest.mark.parametrize("override, needles", [
    ("train.max_steps=99999999999999999999", ["train.max_steps", "99999999999999999999", "at most 2147483647"]),
    ("train.epochs=inf", ["train.epochs", "not a finite number", "fix:"]),
    ("train.seed=4294967296", ["train.seed", "at most 2147483647"]),
    ("launch.gpus=[0, 99999999999]", ["launch.gpus", "99999999999"]),
    ("dataset.name=", ["dataset.name", "is empty", "fix:"]),
    ("model.name=''", ["model.name", "is empty"]),
])
def test_values_no_trainer_takes_are_refused_with_key_and_fix(tmp_path, capsys, override, needles):
    runs = tmp_path / "runs"
    assert_refused(*cli(capsys, runs, "run", TINY_LORA, "--set", override), runs, *needles)


def test_each_fix_line_is_printed_once(tmp_path, capsys):
    recipe = write(tmp_path / "r.toml", f'[model]\nname = "tiny"\n[dataset]\nname = "{tmp_path / "missing.jsonl"}"\n[method]\nkind = "lora"\n')
    for command in ("validate", "run"):
        code, out, err = cli(capsys, tmp_path / "runs", command, str(recipe))
        assert code == 2 and (out + err).count("fix: check the path") == 1, out + err
        assert (out + err).count("dataset.name") == 1, out + err


def test_far_more_memory_than_the_machine_has_is_an_error_unless_oversubscribed(tmp_path, capsys):
    runs = tmp_path / "runs"
    huge = ["--set", "train.micro_batch=1000000000", "--dry-run"]
    code, out, err = cli(capsys, runs, "run", TINY_LORA, *huge)
    assert_refused(code, out, err, runs, "memory:", "over 2x", "--oversubscribe")
    assert err.split("memory:")[0].splitlines()[-1].startswith("error")
    code, out, err = cli(capsys, runs, "run", TINY_LORA, *huge, "--oversubscribe")
    assert code == 0 and "warning" in err and "dry run" in out, err


def test_more_cpu_ranks_than_cores_is_an_error_unless_oversubscribed(tmp_path, capsys):
    runs = tmp_path / "runs"
    cores = len(os.sched_getaffinity(0))
    code, out, err = cli(capsys, runs, "run", TINY_LORA, "--set", f"launch.gpus={cores + 1}", "--dry-run")
    assert_refused(code, out, err, runs, "launch.gpus", f"asks for {cores + 1} CPU ranks", f"{cores} CPU cores",
                   f"launch.gpus = {cores} or fewer")
    assert_refused(*cli(capsys, runs, "run", TINY_LORA, "--set", "launch.gpus=1000"), runs, "asks for 1000 CPU ranks")
    code, out, err = cli(capsys, runs, "run", TINY_LORA, "--set", f"launch.gpus={cores + 1}", "--dry-run",
                         "--oversubscribe")
    assert code == 0, err
    code, out, err = cli(capsys, runs, "run", TINY_LORA, "--set", f"launch.gpus={cores}", "--dry-run")
    assert code == 0 and "asks for" not in err and "CPU cores" not in err, err  # no refusal of the ranks


def test_rename_note_and_tag_refuse_escape_sequences(tmp_path, capsys):
    from tuiapp.core.config.recipe import recipe_from_dict
    from tuiapp.core.store.runs import RunStore

    runs = tmp_path / "runs"
    run = RunStore(runs).create(recipe_from_dict({"name": "plain", "method": {"kind": "lora"}}))
    for args in (["rename", run.id, "x\x1b[2J"], ["note", run.id, "hi\x1b]0;owned\x07"], ["tag", run.id, "+a\x1b[31m"],
                 ["rename", run.id, "a\u202ereversed"]):
        code, out, err = cli(capsys, runs, *args)
        assert code == 2, (args, out)
        assert "\x1b" not in out + err and "control characters" in err, args
    code, out, _ = cli(capsys, runs, "runs")
    assert "\x1b" not in out and run.id in out
    assert cli(capsys, runs, "rename", run.id, "fine name ✓")[0] == 0
