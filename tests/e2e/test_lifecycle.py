"""Runs that survive, tell the truth, stop cleanly and resume exactly (real processes, CPU)."""

import json
import os
import signal

import psutil
import pytest

from tests.e2e.helpers import (
    group_pids,
    llmtui,
    metrics,
    only_run,
    rank_pids,
    run_info,
    spawn_llmtui,
    steps_reached,
    train_steps,
    wait_for,
)
from tuiapp.core.run_folder import rundir

pytestmark = pytest.mark.slow

LONG = ["--set", "train.max_steps=100000", "--set", "train.save_steps=0", "--set", "train.eval_steps=0"]


def started(run_dir, min_step=2):
    return steps_reached(run_dir, min_step)


def test_stop_saves_a_checkpoint_and_leaves_no_process(runs_dir):
    llmtui("run", "recipes/tiny-sft.toml", *LONG, "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    wait_for(lambda: started(run_dir, 3), what="training steps")
    pgid = run_info(run_dir)["pgid"]
    pids = group_pids(pgid)
    assert len(pids) >= 2  # supervisor, rank (one rank: no DeepSpeed launcher between them)
    result = llmtui("stop", run_dir.name, runs_dir=runs_dir, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    info = run_info(run_dir)
    assert info["status"] == "stopped"
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    checkpoints = list((run_dir / "checkpoints").glob("checkpoint-*"))
    assert checkpoints and (checkpoints[0] / "trainer_state.json").exists()
    step = int(checkpoints[0].name.split("-")[1])
    assert step >= 3


def test_rank_killed_marks_failed_and_leaves_no_orphan(runs_dir):
    llmtui("run", "recipes/tiny-sft.toml", *LONG, "--set", "launch.gpus=2", "--set", "launch.zero_stage=2",
           "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    wait_for(lambda: started(run_dir, 2), what="training steps")
    pgid = run_info(run_dir)["pgid"]
    ranks = rank_pids(run_dir)
    assert len(ranks) == 2
    os.kill(ranks[1], signal.SIGKILL)
    wait_for(lambda: run_info(run_dir)["status"] == "failed", timeout=90, what="failed status")
    info = run_info(run_dir)
    # the killed rank is the cause, not the peer that lost its connection afterwards
    # (DeepSpeed's launcher may report the kill as exit code -9 or, when the peer exits first, as 1)
    killed = next(r for r, record in rundir.read_phases(run_dir).items() if record["pid"] == ranks[1])
    assert info["error"]["rank"] == killed and info["error"]["type"] in ("signal 9", "killed"), info["reason"]
    assert info["reason"].startswith(f"rank {killed}: ") and "killed by" in info["reason"]
    wait_for(lambda: not group_pids(pgid), timeout=30, what="every process of the run to exit")
    shown = llmtui("show", run_dir.name, runs_dir=runs_dir)
    assert "failed" in shown.stdout


def test_supervisor_killed_is_reported_failed_on_next_look(runs_dir):
    llmtui("run", "recipes/tiny-sft.toml", *LONG, "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    wait_for(lambda: started(run_dir, 2), what="training steps")
    os.killpg(run_info(run_dir)["pgid"], signal.SIGKILL)  # like a reboot: everything gone at once
    listing = llmtui("runs", "--json", runs_dir=runs_dir)
    row = json.loads(listing.stdout)[0]
    assert row["status"] == "failed" and "supervisor is gone" in row["reason"]


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_run_survives_its_parent_cli(runs_dir, sig):
    parent = spawn_llmtui("run", "recipes/tiny-sft.toml", "--set", "train.max_steps=12", "--set",
                          "train.save_steps=0", runs_dir=runs_dir)
    wait_for(lambda: any(runs_dir.iterdir()) and started(only_run(runs_dir), 2), what="training steps")
    parent.send_signal(sig)
    parent.wait(timeout=30)
    run_dir = only_run(runs_dir)
    wait_for(lambda: run_info(run_dir)["status"] in ("failed", "stopped", "succeeded"), timeout=240, what="run to end")
    assert run_info(run_dir)["status"] == "succeeded"
    assert train_steps(run_dir)[-1] == 12


def final_loss(run_dir):
    rows = [r for r in metrics(run_dir) if r.get("split", "train") == "train"]
    return rows[-1]["loss"]


def test_resume_after_kill_matches_uninterrupted_run(runs_dir):
    common = ["--set", "train.max_steps=16", "--set", "train.save_steps=6", "--set", "train.eval_steps=0",
              "--set", "train.warmup_ratio=0.0"]
    base_dir = runs_dir / "base"
    llmtui("run", "recipes/tiny-sft.toml", *common, runs_dir=base_dir, check=True)
    reference = final_loss(only_run(base_dir))

    killed_dir = runs_dir / "killed"
    llmtui("run", "recipes/tiny-sft.toml", *common, "--set", "train.logging_steps=1", "--detach",
           runs_dir=killed_dir, check=True)
    run_dir = only_run(killed_dir)
    wait_for(lambda: (run_dir / "checkpoints" / "checkpoint-12").exists() or
             (train_steps(run_dir) and train_steps(run_dir)[-1] >= 13), interval=0.05, what="step 13")
    os.killpg(run_info(run_dir)["pgid"], signal.SIGKILL)
    wait_for(lambda: run_info(run_dir)["status"] in ("failed", "stopped", "succeeded") or not group_pids(run_info(run_dir)["pgid"]))
    assert llmtui("show", run_dir.name, runs_dir=killed_dir).returncode == 0
    assert run_info(run_dir)["status"] == "failed"
    done = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("checkpoint-*"))
    last_complete = done[-1]
    # a checkpoint half-written at the moment of a crash: newer, but incomplete
    half = run_dir / "checkpoints" / "checkpoint-15"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"\0" * 100)
    staged = run_dir / "checkpoints" / ".staging" / "checkpoint-14"
    staged.mkdir(parents=True)

    result = llmtui("resume", run_dir.name, runs_dir=killed_dir, timeout=300)
    assert result.returncode == 0, result.stdout + (run_dir / "stdout.log").read_text()[-3000:]
    assert run_info(run_dir)["status"] == "succeeded"
    steps = train_steps(run_dir)
    assert steps == list(range(1, 17)), steps  # continued, no duplicate steps
    events = [json.loads(l) for l in (run_dir / "events.jsonl").read_text().splitlines()]
    resumed_start = [e for e in events if e["event"] == "started"][-1]
    assert resumed_start["step"] == last_complete
    assert final_loss(run_dir) == pytest.approx(reference, rel=1e-3, abs=1e-3)


def test_ctrl_c_stops_cleanly_and_secrets_stay_out_of_the_run(runs_dir, monkeypatch):
    secret = "hf_supersecret_value_123"
    with monkeypatch.context() as env:  # only the run sees it; any HF_TOKEN of the caller comes back
        env.setenv("HF_TOKEN", secret)
        parent = spawn_llmtui("run", "recipes/tiny-sft.toml", *LONG, runs_dir=runs_dir)
    wait_for(lambda: any(runs_dir.iterdir()) and started(only_run(runs_dir), 2), what="training steps")
    parent.send_signal(signal.SIGINT)
    out, _ = parent.communicate(timeout=180)
    assert parent.returncode == 130, out
    run_dir = only_run(runs_dir)
    assert run_info(run_dir)["status"] == "stopped"
    assert list((run_dir / "checkpoints").glob("checkpoint-*"))
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".log", ".toml", ""):
            assert secret not in path.read_text(errors="replace"), path


def test_stalled_ranks_are_flagged(runs_dir, monkeypatch):
    monkeypatch.setenv("LLMTUI_STALL_MIN_S", "3")
    llmtui("run", "recipes/tiny-sft.toml", *LONG, "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    wait_for(lambda: started(run_dir, 4), what="training steps")
    ranks = rank_pids(run_dir)
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)  # alive but idle, like a hung collective
    try:
        def flagged():
            rows = json.loads(llmtui("runs", "--json", runs_dir=runs_dir).stdout)
            return rows[0]["stalled"]
        hint = wait_for(flagged, timeout=60, interval=1, what="stall flag")
        assert "no step for" in hint and "llmtui stop" in hint
        assert "stalled" in llmtui("show", run_dir.name, runs_dir=runs_dir).stdout
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
    assert llmtui("stop", run_dir.name, runs_dir=runs_dir, timeout=180).returncode == 0


def test_a_single_rank_runs_without_a_launcher_and_its_kill_is_the_reason(runs_dir):
    """One rank is started by the supervisor itself: no DeepSpeed launcher process, the rank's log
    where a launcher would put it, and a kill of the rank named as the cause."""
    llmtui("run", "recipes/tiny-sft.toml", *LONG, "--detach", runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    wait_for(lambda: started(run_dir, 2), what="training steps")
    info = run_info(run_dir)
    pgid = info["pgid"]
    assert info["argv"][0] == "env" and "deepspeed.launcher.launch" not in info["argv"]
    group = [psutil.Process(p) for p in group_pids(pgid)]
    assert not [p for p in group if any("deepspeed.launcher" in c for c in p.cmdline())]
    ranks = rank_pids(run_dir)
    assert len(ranks) == 1 and psutil.Process(ranks[0]).ppid() == info["pid"]  # the supervisor's own child
    (log,) = (run_dir / "ranks").glob("*_rank0.log")
    wait_for(lambda: log.stat().st_size > 0, what="the rank's log")
    os.kill(ranks[0], signal.SIGKILL)
    wait_for(lambda: run_info(run_dir)["status"] == "failed", timeout=90, what="failed status")
    info = run_info(run_dir)
    assert info["error"]["rank"] == 0 and info["error"]["type"] == "signal 9", info["reason"]
    assert info["reason"].startswith("rank 0: killed by signal 9 (SIGKILL"), info["reason"]
    assert info["exit_code"] == -9
    wait_for(lambda: not group_pids(pgid), timeout=30, what="every process of the run to exit")


def test_launcher_killed_marks_failed_and_leaves_no_orphan(runs_dir):
    llmtui("run", "recipes/tiny-sft.toml", *LONG, "--set", "launch.gpus=2", "--detach", runs_dir=runs_dir,
           check=True)
    run_dir = only_run(runs_dir)
    wait_for(lambda: started(run_dir, 2), what="training steps")
    pgid = run_info(run_dir)["pgid"]
    launchers = [p for p in psutil.process_iter(["pid", "cmdline"])
                 if any("deepspeed.launcher.launch" in c for c in (p.info["cmdline"] or []))
                 and str(run_dir) in " ".join(p.info["cmdline"] or [])]
    assert len(launchers) == 1
    ranks = rank_pids(run_dir)
    launchers[0].kill()
    wait_for(lambda: run_info(run_dir)["status"] == "failed", timeout=90, what="failed status")
    wait_for(lambda: not group_pids(pgid), timeout=30, what="every process of the run to exit")
    assert not [p for p in ranks if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
