"""The queue and sweeps with real supervisors, the real launcher and trainer (CPU slots)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import psutil
import pytest

from tests.e2e.helpers import kill_group, llmtui, run_info, spawn_llmtui, wait_for
from tuiapp.core.config import sweep
from tuiapp.core.run_folder import rundir

pytestmark = pytest.mark.slow

SHORT = ["--set", "train.max_steps=3", "--set", "train.eval_steps=0", "--set", "train.save_steps=0",
         "--set", "dataset.eval_split=0", "--set", "train.sample_prompts=[]"]
LIVE = ("starting", "running", "stopping")


class Concurrency(threading.Thread):
    """Samples how many runs of a folder are live at once."""

    def __init__(self, runs_dir):
        super().__init__(daemon=True)
        self.runs_dir = runs_dir
        self.most = 0
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            live = 0
            for path in self.runs_dir.glob("*/run.json"):
                try:
                    live += json.loads(path.read_text()).get("status") in LIVE
                except (OSError, ValueError):
                    pass
            self.most = max(self.most, live)
            time.sleep(0.1)


def _runs(runs_dir):
    return sorted((p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")),
                  key=lambda p: run_info(p)["created"])


def _all_final(runs_dir):
    return all(run_info(p)["status"] in rundir.FINAL for p in _runs(runs_dir))


def _intervals(run_dir):
    return [(a["started"], a["ended"]) for a in rundir.attempts_of(rundir.read_record(run_dir / rundir.RUN_JSON))]


def test_a_grid_with_one_slot_runs_one_at_a_time_and_a_cancelled_run_never_starts(runs_dir):
    watch = Concurrency(runs_dir)
    watch.start()
    # the command that queued the sweep may die at once (a closed terminal): the queue goes on
    parent = spawn_llmtui("sweep", "recipes/tiny-lora.toml", *SHORT, "--grid", "train.learning_rate=1e-3,3e-3",
                          "--grid", "method.rank=4,8", "--slots", "1", runs_dir=runs_dir, new_session=True)
    out, _ = parent.communicate(timeout=180)
    assert parent.returncode == 0, out
    assert "queued 4 runs" in out
    runs = _runs(runs_dir)
    assert len(runs) == 4
    group = run_info(runs[0])["group"]
    assert group["keys"] == ["train.learning_rate", "method.rank"]
    cancelled = runs[2]
    assert run_info(cancelled)["status"] == "queued"
    stopped = llmtui("stop", cancelled.name, runs_dir=runs_dir, timeout=60)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    # a queued run is cancelled, not stopped "with a checkpoint" (it has trained nothing)
    assert f"cancelling {cancelled.name}" in stopped.stdout and "checkpoint" not in stopped.stdout
    assert "cancelled while queued" in stopped.stdout
    try:
        wait_for(lambda: _all_final(runs_dir), timeout=600, interval=1, what="the sweep to end")
    finally:
        watch.done.set()
        watch.join()
    assert watch.most == 1
    assert run_info(cancelled)["status"] == "stopped" and _intervals(cancelled) == []
    assert "cancelled while queued" in run_info(cancelled)["reason"]
    done = [p for p in runs if p != cancelled]
    assert [run_info(p)["status"] for p in done] == ["succeeded"] * 3
    spans = sorted(span for p in done for span in _intervals(p))
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    listed = json.loads(llmtui("runs", "--json", "--group", group["id"], runs_dir=runs_dir, check=True).stdout)
    assert len(listed) == 4


def test_two_slots_run_two_at_once(runs_dir):
    """With two slots the second run trains and ends while the first still trains (it trains until
    stopped: no race with a machine's load, and no waiting for a long first run to end)."""
    watch = Concurrency(runs_dir)
    watch.start()
    try:
        def launch(name: str, steps: int) -> None:
            llmtui("run", "recipes/tiny-lora.toml", *SHORT, "--set", f"train.max_steps={steps}", "--set",
                   f"name={name}", "--queue", "--slots", "2", "--detach", runs_dir=runs_dir, check=True)

        launch("two0", 100000)
        first, = _runs(runs_dir)  # training before the second starts: a short second run outpaced its start-up
        wait_for(lambda: run_info(first)["status"] == "running", timeout=300, interval=0.5, what="the first run")
        launch("two1", 2)
        first, second = _runs(runs_dir)
        wait_for(lambda: run_info(second)["status"] in rundir.FINAL, timeout=600, interval=1, what="the second run")
        assert run_info(first)["status"] == "running"
        stopped = llmtui("stop", first.name, runs_dir=runs_dir, timeout=300)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    finally:
        watch.done.set()
        watch.join()
        for run_dir in _runs(runs_dir):
            kill_group(run_dir)
    assert watch.most == 2
    assert [run_info(p)["status"] for p in (first, second)] == ["stopped", "succeeded"]
    (first_start, first_end), = _intervals(first)
    (second_start, second_end), = _intervals(second)
    assert first_start < second_start and second_end < first_end


def test_a_queued_run_waits_for_a_run_outside_the_queue(runs_dir):
    llmtui("run", "recipes/tiny-lora.toml", *SHORT, "--set", "train.max_steps=8", "--set", "name=outside",
           "--detach", runs_dir=runs_dir, check=True)
    llmtui("run", "recipes/tiny-lora.toml", *SHORT, "--set", "name=queued", "--queue", "--detach",
           runs_dir=runs_dir, check=True)
    outside, queued = _runs(runs_dir)
    position = json.loads(llmtui("queue", "--json", runs_dir=runs_dir, check=True).stdout)
    assert [row["id"] for row in position] == [queued.name]
    wait_for(lambda: run_info(outside)["status"] in rundir.FINAL, timeout=300, what="the outside run to end")
    wait_for(lambda: _all_final(runs_dir), timeout=300, what="the queued run to end")
    (first_start, first_end), = _intervals(outside)
    (second_start, _), = _intervals(queued)
    assert second_start >= first_end
    assert run_info(queued)["status"] == "succeeded"


def test_successive_halving_stops_the_worse_runs(runs_dir):
    # learning rates far apart: at step 4 the tiny rates have barely moved the loss
    # 40 steps: the stop (decided within a second of step 4) lands long before the run would end
    result = llmtui("sweep", "recipes/tiny-lora.toml", *SHORT, "--set", "train.max_steps=40",
                    "--set", "sweep.halving_step=4", "--set", "train.warmup_ratio=0",
                    "--grid", "train.learning_rate=3e-2,1e-6", "--slots", "1", runs_dir=runs_dir, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    wait_for(lambda: _all_final(runs_dir), timeout=600, interval=1, what="the sweep to end")
    statuses = {run_info(p)["group"]["values"]["train.learning_rate"]: run_info(p) for p in _runs(runs_dir)}
    assert statuses[3e-2]["status"] == "succeeded"
    assert statuses[1e-6]["status"] == "stopped"
    assert "halving rule at step 4" in statuses[1e-6]["reason"]


def test_a_run_that_ends_at_the_halving_step_still_records_its_loss_there(runs_dir):
    """A run can end within a watch of its halving step (its rank exits at once); the sweep's later
    runs are still compared with it."""
    result = llmtui("sweep", "recipes/tiny-lora.toml", *SHORT, "--set", "train.max_steps=4",
                    "--set", "sweep.halving_step=4", "--grid", "train.learning_rate=3e-2,1e-3", "--slots", "1",
                    runs_dir=runs_dir, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    wait_for(lambda: _all_final(runs_dir), timeout=600, interval=1, what="the sweep to end")
    runs = _runs(runs_dir)
    group = run_info(runs[0])["group"]["id"]
    assert sorted(sweep.halving_values(runs_dir, group)) == sorted(p.name for p in runs)
    assert run_info(runs[0])["status"] == "succeeded"  # the second may be stopped if a watch sees step 4 first


def test_killing_the_process_that_follows_a_queued_run_leaves_it_queued(runs_dir):
    follower = spawn_llmtui("run", "recipes/tiny-lora.toml", *SHORT, "--set", "train.max_steps=2", "--queue",
                            runs_dir=runs_dir)
    wait_for(lambda: _runs(runs_dir) and run_info(_runs(runs_dir)[0]).get("status") in ("queued", *LIVE),
             timeout=120, what="the run")
    os.kill(follower.pid, signal.SIGKILL)
    follower.wait()
    wait_for(lambda: _all_final(runs_dir), timeout=300, what="the run to end")
    assert run_info(_runs(runs_dir)[0])["status"] == "succeeded"


class Training(threading.Thread):
    """Samples which runs of a folder have live trainer ranks (the processes, not run.json)."""

    def __init__(self, runs_dir):
        super().__init__(daemon=True)
        self.runs_dir = str(runs_dir)
        self.most = 0
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            training = set()
            for process in psutil.process_iter(["cmdline"]):
                cmd = process.info.get("cmdline") or []
                if "tuiapp.trainer" in cmd and "--run-dir" in cmd:
                    run_dir = cmd[cmd.index("--run-dir") + 1]
                    if run_dir.startswith(self.runs_dir):
                        training.add(run_dir)
            self.most = max(self.most, len(training))
            time.sleep(0.2)


def test_resume_of_queued_runs_goes_back_through_the_queue(runs_dir):
    """3 runs on 1 slot: the running one's group is killed, a waiting one's supervisor is killed, the
    third starts; resuming the first two queues them (priority and slots kept) behind it."""
    long = [*SHORT, "--set", "train.max_steps=100000"]
    watch = Training(runs_dir)
    watch.start()
    try:
        for name, priority in (("first", "0"), ("second", "0"), ("third", "0")):
            llmtui("run", "recipes/tiny-lora.toml", *long, "--set", f"name={name}", "--queue", "--slots", "1",
                   "--priority", priority, "--detach", runs_dir=runs_dir, check=True)
        first, second, third = _runs(runs_dir)
        wait_for(lambda: run_info(first)["status"] == "running", timeout=300, what="the first run to train")
        assert [run_info(p)["status"] for p in (second, third)] == ["queued", "queued"]
        os.killpg(run_info(first)["pgid"], signal.SIGKILL)  # the running job: supervisor and ranks
        os.kill(run_info(second)["pid"], signal.SIGKILL)  # a waiting job's supervisor
        wait_for(lambda: run_info(third)["status"] == "running", timeout=300, what="the third run to train")
        for run in (first, second):
            result = llmtui("resume", run.name, "--detach", runs_dir=runs_dir, timeout=60)
            assert result.returncode == 0, result.stdout + result.stderr
            assert "once the queue lets it start" in result.stdout
            assert run_info(run)["status"] == "queued" and run_info(run)["queue"]["slots"] == 1
        listed = json.loads(llmtui("queue", "--json", runs_dir=runs_dir, check=True).stdout)
        assert [row["id"] for row in listed] == [first.name, second.name]
        time.sleep(3)
        assert run_info(third)["status"] == "running" and watch.most == 1
        assert llmtui("stop", third.name, runs_dir=runs_dir, timeout=120).returncode == 0
        wait_for(lambda: run_info(first)["status"] == "running", timeout=300, what="the resumed first run to train")
        assert run_info(second)["status"] == "queued"
        for run in (second, first):
            assert llmtui("stop", run.name, runs_dir=runs_dir, timeout=120).returncode == 0
    finally:
        watch.done.set()
        watch.join()
    assert watch.most == 1
    assert run_info(second)["status"] == "stopped" and "cancelled while queued" in run_info(second)["reason"]
    assert rundir.attempts_of(rundir.read_record(first / rundir.RUN_JSON))[-1]["outcome"] == "stopped"
