"""Ranks that outlive their supervisor (SIGKILL of the supervisor alone): the run ends with the
status the ranks earned, never a launcher line as its reason, and `resume` adopts live ranks."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest

from tests.e2e.helpers import group_pids, llmtui, rank_pids, run_info, steps_reached, wait_for

pytestmark = pytest.mark.slow

STEPS = ["--set", "train.save_steps=0", "--set", "train.eval_steps=0", "--set", "dataset.eval_split=0",
         "--set", "train.sample_prompts=[]"]


def _start(runs_dir, name: str, max_steps: int):
    result = llmtui("run", "recipes/tiny-sft.toml", *STEPS, "--set", f"train.max_steps={max_steps}", "--set",
                    f"name={name}", "--detach", runs_dir=runs_dir, check=True)
    return runs_dir / next(line.split()[1] for line in result.stdout.splitlines() if line.startswith("run "))


def _kill_supervisor(run_dir) -> int:
    """SIGKILL the supervisor alone; its ranks (same process group) train on."""
    info = run_info(run_dir)
    os.kill(info["pid"], signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(info["pid"]) or psutil.Process(info["pid"]).status() == psutil.STATUS_ZOMBIE,
             timeout=10, what="the supervisor to die")
    assert rank_pids(run_dir), "the ranks should outlive their supervisor"
    return info["pgid"]


def _clean(reason: str) -> None:
    """A reason in llmtui's words: no launcher INFO line, no command line."""
    for launcher_text in ("INFO", "$ ", "python", "--run-dir", "RANK=", "deepspeed.launcher"):
        assert launcher_text not in reason, reason


def test_orphaned_ranks_end_succeeded_or_stopped_as_they_did(runs_dir):
    stopped = _start(runs_dir, "stopped", 100000)
    wait_for(lambda: steps_reached(stopped, 2), timeout=300, what="training steps")
    # the supervisor records `running` at its next look after the first steps (a loaded machine: seconds later)
    wait_for(lambda: run_info(stopped)["status"] == "running", timeout=60, what="the supervisor to record running")
    # started last, so that it still trains when both supervisors are killed (40 steps could all be done while
    # the other run started on a loaded machine); 200 steps of the tiny model take 10-30 s
    done = _start(runs_dir, "finishes", 200)
    wait_for(lambda: steps_reached(done, 2), timeout=300, what="training steps")
    done_group, stopped_group = _kill_supervisor(done), _kill_supervisor(stopped)

    shown = llmtui("show", stopped.name, runs_dir=runs_dir)
    assert "[running]" in shown.stdout and "supervisor is gone" in shown.stdout, shown.stdout  # alive, not failed
    result = llmtui("stop", stopped.name, runs_dir=runs_dir, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    info = run_info(stopped)
    assert info["status"] == "stopped", info["reason"]
    assert list((stopped / "checkpoints").glob("checkpoint-*")) and "with a checkpoint" in info["reason"]
    _clean(info["reason"])
    assert not group_pids(stopped_group)

    wait_for(lambda: not group_pids(done_group), timeout=300, what="the orphaned ranks to finish")
    rows = {row["id"]: row for row in json.loads(llmtui("runs", "--json", runs_dir=runs_dir).stdout)}
    row = rows[done.name]
    assert row["status"] == "succeeded", row["reason"]
    assert (done / "final").is_dir() and "final model saved" in row["reason"]
    _clean(row["reason"])
    assert rundir_attempt_outcome(done) == "succeeded"


def rundir_attempt_outcome(run_dir) -> str:
    return run_info(run_dir)["attempts"][-1]["outcome"]


def test_resume_adopts_live_ranks_and_records_their_stop(runs_dir):
    run_dir = _start(runs_dir, "adopted", 100000)
    wait_for(lambda: steps_reached(run_dir, 2), timeout=300, what="training steps")
    old = run_info(run_dir)["pid"]
    group = _kill_supervisor(run_dir)

    result = llmtui("resume", run_dir.name, "--detach", runs_dir=runs_dir, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ranks still train" in result.stdout and "adopts them" in result.stdout
    info = run_info(run_dir)
    assert info["pid"] != old and psutil.pid_exists(info["pid"]) and info["status"] == "running"
    claim = json.loads((runs_dir / ".queue" / "claims" / f"{run_dir.name}.json").read_text())
    assert claim["pid"] == info["pid"]  # the devices are held again: a queued run waits for them
    again = llmtui("resume", run_dir.name, "--detach", runs_dir=runs_dir, timeout=60)
    assert again.returncode == 2 and "supervisor" in again.stderr  # now truly supervised

    steps = len(run_info(run_dir)["attempts"])
    assert llmtui("stop", run_dir.name, runs_dir=runs_dir, timeout=180).returncode == 0
    wait_for(lambda: run_info(run_dir)["status"] == "stopped", timeout=60, what="the adopter to record the stop")
    info = run_info(run_dir)
    assert "with a checkpoint" in info["reason"] and "second one followed" in info["reason"], info["reason"]
    _clean(info["reason"])
    assert len(info["attempts"]) == steps and info["attempts"][-1]["outcome"] == "stopped"
    wait_for(lambda: not group_pids(group) and not psutil.pid_exists(info["pid"]), timeout=30,
             what="no process of the run left")
