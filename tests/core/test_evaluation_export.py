"""The flow behind `llmtui eval` / `llmtui export` and the TUI's Evaluate / Export (core.after.evaluation,
core.after.exporting, core.common.child_tool), without torch: every refusal before any work, the tool's argv,
and a child tool that can be cancelled. The real evaluation and export run in tests/e2e (slow)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.core.conftest import CRASHED, SFT
from tuiapp.core.after import evaluation, exporting
from tuiapp.core.common.child_tool import ChildTool
from tuiapp.core.common.errors import DatasetError, RunError, UserError
from tuiapp.core.store.runs import Run

ROOT = Path(__file__).resolve().parents[2]


def test_eval_refuses_a_run_without_a_final_model_before_any_work(runs):
    with pytest.raises(RunError) as caught:
        evaluation.plan(runs / CRASHED, evaluation.EvalRequest())
    assert "has no final model" in caught.value.message
    assert not (runs / CRASHED / "evals").exists()


def test_eval_data_is_read_as_training_reads_it_and_named_by_its_flag(tmp_path):
    assert evaluation.check_data("demo:facts-heldout", "auto", {}, tmp_path) > 0
    with pytest.raises(DatasetError) as caught:
        evaluation.check_data("missing.jsonl", "auto", {}, tmp_path)
    assert caught.value.key == "--data"  # the flag the user typed, not --name
    # fixes name eval's flags, never the recipe keys eval has none of
    alpaca = tmp_path / "alpaca.jsonl"
    alpaca.write_text('{"instruction": "Say hi", "input": "", "output": "hi"}\n')
    with pytest.raises(DatasetError) as caught:
        evaluation.check_data(str(alpaca), "sharegpt", {}, tmp_path)
    assert caught.value.fix == "pass --format alpaca"
    with pytest.raises(DatasetError) as caught:
        evaluation.check_data(str(alpaca), "auto", {"prompt": "question"}, tmp_path)
    assert "dataset." not in caught.value.fix and "with --columns, e.g. prompt=...,response=..." in caught.value.fix
    with pytest.raises(UserError, match="is not ROLE=COLUMN"):
        evaluation.parse_columns("prompt")
    assert evaluation.parse_columns("prompt=q, response=a") == {"prompt": "q", "response": "a"}


def test_export_refuses_what_cannot_work_before_any_work(runs, tmp_path):
    with pytest.raises(UserError, match="has no final model"):
        exporting.plan(Run(runs / CRASHED).load(), exporting.ExportRequest(out=str(tmp_path / "out")))
    sft = Run(runs / SFT).load()
    (sft.path / "final").mkdir()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "a").write_text("x")
    with pytest.raises(UserError, match="exists and is not empty") as caught:
        exporting.plan(sft, exporting.ExportRequest(out=str(taken)))
    assert caught.value.fix == "choose a new folder for --out"
    with pytest.raises(UserError, match="is not a weight type"):
        exporting.plan(sft, exporting.ExportRequest(out=str(tmp_path / "new"), dtype="int3"))
    with pytest.raises(UserError, match="not a repo id"):
        exporting.plan(sft, exporting.ExportRequest(out=str(tmp_path / "new"), push="nope"))
    with pytest.raises(UserError, match="trained every weight: its final model is already whole") as caught:
        exporting.plan(sft, exporting.ExportRequest(out=str(tmp_path / "new"), merge=True))  # was copied, "merged"
    assert caught.value.key == "--merge" and caught.value.fix == "export without --merge"
    planned = exporting.plan(sft, exporting.ExportRequest(out=str(tmp_path / "new"), dtype="bfloat16"))
    assert planned.argv == [str(sft.final_path), "--out", str(tmp_path / "new"), "--dtype", "bfloat16"]
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("method", ["prefix", "ptuning", "llama-adapter", "adapter"])
def test_an_adapter_that_cannot_merge_is_refused_before_the_export_tool_loads_it(tmp_path, method):
    """The export tool raised on these after loading the model (exit 1, a traceback's last line)."""
    import json

    run_dir = _lora_run(tmp_path / "runs", method, tmp_path / "base")
    (run_dir / "final" / "llmtui.json").write_text(json.dumps({"base_model": "tiny", "method": method}))
    if method == "adapter":  # bottleneck adapters: their own config, no peft one
        (run_dir / "final" / "adapter_config.json").rename(run_dir / "final" / "bottleneck_config.json")
    run = Run(run_dir).load()
    for request, option in ((exporting.ExportRequest(out=str(tmp_path / "m"), merge=True), "--merge"),
                            (exporting.ExportRequest(out=str(tmp_path / "g"), gguf="q8_0"), "--gguf")):
        with pytest.raises(UserError, match="cannot merge") as caught:
            exporting.plan(run, request)
        assert caught.value.key == option and caught.value.fix == "export the adapter alone (no --merge, no --gguf)"
    assert exporting.plan(run, exporting.ExportRequest(out=str(tmp_path / "a"))).argv[-2:] == ["--out", str(tmp_path / "a")]


def test_a_child_tool_reports_its_error_lines_and_can_be_cancelled():
    failing = ChildTool.of_module("timeit", ["-n1", "-r1", "import sys; print('error: no model'); print('  fix: train one');"
                                   " sys.stdout.flush(); sys.exit(2)"])
    lines: list[str] = []
    outcome = failing.run(lines.append)
    assert outcome.code != 0 and outcome.message_and_fix("failed", "see above") == ("no model", "train one")
    assert "error: no model\n" in lines

    sleeping = ChildTool.of_module("timeit", ["-n1", "-r1", "import time; time.sleep(60)"])
    started = time.monotonic()
    import threading

    threading.Timer(0.5, sleeping.cancel).start()
    outcome = sleeping.run()
    assert outcome.cancelled and time.monotonic() - started < 20
    assert sys.executable in sleeping.argv


def _lora_run(runs: Path, name: str, base: Path) -> Path:
    import json

    run_dir = runs / f"20260101-000000-{name}-a001"
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"id": run_dir.name, "name": name, "status": "succeeded",
                                                  "method": "lora", "model": str(base)}))
    (run_dir / "final" / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "base_model_name_or_path": str(base), "r": 8, "target_modules": ["q_proj"]}))
    (run_dir / "final" / "llmtui.json").write_text(json.dumps({"base_model": str(base), "method": "lora"}))
    return run_dir


@pytest.mark.slow  # over ~3.5 s on 2 busy cores (9.8 s in the fast tier)
def test_an_adapter_whose_base_folder_is_gone_is_refused_before_any_work(tmp_path):
    # chat, eval, serve, merge and export --merge failed deep in transformers ("Repo id must be in the form...")
    import subprocess
    import sys

    gone = tmp_path / "models" / "qwen3"  # the base folder the runs trained from, since moved away
    run_dir = _lora_run(tmp_path / "runs", "lora", gone)
    other = _lora_run(tmp_path / "runs", "lora2", gone)
    out = tmp_path / "export"
    for args in (["chat", run_dir.name, "--prompt", "hi"], ["eval", run_dir.name],
                 ["serve", run_dir.name, "--port", "18999"], ["export", run_dir.name, "--out", str(out), "--merge"],
                 ["merge", run_dir.name, other.name, "--name", "merged"]):
        done = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(tmp_path / "runs"), *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert f"{gone}, is no longer there" in done.stderr and "put the base model back" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and "Repo id" not in done.stderr
    assert not out.exists() and not (run_dir / "evals").exists() and not (run_dir / "serve.json").exists()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")) == sorted(
        [run_dir.name, other.name])  # no merged run, no work folder
