"""SLURM: the sbatch script (golden + bash -n), scheduler answers, and the status truth.

The tests marked `slurm` need a running cluster (`tests/scale/slurm-up.sh` starts a one-node
cluster on this machine); they skip when sbatch is missing or no node is up.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.lifecycle import service
from tuiapp.core.plan import slurm
from tuiapp.core.store.runs import Run, RunStore

GOLDEN = Path(__file__).parent / "golden"


def cluster_up() -> bool:
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return False
    try:
        # a live controller answers at once; a stopped one makes sinfo retry for ~9 s (each pytest start)
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(state.strip().rstrip("*") in ("idle", "mixed", "allocated") for state in out.split())


needs_cluster = pytest.mark.skipif(not cluster_up(), reason="no SLURM cluster (tests/scale/slurm-up.sh)")


# ---------------------------------------------------------------- pure


def golden_script() -> str:
    options = slurm.SlurmOptions(nodes=2, partition="gpu", gpus_per_node=8, time="04:00:00", account="proj",
                                 job_name="llmtui-demo")
    return slurm.sbatch_script(Path("/shared/runs/20260101-000000-demo-abcd"), options, python="/opt/venv/bin/python",
                               cwd=Path("/home/me/project"), env={"NCCL_DEBUG": "INFO", "HF_HOME": "/shared/hf cache"})


def test_sbatch_script_golden():
    assert golden_script() == (GOLDEN / "job-2nodes.sbatch").read_text()


def test_sbatch_script_is_valid_bash(tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(golden_script())
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_sbatch_script_without_gres_or_port():
    text = slurm.sbatch_script(Path("/r"), slurm.SlurmOptions(nodes=1, master_port=29777), python="/py", cwd=Path("/w"))
    assert "--gpus-per-node" not in text and "--partition" not in text and "MASTER_PORT=29777" in text


def test_scheduler_answers_are_parsed():
    assert slurm.parse_sacct("CANCELLED by 0|0:15|None\n") == slurm.JobState("CANCELLED", "0:15", None, "sacct")
    state = slurm.parse_scontrol("JobId=7 JobName=x JobState=TIMEOUT Reason=TimeLimit Dependency=(null) ExitCode=0:1")
    assert (state.state, state.reason, state.exit_code) == ("TIMEOUT", "TimeLimit", "0:1")
    assert slurm.parse_squeue("PENDING|Resources\n") == slurm.JobState("PENDING", None, "Resources", "squeue")
    assert slurm.parse_sacct("") is None and slurm.parse_scontrol("slurm_load_jobs error") is None
    assert slurm.parse_job_id("1234\n") == "1234" and slurm.parse_job_id("99;cluster") == "99"
    with pytest.raises(Exception, match="did not print a job id"):
        slurm.parse_job_id("sbatch: error: invalid partition")


def test_scheduler_argv_golden():
    assert slurm.sbatch_argv(Path("/r/job.sbatch")) == ["sbatch", "--parsable", "/r/job.sbatch"]
    assert slurm.scancel_argv("7") == ["scancel", "7"]
    assert slurm.scancel_argv("7", "TERM") == ["scancel", "--signal", "TERM", "7"]
    assert slurm.sacct_argv("7")[:3] == ["sacct", "-n", "-X"]


@pytest.fixture
def slurm_run(tmp_path, monkeypatch):
    run = RunStore(tmp_path).create(recipe_from_dict({"method": {"kind": "lora"}}))
    run.update(status="running", pid=999999, slurm_job="42", slurm_submitted=time.time())
    monkeypatch.setattr(slurm, "available", lambda: True)
    return run


@pytest.mark.parametrize(
    "state, status, words",
    [
        ("TIMEOUT", "failed", "time limit"),
        ("CANCELLED", "stopped", "cancelled"),
        ("OUT_OF_MEMORY", "failed", "out of memory"),
        ("NODE_FAIL", "failed", "node"),
    ],
)
def test_truth_of_an_ended_job_comes_from_the_scheduler(slurm_run, monkeypatch, state, status, words):
    monkeypatch.setattr(slurm, "job_state", lambda job, max_age_s=0: slurm.JobState(state, source="test"))
    run = Run(slurm_run.path).load().refresh_truth()
    assert run.status == status and words in run.record.reason
    assert Run(slurm_run.path).load().status == status  # persisted


def test_an_active_job_keeps_the_run_active_whatever_the_pid(slurm_run, monkeypatch):
    monkeypatch.setattr(slurm, "job_state", lambda job, max_age_s=0: slurm.JobState("PENDING", source="test"))
    run = Run(slurm_run.path).load().refresh_truth()
    assert run.status == "running" and run.record.slurm_state == "PENDING"


def test_stop_signals_then_cancels(slurm_run, monkeypatch):
    calls = []
    states = iter([slurm.JobState("RUNNING"), slurm.JobState("RUNNING"), slurm.JobState("COMPLETED"),
                   slurm.JobState("COMPLETED")])
    monkeypatch.setattr(slurm, "job_state", lambda job, max_age_s=0: next(states))
    monkeypatch.setattr(slurm, "cancel", lambda job, signal=None: calls.append((job, signal)) or True)
    assert service.stop(Run(slurm_run.path).load(), grace_s=5) is True
    assert calls == [("42", "TERM")]
    assert Run(slurm_run.path).load().status == "stopped"


# ---------------------------------------------------------------- a real cluster


def wait_state(job: str, done, timeout: float = 60) -> slurm.JobState | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = slurm.job_state(job, 0)
        if done(state):
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job} stayed {state}")


@pytest.mark.slow  # over ~1.5 s on 2 cores
@needs_cluster
def test_real_job_that_fails_marks_the_run_failed(tmp_path):
    run = RunStore(tmp_path).create(recipe_from_dict({"method": {"kind": "lora"}}))
    script = run.path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={run.path}/slurm-%j.out\nexit 3\n")
    job = slurm.submit(script)
    run.update(slurm_job=job, slurm_submitted=time.time())
    state = wait_state(job, lambda s: s is not None and not s.active)
    assert state.state == "FAILED"
    run = RunStore(tmp_path).get(run.id)
    assert run.status == "failed" and "SLURM job failed" in run.record.reason


@pytest.mark.slow  # a real SLURM job: ~4 s
@needs_cluster
def test_real_stop_goes_through_scancel(tmp_path):
    run = RunStore(tmp_path).create(recipe_from_dict({"method": {"kind": "lora"}}))
    script = run.path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={run.path}/slurm-%j.out\nsrun sleep 300\n")
    job = slurm.submit(script)
    run.update(slurm_job=job, slurm_submitted=time.time(), status="created")
    wait_state(job, lambda s: s is not None and s.state == "RUNNING")
    assert service.stop(run, grace_s=3) is True
    state = slurm.job_state(job, 0)
    assert state is None or not state.active
    assert Run(run.path).load().status == "stopped"
