"""Resume exact at the edges (real processes, SIGKILL of the run's whole process group): killed before
the first checkpoint, between the last checkpoint and final/, and while final/ is written. Rank 0
stops itself at each exact point (LLMTUI_PAUSE_AT, tuiapp.trainer.loop.resume.pause_at), then the test kills
the run there. Resumed, the run never trains past max_steps and its metrics are unique by step, the
rows it drops said by a `metrics_trimmed` event."""

import json
import os
import signal

import pytest

from tests.e2e.helpers import group_pids, llmtui, metrics, only_run, run_info, train_steps, wait_for
from tuiapp.trainer.loop.resume import PAUSE_ENV, PAUSED_FILE

pytestmark = [pytest.mark.slow, pytest.mark.extended]  # `make test-extended`: over the full tier's budget for now

SHORT = ["--set", "train.max_steps=4", "--set", "train.save_steps=2", "--set", "train.eval_steps=0",
         "--set", "train.logging_steps=1", "--set", "train.warmup_ratio=0.0"]


def kill_at(run_dir, point):
    paused = run_dir / PAUSED_FILE
    wait_for(lambda: paused.exists() or run_info(run_dir)["status"] in ("failed", "succeeded", "stopped"),
             timeout=300, interval=0.1, what=f"the pause at {point}")
    assert paused.read_text() == point, (run_dir / "stdout.log").read_text()[-3000:]
    paused.unlink()
    pgid = run_info(run_dir)["pgid"]
    os.killpg(pgid, signal.SIGKILL)
    wait_for(lambda: not group_pids(pgid), timeout=60, what="the killed group gone")


def events(run_dir):
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def test_kills_at_each_edge_resume_to_exactly_max_steps_with_unique_rows(runs_dir, monkeypatch):
    monkeypatch.setenv(PAUSE_ENV, "step:1")  # before the first checkpoint
    llmtui("run", "recipes/tiny-sft.toml", *SHORT, "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    kill_at(run_dir, "step:1")
    assert train_steps(run_dir) == [1] and not list((run_dir / "checkpoints").glob("checkpoint-*"))

    monkeypatch.setenv(PAUSE_ENV, "checkpoint:4")  # the last checkpoint saved, final/ not yet
    llmtui("resume", run_dir.name, "--detach", runs_dir=runs_dir, check=True)
    kill_at(run_dir, "checkpoint:4")
    assert train_steps(run_dir) == [1, 2, 3, 4]  # the first attempt's step-1 row was dropped, not doubled
    [trimmed] = [e for e in events(run_dir) if e["event"] == "metrics_trimmed"]
    assert trimmed["step"] == 0 and trimmed["steps"] == [1, 1] and trimmed["rows"] == 1
    assert not (run_dir / "final").exists()

    monkeypatch.setenv(PAUSE_ENV, "final")  # while final/ is written
    llmtui("resume", run_dir.name, "--detach", runs_dir=runs_dir, check=True)
    kill_at(run_dir, "final")
    assert train_steps(run_dir) == [1, 2, 3, 4]  # resumed at max_steps: no step 5
    assert not (run_dir / "final").exists()

    monkeypatch.delenv(PAUSE_ENV)
    result = llmtui("resume", run_dir.name, runs_dir=runs_dir, timeout=300)
    assert result.returncode == 0, result.stdout + (run_dir / "stdout.log").read_text()[-3000:]
    assert run_info(run_dir)["status"] == "succeeded"
    assert train_steps(run_dir) == [1, 2, 3, 4]
    assert max(r["step"] for r in metrics(run_dir)) == 4
    assert json.loads((run_dir / "final" / "llmtui.json").read_text())["step"] == 4
    assert not (run_dir / ".final-staging").exists()
