"""The run service's truth with real processes: stop/resume cycles that never show `failed` while
a process of the run lives, a second resume refused, a rank's real error as the reason, a rank
paused before step 1 flagged as hung and diagnosed by `llmtui doctor`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.after_runs import sft_run
from tests.e2e.helpers import ROOT, group_pids, llmtui, only_run, run_info, train_steps, wait_for
from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.lifecycle import service
from tuiapp.core.machine import runlock, shm
from tuiapp.core.machine.procs import group_processes
from tuiapp.core.run_folder import rundir
from tuiapp.core.store.runs import Run, RunStore

pytestmark = pytest.mark.slow

LONG = ["--set", "train.max_steps=100000", "--set", "train.save_steps=0", "--set", "train.eval_steps=0",
        "--set", "dataset.eval_split=0"]
CYCLES = int(os.environ.get("LLMTUI_TEST_CYCLES", "8"))  # 20 before a release: LLMTUI_TEST_CYCLES=20


class TruthWatch(threading.Thread):
    """Samples run.json as the CLI and the TUI read it, beside the real processes: a `failed`
    status while the lock is held or a process of the run lives is a lie."""

    def __init__(self, run_dir):
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.lies: list[str] = []
        self.seen: set[str] = set()
        self.samples = 0
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            run = Run(self.run_dir).load().refresh_truth()
            self.seen.add(run.status)
            self.samples += 1
            if run.status == "failed":
                held = runlock.held(rundir.lock_path(self.run_dir))
                alive = group_processes(run.record.pgid)
                if held or alive:
                    self.lies.append(f"failed while lock={held} processes={[p.pid for p in alive]}: "
                                     f"{run.record.reason}")
            time.sleep(0.05)


def test_stop_resume_cycles_never_show_failed_while_the_run_lives(runs_dir):
    llmtui("run", "recipes/tiny-sft.toml", *LONG, "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    watch = TruthWatch(run_dir)
    watch.start()
    try:
        for cycle in range(CYCLES):
            # alternate: stop during start-up and stop while training; CLI and service calls
            if cycle % 2:
                wait_for(lambda: run_info(run_dir)["status"] == "running", timeout=180, interval=0.1,
                         what=f"cycle {cycle}: running")
            else:
                wait_for(lambda: run_info(run_dir).get("phase") not in (None, "launching"), timeout=120,
                         interval=0.05, what=f"cycle {cycle}: a start-up phase")
            if cycle % 4 < 2:
                result = llmtui("stop", run_dir.name, "--grace", "30", runs_dir=runs_dir, timeout=120)
                assert result.returncode == 0, result.stdout + result.stderr
            else:
                assert service.stop(Run(run_dir).load(), grace_s=30) is True
            info = run_info(run_dir)
            assert info["status"] == "stopped", info.get("reason")
            assert not group_processes(info["pgid"])
            assert not shm.buffers(info["master_port"])  # the ranks' /dev/shm buffers are freed
            if cycle % 4 in (0, 3):
                result = llmtui("resume", run_dir.name, "--detach", runs_dir=runs_dir, timeout=60)
                assert result.returncode == 0, result.stdout + result.stderr
            else:
                service.resume(Run(run_dir).load())
    finally:
        watch.done.set()
        watch.join()
    assert not watch.lies, watch.lies[:3]
    assert {"starting", "running", "stopped"} <= watch.seen
    attempts = rundir.attempts_of(rundir.read_record(run_dir / rundir.RUN_JSON))
    assert len(attempts) == CYCLES + 1
    assert [a["outcome"] for a in attempts[:-1]] == ["stopped"] * CYCLES
    shown = json.loads(llmtui("show", run_dir.name, "--json", runs_dir=runs_dir, check=True).stdout)["summary"]
    assert shown["attempts"] == CYCLES + 1
    assert shown["started"] == attempts[0]["started"]
    assert shown["duration_s"] >= sum(a["ended"] - a["started"] for a in attempts[:-1])


def test_a_stop_before_the_new_supervisor_records_itself_is_not_lost(runs_dir):
    """Starting (or resuming) writes `starting`, which the app shows, before the new supervisor
    has recorded its pid and group: a stop in that window reaches it, and no rank trains."""
    recipe = parse_recipe((ROOT / "recipes/tiny-sft.toml").read_text(encoding="utf-8"), "tiny-sft.toml")
    run = RunStore(runs_dir).create(recipe.model_copy(update={"train": recipe.train.model_copy(
        update={"max_steps": 100000})}))
    starter = threading.Thread(target=service.start_supervisor, args=(run,))
    starter.start()
    try:
        wait_for(lambda: run_info(run.path)["status"] == "starting", timeout=60, interval=0.005, what="starting")
        assert run_info(run.path).get("pid") is None  # the window: the supervisor has not recorded itself
        assert service.stop(Run(run.path).load(), grace_s=30) is True
    finally:
        starter.join()
    wait_for(lambda: run_info(run.path)["status"] == "stopped", timeout=60, what="stopped")
    assert not runlock.held(rundir.lock_path(run.path)) and not (run.path / rundir.METRICS_JSONL).exists()
    events = [e["event"] for e in Run(run.path).events()]
    assert events[-1] == "stopped", events[-5:]
    time.sleep(2)
    assert run_info(run.path)["status"] == "stopped"  # nothing started behind the stop


def test_a_supervisor_an_sbatch_script_starts_ignores_the_last_attempts_stop_request(runs_dir):
    """An sbatch script starts the supervisor itself (no lock handed over, nothing cleared): the
    request a stopped attempt left in run.json is not a stop of this one; it trains."""
    recipe = parse_recipe((ROOT / "recipes/tiny-sft.toml").read_text(encoding="utf-8"), "tiny-sft.toml")
    run = RunStore(runs_dir).create(recipe.model_copy(update={"train": recipe.train.model_copy(
        update={"max_steps": 2, "save_steps": 0, "eval_steps": 0})}))
    run.update(stop_requested=time.time() - 60)
    done = subprocess.run([sys.executable, "-m", "tuiapp.core.lifecycle.supervisor", str(run.path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          start_new_session=True)  # as srun starts it: the group it cleans up is its own
    assert done.returncode == 0, done.stdout + done.stderr
    info = run_info(run.path)
    assert info["status"] == "succeeded", info.get("reason")
    assert train_steps(run.path) == [1, 2]


def test_second_resume_of_a_live_run_is_refused(runs_dir):
    llmtui("run", "recipes/tiny-sft.toml", *LONG, "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    pid = run_info(run_dir)["pid"]
    for _ in range(2):  # while starting, then while running
        result = llmtui("resume", run_dir.name, "--detach", runs_dir=runs_dir, timeout=60)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "already running" in result.stderr and "llmtui stop" in result.stderr
        assert run_info(run_dir)["pid"] == pid and run_info(run_dir)["status"] in ("starting", "running")
        wait_for(lambda: run_info(run_dir)["status"] == "running", timeout=180, what="running")
    assert len(rundir.attempts_of(rundir.read_record(run_dir / rundir.RUN_JSON))) == 1


def _broken_model(tmp_path):
    """A model folder the checks before launch accept (config, tokenizer, well-formed weights whose embedding
    matches config.json) with one layer's weight a row too tall: the rank's from_pretrained refuses it."""
    import torch
    from safetensors.torch import load_file, save_file

    from tuiapp.trainer.models.tiny import ensure_tiny_model

    folder = tmp_path / "broken-model"
    shutil.copytree(ensure_tiny_model(), folder)
    weights = next(folder.glob("*.safetensors"))
    tensors = load_file(weights)
    name = next(n for n in tensors if n.endswith("mlp.down_proj.weight"))
    rows, columns = tensors[name].shape
    tensors[name] = torch.zeros(rows + 1, columns, dtype=tensors[name].dtype)
    save_file(tensors, weights, metadata={"format": "pt"})
    return folder


def test_a_rank_error_is_the_reason_everywhere(runs_dir, tmp_path_factory):
    model = _broken_model(tmp_path_factory.mktemp("models"))
    result = llmtui("run", "recipes/tiny-sft.toml", "--set", f"model.name={model}", "--set", "launch.gpus=2",
                    runs_dir=runs_dir, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    run_dir = only_run(runs_dir)
    info = run_info(run_dir)
    assert info["status"] == "failed"
    error = info["error"]
    assert error["rank"] in (0, 1) and error["type"] and error["message"]
    assert error["log"] and error["log"].endswith(f"_rank{error['rank']}.log")
    assert "exited with code" not in info["reason"]  # the error, not the launcher's line
    assert f"{error['type']}: " in info["reason"] and error["message"][:40] in info["reason"]
    shown = json.loads(llmtui("show", run_dir.name, "--json", runs_dir=runs_dir, check=True).stdout)
    assert shown["summary"]["reason"] == info["reason"] and shown["summary"]["error"] == error
    listed = json.loads(llmtui("runs", "--json", runs_dir=runs_dir, check=True).stdout)
    assert listed[0]["reason"] == info["reason"]
    text = llmtui("runs", runs_dir=runs_dir, check=True).stdout
    assert f"{error['type']}: " in text
    # the reason was on record soon after the rank wrote its error: within 5 s
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    raised = min(e["time"] for e in events if e.get("event") == "error")
    recorded = next(e["time"] for e in events if e.get("event") == "failed")
    assert recorded - raised < 30  # generous here; bench measures the latency


def test_a_rank_paused_before_step_one_is_flagged_and_diagnosed(runs_dir, monkeypatch):
    env_timeout = "12"
    # a rank held in start-up (rank 0 may be waiting in C code to join rank 1) ends only by SIGKILL after
    # the supervisor's grace (60 s by default): a short one ends the stop at the end soon after the request
    monkeypatch.setenv("LLMTUI_STOP_GRACE_S", "2")
    llmtui("run", "recipes/tiny-sft.toml", *LONG, "--set", "launch.gpus=2", "--set",
           f"launch.startup_timeout_s={env_timeout}", "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)

    def rank1():
        record = rundir.read_phases(run_dir).get(1)
        return record if record and psutil.pid_exists(record["pid"]) else None

    record = wait_for(rank1, timeout=120, interval=0.02, what="rank 1 reports a phase")
    os.kill(record["pid"], signal.SIGSTOP)
    try:
        paused_in = rundir.read_phases(run_dir)[1]["phase"]
        info = wait_for(lambda: (run_info(run_dir).get("hang") and run_info(run_dir)), timeout=90, interval=0.5,
                        what="the hang flag")
        assert info["status"] == "starting"
        assert info["hang"]["rank"] == 1 and info["hang"]["phase"] == paused_in
        assert "llmtui doctor" in info["hang"]["message"]
        shown = json.loads(llmtui("show", run_dir.name, "--json", runs_dir=runs_dir, check=True).stdout)
        assert "hung in" in shown["summary"]["stalled"]
        report = llmtui("doctor", run_dir.name, runs_dir=runs_dir, timeout=60)
        assert report.returncode == 0, report.stderr
        assert f"behind: rank 1 (pid {record['pid']})" in report.stdout and "stopped" in report.stdout
        rank0 = report.stdout.split("\nrank 0 ")[1].split("\nrank 1 ")[0]
        assert "Thread" in rank0 or "Current thread" in rank0  # rank 0's Python stack
    finally:
        os.kill(record["pid"], signal.SIGCONT)
    assert llmtui("stop", run_dir.name, "--grace", "2", runs_dir=runs_dir, timeout=120).returncode == 0
    assert not group_processes(run_info(run_dir)["pgid"])


def test_doctor_of_a_run_with_no_live_rank_is_a_clear_error(runs_dir, tmp_path_factory):
    finished = sft_run(tmp_path_factory)  # the session's finished tiny SFT run (tests/after_runs.py)
    shutil.copytree(finished, runs_dir / finished.name)
    run_dir = only_run(runs_dir)
    report = llmtui("doctor", run_dir.name, runs_dir=runs_dir)
    assert report.returncode == 2 and "no live rank" in report.stderr and "Traceback" not in report.stderr


def test_supervisor_started_by_hand_refuses_a_live_run(runs_dir):
    llmtui("run", "recipes/tiny-sft.toml", *LONG, "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    second = subprocess.run([sys.executable, "-m", "tuiapp.core.lifecycle.supervisor", str(run_dir), "--resume"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode == 2 and "already has a live supervisor" in second.stderr
    assert run_info(run_dir)["status"] in ("starting", "running")


def test_a_stop_that_lands_after_the_last_step_still_says_succeeded(runs_dir):
    """A stop request that reaches the supervisor once the ranks trained every step and saved the
    final model (a sweep's halving watch can ask that late) must not turn the run into `stopped`.
    The supervisor is paused while the rank finishes, then gets SIGTERM and resumes: the request
    is seen before the rank's exit, as when it lands during the final save."""
    llmtui("run", "recipes/tiny-sft.toml", "--set", "train.max_steps=40", "--set", "train.save_steps=0",
           "--set", "train.eval_steps=0", "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    wait_for(lambda: run_info(run_dir)["status"] == "running", timeout=180, interval=0.1, what="running")
    info = run_info(run_dir)
    supervisor = info["pid"]
    os.kill(supervisor, signal.SIGSTOP)
    try:
        wait_for(lambda: any(json.loads(line).get("event") == "finished"
                             for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()),
                 timeout=180, interval=0.1, what="the trainer's finished event")
        wait_for(lambda: group_pids(info["pgid"]) == [supervisor], timeout=60, interval=0.1,
                 what="the rank's exit")
        os.kill(supervisor, signal.SIGTERM)
    finally:
        os.kill(supervisor, signal.SIGCONT)
    wait_for(lambda: run_info(run_dir)["status"] not in ("running", "stopping"), timeout=60, interval=0.1,
             what="the outcome")
    info = run_info(run_dir)
    assert info["status"] == "succeeded", info.get("reason")
    assert "before the stop request took effect" in info["reason"]
    assert (run_dir / "final").is_dir()
    assert train_steps(run_dir)[-1] == 40
    wait_for(lambda: not group_pids(info["pgid"]), timeout=30, what="the supervisor's exit after its record")
