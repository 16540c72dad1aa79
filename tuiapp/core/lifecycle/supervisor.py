"""The run supervisor: leads the run's session, starts DeepSpeed, records the outcome.

It holds the run's lock for its whole life (one supervisor per run folder) and is the only
writer of run.json while the run is active: start-up phases and hangs, running, stopping, the
root cause of a failure, and each attempt. It ignores SIGHUP, turns SIGTERM and SIGINT into a
graceful stop of the whole group, and after the ranks exit it kills anything left in the group,
so no rank outlives its run.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import psutil

from tuiapp.core.common.errors import UserError
from tuiapp.core.config import sweep
from tuiapp.core.machine import notify, runlock, shm
from tuiapp.core.machine.gpus import detect_gpus
from tuiapp.core.machine.procs import group_processes
from tuiapp.core.plan import cluster, generation_server, launcher, probe
from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder import rundata, rundir
from tuiapp.core.run_folder.metrics import JsonlWriter, read_jsonl, summarize
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store import queue
from tuiapp.core.store.runs import (
    SUPERVISOR_GONE,
    Run,
    cause_text,
    failure_cause,
    failure_reason,
    redact,
    root_cause,
    unsupervised_outcome,
)

POLL_S = 0.2
WATCH_S = 1.0  # phases, hangs and errors are read this often


class Supervisor:
    def __init__(self, run_dir: Path, resume: bool, grace_s: float, port: int | None = None,
                 node: cluster.NodeArgs | None = None, queued: bool = False, handed_lock: bool = False):
        self.queued = queued
        self.handed_lock = handed_lock  # started by start_supervisor, which cleared the last stop request
        self.claims = False
        self.recipe = None
        self.halted: str | None = None  # why the sweep's halving rule stopped this run
        self.halving_done = False
        self.hang_notified = False
        self.port = port
        self.node = node  # one node of a multi-node run (node mode / SLURM); None = the only one
        self.launch: cluster.Launch | None = None
        self.watch: cluster.NodeWatch | None = None
        self.fail_reason: str | None = None  # set when this supervisor ends the run itself
        self.run = Run(run_dir).load()
        self.runs_root = Path(run_dir).parent
        self.resume = resume
        self.grace_s = grace_s
        self.stop_requested_at: float | None = None
        self.stop_recorded = False
        self.child: subprocess.Popen | None = None
        self.started = time.time()
        self.world = 1
        self.startup_timeout_s = 900.0
        self.status = "starting"
        self.phase: tuple | None = None
        self.hang_key: tuple | None = None
        self.error_seen = False
        self.launcher_tearing_down = False  # the ranks finished and exited; only the launcher is left
        self._next_watch = 0.0
        self.ranks_group: int | None = None  # adopt(): the dead supervisor's group, where its ranks live on
        self.server: subprocess.Popen | None = None  # method.vllm_mode 'server': the vLLM generation server

    def _on_stop_signal(self, signum, frame) -> None:
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
            self._signal_group(signal.SIGTERM)

    def _signal_group(self, signum: int) -> None:
        me = os.getpid()
        for process in group_processes(self.ranks_group or os.getpgid(0)):
            if process.pid == me:
                continue
            try:
                process.send_signal(signum)
            except psutil.Error:
                pass

    def _rank_env(self, ranks: int) -> dict:
        return {**launcher.rank_env(ranks), "LLMTUI_RUN_DIR": str(self.run.path)}

    def execute(self) -> int:
        """The phases of one attempt: devices and micro batch, the launch plan, the start on record, the
        ranks until they exit, then what is left to free and the outcome."""
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        prepared = self._prepare()
        if prepared is None:
            return 0  # stopped or cancelled before any rank
        recipe, cuda, devices = prepared
        reserved = generation_server.server_gpu_count(recipe) if cuda and self.claims else 0
        devices, server_gpus = generation_server.split_devices(devices, reserved, cuda, taken=devices)
        plan = self.launch = cluster.build_launch(self.run.path, recipe.launch, cuda, resume=self.resume,
                                                  port=self.port, node=self.node,
                                                  gpu_ids=devices if cuda and devices else None)
        cluster.write_files(plan)
        self._record_start(plan, recipe, cuda)
        server_env, code = self._start_generation_server(recipe, server_gpus) if server_gpus else ({}, None)
        if code is None and self.stop_requested_at is None:  # a stop that came first: no rank starts
            code = self._run_ranks(plan, server_env)
        self._stop_generation_server()
        self._watch_sweep(ended=True)
        self._kill_leftovers()
        if self.claims:
            queue.release(self.runs_root, self.run.id)
        shm.reclaim(plan.port)  # DeepSpeed's CPU all-reduce buffers of this run's ranks
        self._record_outcome(code)
        return 0

    def _prepare(self):
        """(recipe, CUDA devices here, the devices taken), or None when stopped or cancelled first."""
        recipe = self.recipe = self.run.recipe()
        if self._stopped_before_start():
            return None
        cuda = launcher.cuda_device_count()
        devices = self._take_devices(recipe, cuda)
        if devices is None:
            return None  # cancelled while queued
        if probe.is_auto(recipe) and self.node is None:  # still 'auto' on a resume: it never got to train
            recipe = self.recipe = self._probe_micro_batch(recipe, cuda, devices)
            if recipe is None:
                return None  # stopped while probing
        return recipe, cuda, devices

    def _record_start(self, plan, recipe, cuda: int) -> None:
        """run.json's start of this attempt, node watching, and the launched event."""
        run, argv, ranks, gpu_ids = self.run, plan.argv, plan.ranks, plan.gpu_ids
        self.world = plan.plan.world_size if plan.plan is not None else int(plan.fields.get("world_size") or ranks)
        self.startup_timeout_s = float(recipe.launch.startup_timeout_s)
        me = psutil.Process()
        self.started = time.time()
        if plan.owner:
            rundir.clear_phases(run.path)
        self._record(
            status="starting", phase="launching", phase_since=self.started, hang=None, error=None,
            stop_requested=None, pid=me.pid, pgid=os.getpgid(0), pid_create_time=me.create_time(),
            started=self.started, ended=None, exit_code=None, reason=None, argv=redact(argv),
            host=socket.gethostname(), ranks=ranks,
            gpus=gpu_ids if gpu_ids is not None else (list(range(ranks)) if cuda else []),
            accelerator="cuda" if cuda else "cpu",
            attempts=rundir.new_attempt(self._own_record(), socket.gethostname(), self.resume, self.started),
            resumed=self.resume,
            **{"master_port": plan.port, **plan.fields},
        )
        if plan.plan is not None and plan.plan.nnodes > 1 and plan.owner:
            cluster.link_node0_log(run.path)
            self.watch = cluster.NodeWatch(run, plan.plan, recipe.launch.join_timeout_s)
        if plan.owner:
            with JsonlWriter(run.events_path) as events:
                events.write({"event": ev.LAUNCHED, "resume": self.resume, "ranks": ranks})
        plan.log_path(run.path).parent.mkdir(parents=True, exist_ok=True)

    def _run_ranks(self, plan, server_env: dict) -> int:
        """Start the launcher (or the one rank) in the run's log and wait for it: its exit code."""
        with open(plan.log_path(self.run.path), "ab") as log:
            command = " ".join(redact(plan.argv))
            log.write(f"$ {command}\n".encode())
            log.flush()
            if plan.rank_log is not None:  # the rank itself: its output goes to its own log, as a launcher's rank's
                plan.rank_log.parent.mkdir(parents=True, exist_ok=True)
            with open(plan.rank_log, "ab") if plan.rank_log is not None else nullcontext(log) as output:
                self.child = subprocess.Popen(
                    plan.argv, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**self._rank_env(plan.ranks), **plan.env, **server_env}, cwd=os.getcwd(),
                )
                code = self._wait()
            if plan.rank_log is not None and code != 0:  # the line DeepSpeed's launcher writes for a rank's exit
                log.write(f"{command} exits with return code = {code}\n".encode())
        return code

    def _start_generation_server(self, recipe, gpu_ids: list[int]) -> tuple[dict, int | None]:
        """method.vllm_mode 'server': start vLLM on its GPUs (phase 'starting vLLM server') and
        wait until it answers; (the ranks' environment, None), or ({}, 1) when it failed or a stop
        came first (self.fail_reason says which)."""
        if len(gpu_ids) < recipe.method.vllm_server_gpus:
            self.fail_reason = (f"the vLLM generation server needs {recipe.method.vllm_server_gpus} GPU(s) besides the "
                                f"ranks' and only {len(gpu_ids)} are left (method.vllm_server_gpus)")
            return {}, 1
        port, group_port = launcher.free_port(), launcher.free_port()
        url = f"http://127.0.0.1:{port}"
        argv = generation_server.server_argv(recipe, recipe.model.name, port)
        self.server = generation_server.start(self.run.path, argv, gpu_ids)
        record = {"gpus": gpu_ids, "url": url, "group_port": group_port, "pid": self.server.pid,
                  "log": generation_server.LOG_NAME, "argv": argv}
        self._record(phase="starting vLLM server", phase_since=time.time(), generation_server=record)
        with JsonlWriter(self.run.events_path) as events:
            events.write({"event": ev.GENERATION_SERVER, "gpus": gpu_ids, "url": url, "pid": self.server.pid})
        ready = generation_server.wait_ready(self.server, url, recipe.method.vllm_server_timeout_s, self.run.path,
                                             stopped=lambda: self.stop_requested_at is not None)
        if not ready.ready:
            if self.stop_requested_at is None:
                self.fail_reason = ready.reason
            return {}, 1
        self._record(phase="launching", phase_since=time.time(), generation_server={**record, "ready": time.time()})
        return generation_server.rank_env(url, group_port), None

    def _watch_generation_server(self) -> None:
        """The server died while the ranks train: the run fails, naming it; the ranks are stopped."""
        if self.server is None or self.fail_reason or self.stop_requested_at is not None:
            return
        code = self.server.poll()
        if code is not None:
            self.fail_reason = generation_server.died_reason(code, self.run.path)
            self.stop_requested_at = time.monotonic()  # the ranks get the stop and then the grace
            self.stop_recorded = True  # failing, not stopping on request
            self._signal_group(signal.SIGTERM)

    def _stop_generation_server(self) -> None:
        """The ranks are done: the server shuts down on SIGTERM (its workers with it), else SIGKILL."""
        if self.server is None or self.server.poll() is not None:
            return
        self.server.terminate()
        try:
            self.server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.server.kill()

    def adopt(self) -> int:
        """Follow the ranks of a supervisor that died (they live on in its process group): hold
        the run's lock and its queue claim again, watch phases, errors and stop requests as
        execute() does, and when the last of them exits record how the run ended, from what the
        ranks wrote (runs.unsupervised_outcome: their exit codes died with the old supervisor)."""
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        run = self.run
        record = run.record
        self.ranks_group = int(record.pgid)
        self.recipe = run.recipe()
        self.started = float(record.started or time.time())
        self.world = int(record.world_size or record.ranks or 1)
        self.startup_timeout_s = float(self.recipe.launch.startup_timeout_s)
        self.status = str(record.status)
        me = psutil.Process()
        self.claims = self.node is None and not cluster.uses_hosts(self.recipe.launch)
        if self.claims:  # the dead supervisor's claim went with its pid: the ranks still hold the devices
            with queue.decision_lock(self.runs_root):
                queue.write_claim(self.runs_root, run.id, list(record.gpus or []) if record.accelerator
                                  == "cuda" else [], me.pid, me.create_time(), pgid=self.ranks_group)
        self._record(pid=me.pid, pid_create_time=me.create_time())
        if record.stop_requested:
            self.stop_requested_at = time.monotonic()
            self.stop_recorded = True
        server_pid = (record.generation_server or {}).get("pid")
        while (left := group_processes(self.ranks_group)):
            if server_pid and _only_server_left(left, int(server_pid)):  # the ranks are done: it serves no one
                for process in left:
                    try:
                        process.terminate()
                    except psutil.Error:
                        pass
                psutil.wait_procs(left, timeout=30)
                continue
            self._record_stop_request()
            if time.monotonic() >= self._next_watch:
                self._next_watch = time.monotonic() + WATCH_S
                self._watch_ranks()
            if self.stop_requested_at is not None and time.monotonic() - self.stop_requested_at > self.grace_s:
                self._signal_group(signal.SIGKILL)
            time.sleep(POLL_S)
        if self.claims:
            queue.release(self.runs_root, run.id)
        shm.reclaim(record.master_port)
        status, reason = unsupervised_outcome(run.path, run.load().record)
        reason = reason.replace(SUPERVISOR_GONE, "the run's first supervisor died; a second one followed its ranks")
        now = time.time()
        self._record(status=status, ended=now, reason=reason, hang=None,
                     attempts=rundir.close_attempt(self._own_record(), status, reason, now))
        with JsonlWriter(run.events_path) as events:
            events.write({"event": status, "exit_code": None, "reason": reason})
        self._notify(status, status, reason)
        self._notify_sweep_end()
        rundata.summarise_run(run.path)
        return 0

    def _probe_micro_batch(self, recipe, cuda: int, devices: list[int] | None):
        """micro_batch 'auto': one probing rank first (phase 'probing micro_batch'), then the
        run's recipe.toml gets the size it chose; None when stopped meanwhile."""
        me = psutil.Process()
        self.started = time.time()
        self._record(status="starting", phase="probing micro_batch", phase_since=self.started, hang=None, error=None,
                     stop_requested=None, pid=me.pid, pgid=os.getpgid(0), pid_create_time=me.create_time(),
                     started=self.started, ended=None, exit_code=None, reason=None)
        limit = probe.default_limit(recipe, cuda)
        with probe.running(recipe, self.run.dir.recipe_toml, self.run.path,
                           gpu_id=(devices[0] if devices else 0) if cuda else None, limit_bytes=limit) as self.child:
            code = self._wait_probe()
            self._kill_leftovers()
        if self.stop_requested_at is not None:
            if self.claims:
                queue.release(self.runs_root, self.run.id)
            self._record_outcome(code)
            return None
        result = probe.finish(recipe, self.run.path, code, self.started, base_dir=Path.cwd(), limit_bytes=limit)
        if result.chosen is None:
            if self.claims:
                queue.release(self.runs_root, self.run.id)
            raise UserError(message=f"micro_batch 'auto': {result.reason}",
                            fix="see probe.json in the run folder; set train.micro_batch to a number, or lower "
                            "max_seq_len / turn on gradient_checkpointing")
        with JsonlWriter(self.run.events_path) as events:
            events.write({"event": ev.PROBED, "micro_batch": result.chosen,
                          "predicted_bytes": result.to_json()["predicted_bytes"],
                          "measured_bytes": result.to_json()["measured_bytes"]})
        return probe.fix_micro_batch(self.run.path, recipe, result.chosen)

    def _wait_probe(self) -> int:
        """The probing rank's exit code; a stop request ends it (SIGKILL after the grace)."""
        while True:
            code = self.child.poll()
            if code is not None:
                return code
            if self.stop_requested_at is not None:
                if not self.stop_recorded:
                    self.stop_recorded = True
                    self._record(status="stopping", stop_requested=time.time())
                if time.monotonic() - self.stop_requested_at > self.grace_s:
                    self._signal_group(signal.SIGKILL)
            time.sleep(POLL_S)

    def _wait(self) -> int:
        while True:
            code = self.child.poll()
            if code is not None:
                return code
            self._record_stop_request()
            if time.monotonic() >= self._next_watch:
                self._next_watch = time.monotonic() + WATCH_S
                self._watch_generation_server()
                self._watch_nodes()
                self._watch_ranks()
                self._watch_sweep()
                if self._ranks_finished_and_gone():
                    self.launcher_tearing_down = True
                    return 0  # the launcher only tears itself down now; _kill_leftovers ends it
            if self.stop_requested_at is not None and time.monotonic() - self.stop_requested_at > self.grace_s:
                self._signal_group(signal.SIGKILL)
            time.sleep(POLL_S)

    def _stopped_before_start(self) -> bool:
        """`llmtui stop` came while this process was being started: start_supervisor had cleared
        the last request, so one in run.json now is for this attempt, which then never launches."""
        if not self.handed_lock or self.node is not None and self.node.node_rank \
                or not self.run.load().record.stop_requested:
            return False  # an sbatch script's supervisor: run.json may hold the last attempt's request
        reason = "stopped before its ranks were launched"
        self._record(status="stopped", ended=time.time(), reason=reason, phase=None, hang=None)
        with JsonlWriter(self.run.events_path) as events:
            events.write({"event": ev.STOPPED, "reason": reason})
        return True

    def _take_devices(self, recipe, cuda: int) -> list[int] | None:
        """A run on this machine alone claims its devices in the queue (so queued runs see it);
        a queued run first waits for its turn. None when cancelled while waiting."""
        self.claims = self.node is None and not cluster.uses_hosts(recipe.launch)
        if not self.claims:
            return []
        reserved = generation_server.server_gpu_count(recipe) if cuda else 0
        ranks, gpu_ids = launcher.plan_ranks(recipe.launch, cuda, reserved=reserved)
        want = generation_server.devices_wanted(ranks, gpu_ids, reserved, cuda, self.queued)
        me = psutil.Process()
        slots = int((self.run.record.queue or {}).get("slots") or queue.default_slots())
        if self.queued:
            self._record(status="queued", pid=me.pid, pgid=os.getpgid(0), pid_create_time=me.create_time(),
                         host=socket.gethostname())
        while True:
            gpus = detect_gpus() if cuda else []
            devices = queue.try_start(self.runs_root, self.run.id, want=want, slots=slots, queued=self.queued,
                                      cuda_gpus=gpus, pid=me.pid, pid_create_time=me.create_time())
            if devices is not None:
                if self.queued:
                    self._record(devices=devices)
                return devices
            if self.stop_requested_at is not None:
                queue.dequeue(self.runs_root, self.run.id)
                now = time.time()
                self._record(status="stopped", ended=now, reason="cancelled while queued (it never started)")
                with JsonlWriter(self.run.events_path) as events:
                    events.write({"event": ev.STOPPED, "reason": "cancelled while queued"})
                return None
            time.sleep(queue.POLL_S)

    def _own_record(self) -> rundir.RunRecord:
        if self.node is not None and self.node.node_rank:
            return cluster.read_node(self.run.path, self.node.node_rank)
        return self.run.load().record

    def _watch_ranks(self) -> None:
        """Start-up phase (the rank furthest behind), a hang when it has not moved for
        launch.startup_timeout_s, running once every rank trains, and the first error."""
        now = time.time()
        values: dict = {}
        if not self.error_seen:
            cause = root_cause(self.run.path, self.started)
            if cause:
                self.error_seen = True
                values.update(error=cause, reason=cause_text(cause))
        if self.status == "starting":
            phases = rundir.read_phases(self.run.path, since=self.started - 1)
            rank, phase, since = rundir.behind(phases, self.world, self.started)
            first_step = any(r.get("phase") == "training" for r in phases.values())
            if phase == "training" or (first_step and self._metrics_started()):
                self.status = "running"
                values.update(status="running", phase="training", phase_since=now, hang=None)
            else:
                if (phase, since) != self.phase:
                    self.phase = (phase, since)
                    values.update(phase=phase, phase_since=since)
                stuck = now - since
                key = (rank, phase) if stuck > self.startup_timeout_s else None
                if key != self.hang_key:
                    self.hang_key = key
                    if key is not None and not self.hang_notified and (self.launch is None or self.launch.owner):
                        self.hang_notified = True
                        self._notify("hang", "starting", f"hung in '{phase}' (rank {rank})")
                    values["hang"] = None if key is None else rundir.Hang(
                        phase=phase, rank=rank, since=since,
                        message=f"hung in '{phase}': rank {rank} has made no progress for {stuck:.0f}s "
                        f"(launch.startup_timeout_s = {self.startup_timeout_s:.0f}). "
                        f"See its stack with `llmtui doctor {self.run.id}`")
        if values:
            self._record(**values)

    def _metrics_started(self) -> bool:
        try:
            return self.run.metrics_path.stat().st_mtime >= self.started
        except OSError:
            return False

    def fail(self, reason: str) -> None:
        now = time.time()
        self._record(status="failed", ended=now, reason=reason,
                     attempts=rundir.close_attempt(self._own_record(), "failed", reason, now))

    def _record_stop_request(self) -> None:
        """A stop request that arrived (signal handler) is recorded once: the run shows stopping."""
        if self.stop_requested_at is not None and not self.stop_recorded:
            self.stop_recorded = True
            self.status = "stopping"
            self._record(status="stopping", stop_requested=time.time())

    def _record(self, **values) -> None:
        """run.json for the run's only (or node 0's) supervisor; nodes/<k>.json for node k."""
        if self.node is None or self.node.node_rank == 0:
            self.run.update(**values)
        if self.node is not None:
            cluster.write_node(self.run.path, self.node.node_rank, **values)

    def _watch_nodes(self) -> None:
        """Multi-node: node 0 ends the run when a node does not join or fails; node k ends its
        part when node 0 has recorded an outcome and its ranks are still running 30s later."""
        if self.stop_requested_at is not None:
            return
        reason = None
        if self.watch is not None:
            reason = self.watch.poll()
        elif self.node is not None and self.node.node_rank:
            if cluster.node_gone_reason(self.run.path, self.node.node_rank):
                self._node0_done_at = getattr(self, "_node0_done_at", None) or time.monotonic()
                if time.monotonic() - self._node0_done_at > 30:
                    reason = cluster.node_gone_reason(self.run.path, self.node.node_rank)
        if reason:
            self.fail_reason = reason
            self._on_stop_signal(signal.SIGTERM, None)

    def _ranks_finished_and_gone(self) -> bool:
        """A local run whose ranks recorded `finished` and have all exited: DeepSpeed's launcher
        then spends seconds polling and tearing down before the run could be recorded."""
        if self.node is not None or self.launch is None or self.launch.plan is not None \
                or self.launch.rank_log is not None or cluster.uses_hosts(self.recipe.launch):
            return False
        events = read_jsonl(self.run.events_path)
        if not any(e.get("event") == ev.FINISHED and (e.get("time") or 0) >= self.started for e in events):
            return False
        phases = rundir.read_phases(self.run.path, since=self.started)
        if len(phases) < self.world:
            return False
        for record in phases.values():
            try:
                if psutil.Process(int(record["pid"])).status() != psutil.STATUS_ZOMBIE:
                    return False
            except (psutil.Error, KeyError, TypeError, ValueError):
                continue  # gone
        return True

    def _kill_leftovers(self) -> None:
        """No orphan: whatever is left of the group after the launcher exits is killed."""
        me = os.getpid()
        left = [p for p in group_processes(os.getpgid(0)) if p.pid != me]
        for process in left:
            try:
                process.kill() if self.launcher_tearing_down else process.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(left, timeout=10)
        for process in alive:
            try:
                process.kill()
            except psutil.Error:
                pass

    def _record_outcome(self, code: int | None) -> None:
        run = self.run
        summary = summarize(read_jsonl(run.metrics_path))
        finished = any(e.get("event") == ev.FINISHED for e in read_jsonl(run.events_path))
        owner = self.launch is None or self.launch.owner
        log = self.launch.log_path(run.path) if self.launch else run.log_path
        cause = failure_cause(run.path, log, self.started) if owner else None
        if self.fail_reason:
            status, reason = ("failed" if owner else "stopped"), self.fail_reason
        elif self.stop_requested_at is not None and not (code == 0 and finished):
            status, reason = "stopped", self.halted or "stopped on request"
        elif code == 0 and (finished or not owner):
            status, reason = "succeeded", self._early_stop_reason()
            if self.stop_requested_at is not None:  # the request came after the last step: it trained and saved all
                reason = "every step trained and the final model saved before the stop request took effect"
        else:
            status = "failed"
            reason = failure_reason(run.path, log, since=self.started) or f"the launcher exited with code {code}"
            known = cluster.explain_run(run.path, self.launch) if self.launch and not cause else None
            if known:
                reason = known + "\n" + reason
            if code < 0 and (self.launch is None or self.launch.rank_log is None):  # a rank's own code is explained
                reason = f"killed by signal {-code}. " + reason
        if summary.get("nonfinite_loss"):
            reason = ((reason + " ") if reason else "") + "The loss became NaN/inf."
        if self.watch is not None:
            self.watch.settle()
            self.watch.poll(status)  # the last word on every node, for run.json's `nodes`
        now = time.time()
        self._record(status=status, exit_code=code, ended=now, reason=reason, hang=None,
                     **({"error": cause} if cause and status == "failed" else {}),
                     attempts=rundir.close_attempt(self._own_record(), status, reason, now))
        if not owner:
            return
        with JsonlWriter(run.events_path) as events:
            events.write({"event": status, "exit_code": code, "reason": reason})
        self._notify(status, status, reason)
        self._notify_sweep_end()
        rundata.summarise_run(run.path)

    def _early_stop_reason(self) -> str | None:
        stops = [e for e in read_jsonl(self.run.events_path)
                 if e.get("event") == ev.EARLY_STOP and (e.get("time") or 0) >= self.started]
        if not stops:
            return None
        e = stops[-1]
        return (f"stopped early at step {e.get('step')}: the eval loss did not improve for {e.get('patience')} evals "
                f"(best {e.get('best_eval_loss'):.4f})")

    def _notify(self, event: str, status: str, reason: str | None) -> None:
        if self.recipe is not None:
            notify.send(self.recipe.notify, event, self.run.path, self.run.id, self.run.name, status, reason,
                        log=self.run.dir.notify_log)

    def _group(self) -> dict | None:
        group = self.run.record.group
        return group if isinstance(group, dict) and group.get("id") else None

    def _watch_sweep(self, ended: bool = False) -> None:
        """Successive halving: at the sweep's halving step, a run in the worse half of the sweep's
        runs that got there so far stops itself (checkpoint first). A run that `ended` before a
        watch saw its halving step still records its loss there, for the runs after it."""
        group = self._group()
        if self.halving_done or group is None or self.stop_requested_at is not None \
                or (self.status != "running" and not ended):
            return
        record = sweep.read_group(self.runs_root, group["id"]) or {}
        step = int(record.get("halving_step") or 0)
        if not step:
            self.halving_done = True
            return
        recipe = self.run.record.recipe
        mine = sweep.halving_value(read_jsonl(self.run.metrics_path), step, recipe)
        if mine is None:
            return
        self.halving_done = True
        sweep.record_halving(self.runs_root, group["id"], self.run.id, mine)
        if ended:
            return
        worse, median = sweep.in_worse_half(mine, sweep.halving_values(self.runs_root, group["id"]))
        if worse:
            self.halted = (f"stopped by the sweep's halving rule at step {step}: {sweep.halving_text(mine, recipe)} "
                           f"is in the worse half of the sweep's runs so far (median {sweep.halving_text(median, recipe)})")
            self._on_stop_signal(signal.SIGTERM, None)

    def _notify_sweep_end(self) -> None:
        """The last run of a sweep to end tells about the whole sweep, once."""
        group = self._group()
        if group is None:
            return
        record = sweep.read_group(self.runs_root, group["id"]) or {}
        runs = [Run(self.runs_root / run_id).load() for run_id in record.get("runs") or []]
        if not runs or any(r.status not in rundir.FINAL for r in runs):
            return
        marker = sweep.groups_dir(self.runs_root) / group["id"] / "notified"
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        done = sum(r.status == "succeeded" for r in runs)
        self._notify("sweep", "finished", f"sweep {record.get('name')}: {done}/{len(runs)} runs succeeded")


def _only_server_left(processes: list, server_pid: int) -> bool:
    """Every process left is the generation server or one of its workers."""
    for process in processes:
        try:
            if process.pid != server_pid and server_pid not in {p.pid for p in process.parents()}:
                return False
        except psutil.Error:
            continue
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tuiapp.core.lifecycle.supervisor")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--master-port", type=int, default=None)
    parser.add_argument("--node-rank", type=int, default=None, help="this node's rank (multi-node runs)")
    parser.add_argument("--nnodes", type=int, default=None, help="number of nodes (multi-node runs)")
    parser.add_argument("--master-addr", default=None, help="address of node 0 (multi-node runs)")
    parser.add_argument("--slurm", action="store_true", help="started by the run's sbatch script")
    parser.add_argument("--queued", action="store_true", help="wait for a turn in the device queue first")
    parser.add_argument("--adopt", action="store_true", help="follow the live ranks of a supervisor that died")
    parser.add_argument("--lock-fd", type=int, default=None, help="the run's lock, taken by the process that started this")
    parser.add_argument("--grace", type=float, default=float(os.environ.get("LLMTUI_STOP_GRACE_S", launcher.STOP_GRACE_S)))
    args = parser.parse_args(argv)
    node = None
    if args.node_rank is not None:
        node = cluster.NodeArgs(args.node_rank, args.nnodes, args.master_addr, args.slurm)
    lock = args.lock_fd
    if lock is None:  # started by an sbatch script or by hand: take the lock now
        lock = runlock.acquire(RunDir(args.run_dir).lock(node.node_rank if node else None))
        if lock is None:
            print(f"error: {args.run_dir} already has a live supervisor; not starting a second one", file=sys.stderr)
            return 2
    os.set_inheritable(lock, False)  # held by this process alone; released by the kernel when it ends
    supervisor = Supervisor(args.run_dir, args.resume, args.grace, args.master_port, node, queued=args.queued,
                            handed_lock=args.lock_fd is not None)
    try:
        return supervisor.adopt() if args.adopt else supervisor.execute()
    except UserError as exc:
        supervisor.fail(str(exc))
        return 2
    except Exception as exc:  # the outcome must be recorded whatever happens
        supervisor.fail(f"supervisor error: {exc!r}")
        raise


if __name__ == "__main__":
    sys.exit(main())
