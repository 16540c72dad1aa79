"""After training, the torch-free side: which model a run offers (and the clear errors when it
offers none), stored eval results, tracker settings, and the CLI's refusals (exit 2, no traceback,
one JSON document with --json). The runs are copies of the real-run fixtures (tests/fixtures/runs),
which keep no weights: exactly a run without a final model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.conftest import CRASHED, SFT
from tuiapp.core.after.chat import ChatSession, check_overrides, server_argv
from tuiapp.core.after.targets import base_of, checkpoints, model_target
from tuiapp.core.common.errors import RunError
from tuiapp.core.config import trackers
from tuiapp.core.config.recipe import Recipe, SftMethod
from tuiapp.core.data.demo_data import demo_records, facts_eval_pairs
from tuiapp.core.run_folder import evals

ROOT = Path(__file__).resolve().parents[2]


def llmtui(*args: str, runs: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})


# ---------------------------------------------------------------- targets


def test_a_run_without_a_final_model_names_what_is_missing(runs):
    with pytest.raises(RunError) as caught:
        model_target(runs / CRASHED)
    assert "has no final model (failed)" in caught.value.message
    assert f"llmtui resume {CRASHED}" in caught.value.fix and "wait" not in caught.value.fix


def test_a_succeeded_run_whose_final_model_is_gone_is_not_told_to_wait(runs):
    assert not (runs / SFT / "final").exists() and not (runs / SFT / "checkpoints").exists()  # the fixture's state
    with pytest.raises(RunError) as caught:
        model_target(runs / SFT)
    assert "has no final model (succeeded)" in caught.value.message
    assert "final/ folder is gone" in caught.value.fix and f"llmtui reproduce {SFT}" in caught.value.fix
    assert "wait" not in caught.value.fix


def test_a_checkpoint_that_does_not_exist_lists_those_that_do(runs):
    run = runs / SFT
    with pytest.raises(RunError) as caught:
        model_target(run, checkpoint=7)
    assert "has no checkpoint 7" in caught.value.message
    assert "no checkpoint" in caught.value.fix  # the fixture kept none
    # a real checkpoint layout (published by rename, with its trainer state) is found
    (run / "checkpoints" / "checkpoint-20").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-20" / "trainer_state.json").write_text("{}")
    (run / "checkpoints" / "checkpoint-40").mkdir()  # incomplete: no trainer state
    assert checkpoints(run) == [20]
    with pytest.raises(RunError) as caught:
        model_target(run, checkpoint=40)
    assert caught.value.fix == "use one of: 20"
    with pytest.raises(RunError) as caught:
        model_target(run)
    assert "--checkpoint 20" in caught.value.fix  # no final model, but a checkpoint to use


def test_a_checkpoint_without_weights_is_refused_clearly(runs):
    run = runs / SFT
    folder = run / "checkpoints" / "checkpoint-20"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    (folder / "config.json").write_text("{}")
    with pytest.raises(RunError) as caught:
        model_target(run, checkpoint=20)
    assert "lacks weights" in caught.value.message


def test_the_base_is_what_the_run_trained_from(runs):
    assert base_of(runs / SFT) == "tiny"  # run.json's model: resolved where the model loads


def test_a_reward_model_cannot_chat(runs):
    run = runs / SFT
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "method": "reward"}))
    with pytest.raises(RunError, match="reward model"):
        model_target(run)


def test_a_chat_session_refuses_before_starting_a_process(runs):
    with pytest.raises(RunError):
        ChatSession(runs / CRASHED)
    assert server_argv(runs / SFT, 20, ["tuned", "base"])[2:] == [
        "tuiapp.trainer.tools.serve", str(runs / SFT), "--load", "tuned,base", "--checkpoint", "20"]


def test_generation_overrides_are_checked():
    assert check_overrides({"temperature": 0.7, "top_p": None, "system": "Be brief."}) == {
        "temperature": 0.7, "system": "Be brief."}
    for bad in ({"temperature": -1.0}, {"top_p": 0.0}, {"max_new_tokens": 0}):
        with pytest.raises(RunError):
            check_overrides(bad)


def test_the_recipe_carries_generation_settings_and_trackers():
    recipe = Recipe(method=SftMethod(), generate={"temperature": 0.7, "system": "Be brief."},
                    train={"report_to": ["tensorboard"]})
    assert recipe.generate.max_new_tokens == 128 and recipe.generate.top_p == 1.0
    assert recipe.train.report_to == ["tensorboard"]
    assert Recipe(method=SftMethod()).train.report_to == []


# ---------------------------------------------------------------- eval results


def test_eval_results_are_stored_and_read_back(tmp_path):
    result = {"time": 1.0, "data": "demo:facts-heldout", "target": {"label": "final"},
              "models": {"tuned": {"loss": 1.04, "perplexity": 2.83, "exact_match": 0.2, "rouge_l": 0.8},
                         "base": {"loss": 7.56, "perplexity": 1914.7, "exact_match": 0.0, "rouge_l": 0.0}}}
    first = evals.new_path(tmp_path, now=0)
    evals.write(first, result)
    second = evals.new_path(tmp_path, now=0)  # same second: never the same file
    assert second != first
    evals.write(second, {**result, "models": {"tuned": {"perplexity": 2.5}}})
    (tmp_path / "evals" / "broken.json").write_text("{not json")
    found = evals.results(tmp_path)
    assert [Path(r["path"]) for r in found] == [first, second]
    assert evals.number(evals.latest(tmp_path), "tuned", "perplexity") == 2.5
    assert evals.perplexity_cell(result) == "2.83 (base 1915)"
    assert evals.perplexity_cell(None) == ""
    lines = evals.table(result)
    assert "tuned (final)" in lines[0] and "base" in lines[0]
    assert any(line.startswith("perplexity") and "2.830" in line and "1914.700" in line for line in lines)
    assert evals.latest(tmp_path / "nowhere") is None


def test_the_held_out_demo_is_alpaca_of_the_eval_pairs():
    records = demo_records("demo:facts-heldout")
    assert [(r["instruction"], r["output"]) for r in records] == facts_eval_pairs()


# ---------------------------------------------------------------- trackers


def test_trackers_write_into_the_run_folder_offline(tmp_path):
    env = trackers.environment(["tensorboard", "wandb", "mlflow"], tmp_path)
    assert env["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "tensorboard")
    assert env["WANDB_MODE"] == "offline" and env["WANDB_DIR"] == str(tmp_path)
    assert env["MLFLOW_TRACKING_URI"] == (tmp_path / "mlruns").resolve().as_uri()
    assert trackers.environment([], tmp_path) == {}


def test_a_missing_tracker_package_is_a_preflight_error(monkeypatch):
    assert trackers.findings(["tensorboard"]) == []  # installed by the test extra
    monkeypatch.setitem(trackers.PACKAGES, "wandb", ("no_such_module_here", "wandb"))
    found = trackers.findings(["wandb"])
    assert [(f.level, f.key) for f in found] == [("error", "train.report_to")]
    assert "pip install 'llmtui[wandb]'" in found[0].fix
    with pytest.raises(RuntimeError, match="not installed"):
        trackers.training_kwargs(["wandb"], Path("/tmp"))


# ---------------------------------------------------------------- the CLI's refusals


def test_chat_without_a_final_model_exits_2_with_the_fix(runs):
    done = llmtui("chat", CRASHED, "--prompt", "hi", runs=runs)
    assert done.returncode == 2
    assert "error: " + CRASHED + " has no final model (failed)" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_chat_json_prints_one_error_document(runs):
    done = llmtui("chat", SFT, "--checkpoint", "3", "--prompt", "hi", "--json", runs=runs)
    assert done.returncode == 2
    document = json.loads(done.stdout)
    assert "has no checkpoint 3" in document["error"]["message"]
    assert "Traceback" not in done.stderr


EMPTY_SAFETENSORS = (2).to_bytes(8, "little") + b"{}"  # a safetensors file holding no tensor


def test_eval_refuses_a_file_of_unknown_format(runs, tmp_path):
    run = runs / SFT
    final = run / "final"  # a final folder is enough for the refusal: nothing loads before the data check
    final.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (final / name).write_text("{}")
    (final / "model.safetensors").write_bytes(EMPTY_SAFETENSORS)  # readable weights (damaged ones are refused first)
    bad = tmp_path / "held.xml"
    bad.write_text("<a/>")
    done = llmtui("eval", SFT, "--data", str(bad), runs=runs)
    assert done.returncode == 2 and "unsupported file type '.xml'" in done.stderr and "Traceback" not in done.stderr
    odd = tmp_path / "held.jsonl"
    odd.write_text('{"question": "q", "reply": "a"}\n')
    done = llmtui("eval", SFT, "--data", str(odd), "--json", runs=runs)
    assert done.returncode == 2
    assert "cannot tell the format" in json.loads(done.stdout)["error"]["message"]
    assert "--columns" in json.loads(done.stdout)["error"]["fix"]


def test_eval_tasks_without_lm_eval_say_how_to_get_it(runs):
    import importlib.util

    if importlib.util.find_spec("lm_eval") is not None:
        pytest.skip("lm-eval is installed here")
    run = runs / SFT
    (run / "final").mkdir()
    for name in ("config.json", "tokenizer.json"):
        (run / "final" / name).write_text("{}")
    (run / "final" / "model.safetensors").write_bytes(EMPTY_SAFETENSORS)
    done = llmtui("eval", SFT, "--data", "demo:facts-heldout", "--tasks", "hellaswag", runs=runs)
    assert done.returncode == 2
    assert "--tasks needs lm-evaluation-harness" in done.stderr and "pip install lm-eval" in done.stderr


def test_export_push_is_refused_offline_before_any_work(runs, tmp_path):
    run = runs / SFT
    (run / "final").mkdir()
    done = llmtui("export", SFT, "--out", str(tmp_path / "out"), "--push", "me/tiny-sft", runs=runs,
                  env={"HF_HUB_OFFLINE": "1"})
    assert done.returncode == 2
    assert "--push me/tiny-sft needs the network" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
    done = llmtui("export", SFT, "--out", str(tmp_path / "out"), "--push", "not-a-repo", runs=runs)
    assert done.returncode == 2 and "use --push owner/name" in done.stderr


def test_export_metrics_of_a_run_without_metrics_is_refused(runs):
    (runs / SFT / "metrics.jsonl").unlink()
    done = llmtui("export-metrics", SFT, "--tensorboard", "/tmp/x", runs=runs)
    assert done.returncode == 2 and "has no metrics.jsonl" in done.stderr
