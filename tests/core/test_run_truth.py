"""The status truth: the run lock, attempts, refresh_truth, with real processes and real locks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuiapp.core.common.errors import RunError
from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.lifecycle import service
from tuiapp.core.machine import runlock
from tuiapp.core.run_folder import rundir
from tuiapp.core.store.runs import Run, RunStore

RECIPE = {"name": "truth", "method": {"kind": "lora"}}
HOLD = "import os, sys, time; fd = int(sys.argv[1]); time.sleep(60)"


def _holder(fd: int, new_session: bool = True) -> subprocess.Popen:
    """A process that inherits the run's lock, as a supervisor does."""
    return subprocess.Popen([sys.executable, "-c", HOLD, str(fd)], pass_fds=(fd,), start_new_session=new_session)


def _kill(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()


def test_lock_is_held_while_a_holder_lives_and_free_after(tmp_path):
    path = rundir.lock_path(tmp_path)
    assert runlock.held(path) is None  # no lock file: a run made before locks existed
    fd = runlock.acquire(path)
    assert fd is not None and runlock.held(path) is True
    child = _holder(fd)
    os.close(fd)  # the child now holds it alone, as a supervisor holds the launcher's lock
    try:
        assert runlock.held(path) is True
        assert runlock.acquire(path, wait_s=0.2) is None  # a second supervisor cannot start
    finally:
        _kill(child)
    assert runlock.held(path) is False
    fd = runlock.acquire(path, wait_s=0.2)
    assert fd is not None
    os.close(fd)


def test_a_brief_check_never_makes_a_start_fail(tmp_path):
    """Starts (acquire) keep succeeding while another process checks the lock (held) in a tight loop."""
    path = rundir.lock_path(tmp_path)
    os.close(runlock.acquire(path))
    checker = subprocess.Popen([sys.executable, "-c", (
        "import sys; from tuiapp.core.machine import runlock\n"
        "runlock.held(sys.argv[1]); print('checking', flush=True)\n"
        "while True: runlock.held(sys.argv[1])\n"), str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert checker.stdout.readline().strip() == "checking"
        starts, end = 0, time.monotonic() + 0.5
        while time.monotonic() < end:
            fd = runlock.acquire(path)
            assert fd is not None
            os.close(fd)
            starts += 1
        assert checker.poll() is None and starts >= 20  # every start overlapped the checking loop
    finally:
        _kill(checker)


def test_a_live_lock_keeps_the_run_active_and_a_dead_one_fails_it(tmp_path):
    store = RunStore(tmp_path)
    run = store.create(recipe_from_dict(RECIPE), lock=True)
    run.update(status="starting", attempts=rundir.new_attempt(rundir.RunRecord(), "h", False))
    child = _holder(run.lock_fd)
    run.release_lock()
    try:
        for _ in range(5):
            assert Run(run.path).load().refresh_truth().status == "starting"
    finally:
        _kill(child)
    fresh = Run(run.path).load().refresh_truth()
    assert fresh.status == "failed" and "supervisor is gone" in fresh.record.reason
    attempts = rundir.attempts_of(fresh.record)
    assert attempts[-1]["outcome"] == "failed" and attempts[-1]["ended"]


def test_a_run_whose_creator_died_before_starting_it_fails_with_that_reason(tmp_path):
    code = ("import sys; from tuiapp.core.store.runs import RunStore; from tuiapp.core.config.recipe import recipe_from_dict\n"
            "run = RunStore(sys.argv[1]).create(recipe_from_dict({'method': {'kind': 'lora'}}), lock=True)\n"
            "print(run.path)\n")
    path = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          check=True).stdout.strip()
    run = Run(Path(path)).load().refresh_truth()
    assert run.status == "failed" and "exited before starting it" in run.record.reason


# a rank as the trainer behaves: SIGTERM -> a stop checkpoint recorded, then exit
STOPPING_RANK = ("import signal, sys, time\n"
                 "from tuiapp.core.run_folder.metrics import JsonlWriter\n"
                 "def stop(*_):\n"
                 "    with JsonlWriter(sys.argv[1]) as events: events.write({'event': 'stop_checkpoint', 'step': 7})\n"
                 "    sys.exit(0)\n"
                 "signal.signal(signal.SIGTERM, stop)\n"
                 "time.sleep(60)\n")


@pytest.mark.parametrize("checkpoints", [False, True])
def test_processes_that_outlive_their_supervisor_are_not_called_failed(tmp_path, checkpoints):
    store = RunStore(tmp_path)
    run = store.create(recipe_from_dict(RECIPE), lock=True)
    code = STOPPING_RANK if checkpoints else "import time; time.sleep(60)"
    orphan = subprocess.Popen([sys.executable, "-c", code, str(run.events_path)], start_new_session=True)
    try:
        time.sleep(0.5 if checkpoints else 0)  # its SIGTERM handler is in place
        run.update(status="running", pgid=orphan.pid, started=time.time() - 5,
                   attempts=rundir.new_attempt(rundir.RunRecord(), "h", False))
        run.release_lock()  # the supervisor died; its rank (the orphan's group) lives on
        fresh = Run(run.path).load().refresh_truth()
        assert fresh.status == "running" and fresh.record.orphans is True
        assert service.stop(fresh, grace_s=5) is True  # stop ends what is left
    finally:
        if orphan.poll() is None:
            _kill(orphan)
    assert orphan.wait(5) == (0 if checkpoints else -signal.SIGTERM)
    ended = Run(run.path).load().refresh_truth()
    assert ended.status == "stopped", ended.record.reason  # a stop request, not a failure
    wanted = "stopped at step 7 with a checkpoint" if checkpoints else "before a checkpoint was saved"
    assert wanted in ended.record.reason and rundir.attempts_of(ended.record)[-1]["outcome"] == "stopped"


def test_orphans_that_finish_and_save_the_final_model_succeed(tmp_path):
    store = RunStore(tmp_path)
    run = store.create(recipe_from_dict(RECIPE), lock=True)
    finishing = ("import sys, os\nfrom tuiapp.core.run_folder.metrics import JsonlWriter\n"
                 "os.makedirs(sys.argv[2])\n"
                 "with JsonlWriter(sys.argv[1]) as events: events.write({'event': 'finished', 'step': 9})\n")
    run.update(status="running", pgid=os.getpid() + 10**7, started=time.time() - 5,
               attempts=rundir.new_attempt(rundir.RunRecord(), "h", False))
    (run.path / "stdout.log").write_text("$ env RANK=0 python -m tuiapp.trainer --run-dir x\n"
                                         "[INFO] [launch.py:351:main] Process 123 exits successfully.\n")
    run.release_lock()  # the supervisor died; its rank then finished alone
    subprocess.run([sys.executable, "-c", finishing, str(run.events_path), str(run.final_path)], check=True)
    ended = Run(run.path).load().refresh_truth()
    assert ended.status == "succeeded" and "final model saved" in ended.record.reason
    assert "INFO" not in ended.record.reason and "$ " not in ended.record.reason


def test_orphans_that_end_without_a_trace_fail_without_quoting_the_launcher(tmp_path):
    store = RunStore(tmp_path)
    run = store.create(recipe_from_dict(RECIPE), lock=True)
    run.update(status="running", pgid=os.getpid() + 10**7, started=time.time() - 5,
               attempts=rundir.new_attempt(rundir.RunRecord(), "h", False))
    (run.path / "stdout.log").write_text("$ env HF_TOKEN=*** RANK=0 python -m tuiapp.trainer --run-dir x\n"
                                         "[INFO] [real_accelerator.py:203:get_accelerator] Setting ds_accelerator\n")
    run.release_lock()
    ended = Run(run.path).load().refresh_truth()
    assert ended.status == "failed" and "supervisor is gone" in ended.record.reason
    assert "INFO" not in ended.record.reason and "RANK=0" not in ended.record.reason, ended.record.reason


def test_a_queued_run_whose_supervisor_died_never_started(tmp_path):
    store = RunStore(tmp_path)
    run = store.create(recipe_from_dict(RECIPE), lock=True)
    run.update(status="queued", pid=os.getpid() + 10**7, attempts=[])
    run.release_lock()
    ended = Run(run.path).load().refresh_truth()
    assert ended.status == "failed" and "waited in the queue" in ended.record.reason
    assert "resume" in ended.record.reason


def test_resume_of_a_live_run_is_refused(tmp_path):
    store = RunStore(tmp_path)
    run = store.create(recipe_from_dict(RECIPE), lock=True)
    run.update(status="running", attempts=rundir.new_attempt(rundir.RunRecord(), "h", False))
    child = _holder(run.lock_fd)
    run.release_lock()
    try:
        with pytest.raises(RunError, match="already running"):
            service.resume(Run(run.path).load())
        assert Run(run.path).load().status == "running"
    finally:
        _kill(child)


def test_resume_of_a_slurm_run_goes_to_slurm_not_to_a_local_supervisor(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no sbatch here
    store = RunStore(tmp_path / "runs")
    run = store.create(recipe_from_dict(RECIPE))
    run.update(status="stopped", node_mode="slurm", slurm={"nodes": 1}, attempts=rundir.new_attempt(rundir.RunRecord(), "h", False))
    with pytest.raises(Exception, match="(?i)sbatch|slurm"):
        service.resume(Run(run.path).load())
    fresh = Run(run.path).load()
    assert fresh.status == "failed" and "not resubmitted" in fresh.record.reason
    assert not (run.path / "supervisor.log").exists()


def test_attempts_sum_every_attempt_and_start_at_the_first(tmp_path):
    record = rundir.RunRecord(status="stopped", attempts=[
        {"number": 1, "started": 100.0, "ended": 160.0, "outcome": "stopped"},
        {"number": 2, "started": 500.0, "ended": 530.0, "outcome": "stopped"},
    ])
    assert rundir.duration_s(record) == 90.0 and rundir.first_started(record) == 100.0
    assert rundir.attempt_count(record) == 2
    live = rundir.RunRecord(status="running", attempts=[*record.attempts, {"number": 3, "started": 1000.0}])
    assert rundir.duration_s(live, now=1010.0) == 100.0
    legacy = rundir.RunRecord.from_json({"status": "succeeded", "started": 10.0, "ended": 25.0, "attempts": 2})
    assert rundir.duration_s(legacy) == 15.0 and rundir.attempt_count(legacy) == 2


def test_run_json_keys_are_declared(tmp_path):
    run = RunStore(tmp_path).create(recipe_from_dict(RECIPE))
    with pytest.raises(KeyError, match="not a run.json key"):
        run.update(stauts="running")
    assert rundir.record_of(json.loads(run.record_path.read_text())) is not None


def test_behind_names_the_rank_that_has_not_reported(tmp_path):
    rundir.write_phase(tmp_path, 0, "joining ranks")
    time.sleep(0.01)
    phases = rundir.read_phases(tmp_path)
    rank, phase, since = rundir.behind(phases, world=2, started=time.time() - 30)
    assert (rank, phase) == (1, "launching")
    rundir.write_phase(tmp_path, 1, "importing")
    rank, phase, _ = rundir.behind(rundir.read_phases(tmp_path), world=2, started=0)
    assert (rank, phase) == (1, "importing")


def test_shared_memory_of_a_port_is_reclaimed_and_no_other(tmp_path):
    from tuiapp.core.machine import shm

    uid = os.getuid()
    mine = [tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_41000_{r}" for r in range(2)]
    other = tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_41001_0"
    for path in (*mine, other):
        path.write_bytes(b"\0" * 1000)
    assert shm.buffers(41000, tmp_path) == mine
    assert shm.reclaim(41000, tmp_path) == 2000
    assert not any(p.exists() for p in mine) and other.exists()
    assert shm.reclaim(None, tmp_path) == 0


def test_a_killed_rank_outranks_the_peer_that_lost_it_and_old_attempts_do_not_count(tmp_path):
    from tuiapp.core.run_folder.metrics import JsonlWriter
    from tuiapp.core.store.runs import failure_cause, failure_reason

    kill = ("[ERROR] [launch.py:259:sigkill_handler] ['python', '-u', '-m', 'tuiapp.trainer', '--local_rank=1', "
            "'--run-dir', '/r'] exits with return code = -9\n")
    with JsonlWriter(tmp_path / "events.jsonl") as events:
        events.write({"event": "error", "rank": 0, "type": "RuntimeError", "message": "Connection reset by peer"})
    (tmp_path / "stdout.log").write_text("$ deepspeed ...\n" + kill)
    cause = failure_cause(tmp_path)
    assert cause["rank"] == 1 and cause["type"] == "signal 9"
    assert "then rank 0: RuntimeError: Connection reset by peer" in cause["message"]
    (tmp_path / "stdout.log").write_text("$ deepspeed ...\n" + kill + "$ deepspeed ... --resume\n")
    assert failure_reason(tmp_path) == "rank 0: RuntimeError: Connection reset by peer"


def test_a_rank_that_died_silently_is_the_cause_of_its_peers_connection_errors(tmp_path):
    from tuiapp.core.run_folder.metrics import JsonlWriter
    from tuiapp.core.store.runs import failure_reason

    rundir.write_phase(tmp_path, 0, "training")
    rundir.write_phase(tmp_path, 1, "training")
    with JsonlWriter(tmp_path / "events.jsonl") as events:
        events.write({"event": "error", "rank": 0, "type": "RuntimeError",
                      "message": "[pair.cc:537] Read error [127.0.0.1]:8424: Connection reset by peer"})
    (tmp_path / "stdout.log").write_text("$ deepspeed ...\n['--local_rank=1'] exits with return code = 1\n")
    reason = failure_reason(tmp_path)
    assert reason.startswith("rank 1: ended without an error of its own (killed by a signal")
    assert "then rank 0: RuntimeError:" in reason
