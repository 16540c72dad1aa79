"""After training, for real: chat with a run's final model, a checkpoint, an adapter on its base
and the base itself through the real inference server; evaluate it against its base; read the
tracker files it left (TensorBoard's own reader, wandb's offline run, MLflow's file store); export
it cast to another dtype. Runs come from tests/after_runs.py (trained once per session)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.after_runs import lora_run, sft_run
from tuiapp.core.after.chat import ChatSession
from tuiapp.core.run_folder import evals, exports
from tuiapp.core.run_folder.metrics import dedupe_steps, eval_rows, read_jsonl, train_rows

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
QUESTION = "What is the capital of Japan?"


@pytest.fixture(scope="session")
def sft(tmp_path_factory) -> Path:
    return sft_run(tmp_path_factory)


@pytest.fixture
def run(sft, tmp_path) -> Path:
    """A private copy of the sft run (tests add eval results, exports...)."""
    copy = tmp_path / "runs" / sft.name
    shutil.copytree(sft, copy)
    return copy


def llmtui(run: Path, *args: str, input: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(run.parent), *args]
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600, input=input,
                          stdin=None if input is not None else subprocess.DEVNULL, env={**os.environ, **(env or {})})


def loss_rows(run: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in dedupe_steps(train_rows(read_jsonl(run / "metrics.jsonl")))]


# ---------------------------------------------------------------- chat


def test_chat_answers_from_the_tuned_model_the_base_and_a_checkpoint(run):
    done = llmtui(run, "chat", run.name, "--prompt", QUESTION, "--vs-base", "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)  # the one document
    assert document["target"]["label"] == "final" and document["target"]["kind"] == "full"
    assert document["settings"]["temperature"] == 0.0  # the run's [generate] table
    tuned, base = document["answers"]["tuned"], document["answers"]["base"]
    assert tuned["text"] and tuned["tokens"] > 0 and base["tokens"] > 0
    assert tuned["text"] != base["text"]  # 60 steps of SFT changed what the model says

    plain = llmtui(run, "chat", run.name, "--prompt", QUESTION)  # streamed text, the same greedy answer
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == tuned["text"]

    alone = llmtui(run, "chat", run.name, "--prompt", QUESTION, "--base", "--json", "--max-new-tokens", "5")
    short = json.loads(alone.stdout)["answers"]["base"]
    assert short["tokens"] <= 5 and base["text"].startswith(short["text"])  # the same greedy start, cut short

    ckpt = llmtui(run, "chat", run.name, "--checkpoint", "30", "--prompt", QUESTION, "--json")
    assert ckpt.returncode == 0, ckpt.stderr
    assert json.loads(ckpt.stdout)["target"]["label"] == "checkpoint-30"


def test_the_server_streams_tokens_and_keeps_each_conversation(run):
    with ChatSession(run, load=["tuned"]) as session:
        ready = session.start()
        assert ready["models"] == {"tuned": "final"}
        events = []
        done = session.ask(QUESTION, on_event=events.append)
        tokens = [e for e in events if e["event"] == "token"]
        assert done["event"] == "done" and len(tokens) >= 2  # streamed, piece by piece
        assert "".join(e["text"] for e in tokens).strip() == done["text"]
        session.ask("And of France?")
        assert [m["role"] for m in session.history["tuned"]] == ["user", "assistant", "user", "assistant"]
        short = list(session.stream([{"role": "user", "content": QUESTION}], settings={"max_new_tokens": 2}))
        assert short[-1]["event"] == "done" and short[-1]["tokens"] <= 2
        bad = list(session.stream([{"role": "user"}]))  # a bad request: an error event, the server goes on
        assert bad[-1]["event"] == "error" and "messages" in bad[-1]["message"]
        base = session.ask(QUESTION, "base")  # loaded at its first use
        assert base["event"] == "done"
        assert session.alive
        proc = session._proc
    assert proc.poll() is not None  # closing ends the server


def test_interactive_chat_reads_lines_until_the_end_of_input(run):
    done = llmtui(run, "chat", run.name, input=f"{QUESTION}\n/reset\n{QUESTION}\n")
    assert done.returncode == 0, done.stderr
    answers = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(answers) == 2 and answers[0] == answers[1]  # /reset forgot the first turn


def test_chat_vs_another_run_and_single_turn(run, tmp_path_factory):
    lora = lora_run(tmp_path_factory)
    shutil.copytree(lora, run.parent / lora.name)
    done = llmtui(run, "chat", run.name, "--vs", lora.name, "--prompt", QUESTION, "--json", "--max-new-tokens", "6")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["vs"]["run"] == lora.name and document["vs"]["target"]["kind"] == "peft"
    assert document["answers"]["tuned"]["tokens"] > 0 and 0 < document["answers"]["vs"]["tokens"] <= 6
    streamed = llmtui(run, "chat", run.name, "--vs", lora.name, "--prompt", QUESTION, "--max-new-tokens", "6")
    assert streamed.returncode == 0, streamed.stderr
    assert f"[tuned: final of {run.name}]" in streamed.stdout and f"[vs: final of {lora.name}]" in streamed.stdout

    # single turn: the same message twice gets the same greedy answer (the first is not sent along)
    alone = llmtui(run, "chat", run.name, "--single-turn", input=f"{QUESTION}\n{QUESTION}\n")
    assert alone.returncode == 0, alone.stderr
    answers = [line for line in alone.stdout.splitlines() if line.strip()]
    assert len(answers) == 2 and answers[0] == answers[1]


def test_chat_with_an_adapter_on_its_base(tmp_path_factory, tmp_path):
    lora = lora_run(tmp_path_factory)
    done = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(lora.parent), "chat", lora.name,
                           "--prompt", QUESTION, "--json", "--max-new-tokens", "8"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["target"]["kind"] == "peft" and document["target"]["method"] == "lora"
    assert document["answers"]["tuned"]["tokens"] > 0


# ---------------------------------------------------------------- eval


def test_eval_tuned_perplexity_is_below_the_base_and_shows_in_history_and_compare(run):
    done = llmtui(run, "eval", run.name, "--data", "demo:facts-heldout", "--gen-limit", "5", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    tuned, base = result["models"]["tuned"], result["models"]["base"]
    print(f"held-out perplexity: tuned {tuned['perplexity']:.3f}, base {base['perplexity']:.1f}")
    assert tuned["perplexity"] < base["perplexity"]
    assert math.isclose(tuned["perplexity"], math.exp(tuned["loss"]), rel_tol=1e-9)
    assert tuned["generated"] == 5 and 0 <= tuned["rouge_l"] <= 1 and 0 <= tuned["exact_match"] <= 1
    assert tuned["rouge_l"] >= base["rouge_l"]
    assert Path(result["path"]).parent == run / "evals" and evals.latest(run)["models"] == result["models"]

    from tuiapp.core.run_folder.rundir import read_record
    from tuiapp.ui.comparing import load_compare_run
    from tuiapp.ui.history import HistoryLoader, row_from_record
    from tuiapp.ui.widgets.runs_table import cells

    loader = HistoryLoader(run.parent)
    row = loader.summarize(row_from_record(run, read_record(run / "run.json")))
    assert row.eval_ppl == pytest.approx(tuned["perplexity"]) and row.eval_base_ppl == pytest.approx(base["perplexity"])
    assert cells(row, 0.0)["eval_ppl"].startswith(f"{tuned['perplexity']:.3g} (base ")
    assert load_compare_run(run).row.eval_ppl == pytest.approx(tuned["perplexity"])

    table = llmtui(run, "eval", run.name, "--data", "demo:facts-heldout", "--limit", "20", "--gen-limit", "0",
                   "--checkpoint", "30", "--no-base")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split() == ["tuned", "(checkpoint-30)"]
    assert any(line.startswith("perplexity") for line in table.stdout.splitlines())


def test_eval_reads_any_supported_format(run, tmp_path):
    data = tmp_path / "held.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
                            + "\n" for q, a in [(QUESTION, "The capital of Japan is Tokyo."),
                                                ("What sound does a cow make?", "A cow says moo.")]))
    done = llmtui(run, "eval", run.name, "--data", str(data), "--no-base", "--json")
    assert done.returncode == 0, done.stderr
    tuned = json.loads(done.stdout)["models"]["tuned"]
    assert tuned["scored"] == 2 and tuned["generated"] == 2 and tuned["tokens"] > 0


# ---------------------------------------------------------------- trackers


def _scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def test_tensorboard_events_hold_the_same_losses_as_metrics_jsonl(run, tmp_path):
    expected = loss_rows(run)
    assert len(expected) >= 10
    live = _scalars(run / "tensorboard", "train/loss")
    assert [s for s, _ in live] == [s for s, _ in expected]
    assert all(math.isclose(v, e, rel_tol=1e-6) for (_, v), (_, e) in zip(live, expected, strict=True))

    done = llmtui(run, "export-metrics", run.name, "--tensorboard", str(tmp_path / "tb"))
    assert done.returncode == 0, done.stderr
    exported = tmp_path / "tb" / run.name
    assert _scalars(exported, "train/loss") == pytest.approx(expected, rel=1e-6)
    evaluated = [(r["step"], r["eval_loss"]) for r in eval_rows(read_jsonl(run / "metrics.jsonl"))]
    assert evaluated and _scalars(exported, "eval/loss") == pytest.approx(evaluated, rel=1e-6)


def test_wandb_runs_offline_in_the_run_folder(run):
    pytest.importorskip("wandb")
    offline = list((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("run-*.wandb"))


def test_mlflow_file_store_holds_the_losses(run):
    pytest.importorskip("mlflow")
    files = list((run / "mlruns").glob("*/*/metrics/loss"))
    assert len(files) == 1
    logged = [(int(step), float(value)) for _, value, step in (line.split() for line in files[0].read_text().splitlines())]
    assert logged == pytest.approx(loss_rows(run), rel=1e-6)


# ---------------------------------------------------------------- export


def _safetensors_dtypes(path: Path) -> set[str]:
    raw = path.read_bytes()
    header = json.loads(raw[8: 8 + int.from_bytes(raw[:8], "little")])
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


def test_export_casts_to_a_dtype_and_refuses_to_push_offline(run, tmp_path):
    assert _safetensors_dtypes(run / "final" / "model.safetensors") == {"F32"}
    out = tmp_path / "bf16"
    done = llmtui(run, "export", run.name, "--out", str(out), "--dtype", "bfloat16")
    assert done.returncode == 0, done.stderr
    assert _safetensors_dtypes(out / "model.safetensors") == {"BF16"}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    (record,) = exports.made(run)  # in the run folder, for an open TUI to show
    assert record["out"] == str(out.resolve()) and record["dtype"] == "bfloat16" and record["files"] >= 2
    pushed = llmtui(run, "export", run.name, "--out", str(tmp_path / "p"), "--push", "me/tiny", env={"HF_HUB_OFFLINE": "1"})
    assert pushed.returncode == 2 and "needs the network" in pushed.stderr and "Traceback" not in pushed.stderr
