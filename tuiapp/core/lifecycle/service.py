"""The run service: check → plan → launch (or join) → stop → resume, one path for the CLI and the TUI.

Each way of running is a backend chosen by what the run recorded (`node_mode`): a local
supervisor (one machine, or DeepSpeed's own multi-host runner from the head node), node mode
(one supervisor per node, started by hand on each) and SLURM (an sbatch script starts them).
The CLI prints what these return and the TUI shows it; neither decides anything itself.
Progress lines go through `say`, so the same flow prints in a terminal or posts in the app.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

from tuiapp.core.common.errors import RunError, UserError
from tuiapp.core.common.findings import Finding, format_findings, has_errors
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.machine import runlock, shm
from tuiapp.core.machine.procs import group_processes, process_alive
from tuiapp.core.plan import cluster, slurm
from tuiapp.core.plan.launcher import (
    STOP_GRACE_S,
    cuda_device_count,
    master_port_of,
    plan_ranks,
    signal_group,
    supervisor_argv,
    world_note,
)
from tuiapp.core.prelaunch import door
from tuiapp.core.run_folder.rundir import ACTIVE, RunDir
from tuiapp.core.store import environment, queue
from tuiapp.core.store.runs import Run, RunStore

Say = Callable[[str], None]
SLURM_FLAGS = ("partition", "nodes", "gpus_per_node", "time", "account")
SUPERVISOR_RECORD_S = 20.0  # how long a stop waits for a supervisor being started to record its pid


def _quiet(_: str) -> None:
    pass


class LaunchRefused(UserError):
    """Pre-flight found errors; `findings` holds them, `str()` is what `llmtui run` prints."""

    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__(message=format_findings(findings))

    def __str__(self) -> str:
        return self.message


@dataclass
class LaunchOptions:
    """How to launch, beyond the recipe: the CLI's flags, or nothing (the TUI)."""

    recipe_file: str | None = None
    overrides: list[str] = field(default_factory=list)  # --set, repeated in the join command
    runs_dir: str | None = None
    node_rank: int | None = None
    nnodes: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    run_id: str | None = None
    slurm: bool = False
    partition: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    time: str | None = None
    account: str | None = None
    queue: bool = False  # wait in the device queue (tuiapp.core.store.queue) instead of starting now
    priority: int = 0
    slots: int | None = None  # CPU slots of this machine, as this run sees them (default LLMTUI_QUEUE_SLOTS or 1)
    group: dict | None = None  # a sweep's run: {id, name, index, keys, values}
    oversubscribe: bool = False  # launch even when the memory need or the CPU ranks are far beyond this machine


@dataclass
class LaunchPlan:
    """What a launch will do, before anything is created: shown by --dry-run and the form."""

    mode: str  # local | nodes | slurm
    recipe: Recipe  # resolved ('run:NAME' replaced by that run's final folder)
    model_ref: str  # the model as the user wrote it
    options: LaunchOptions
    findings: list[Finding] = field(default_factory=list)  # warnings and notes (no errors)
    launch: cluster.Launch | None = None  # local and nodes: the supervisor's command
    slurm_options: slurm.SlurmOptions | None = None

    def preview(self, runs_root: Path) -> list[str]:
        """The lines a dry run prints."""
        run_id = self.options.run_id or "<run-id>"
        if self.mode == "slurm":
            env = cluster.passthrough_env()
            return slurm.sbatch_script(Path(runs_root).resolve() / run_id, self.slurm_options, env=env).splitlines()
        argv = " ".join(self.launch.argv)
        if self.mode == "nodes":
            join = cluster.join_command(self.options.recipe_file or "RECIPE", run_id, self.launch.plan,
                                        self.options.runs_dir, self.options.overrides)
            return [f"would run on node 0: {argv}", f"then on every other node: {join}"]
        note = world_note(self.launch.argv)
        return [f"would run: {argv}", *([note] if note else [])]


# ---------------------------------------------------------------- check and plan


def check_options(options: LaunchOptions) -> None:
    """Flags that do not go together, before anything else."""
    if not options.slurm:
        given = [f"--{f.replace('_', '-')}" for f in SLURM_FLAGS if getattr(options, f) is not None]
        if given:
            raise UserError(message=f"{', '.join(given)} only apply to SLURM runs", fix="add --slurm")
    elif options.node_rank is not None:
        raise UserError(message="--slurm and --node-rank do not go together",
                        fix="--slurm starts every node itself; use --node-rank only when launching by hand")
    if options.node_rank is None:
        given = [f for f, v in (("--nnodes", options.nnodes), ("--master-addr", options.master_addr),
                                ("--run-id", options.run_id)) if v is not None]
        if given:
            raise UserError(message=f"{', '.join(given)} need --node-rank K", fix="add --node-rank 0 on the master node")
    elif options.node_rank < 0:
        raise UserError(message="--node-rank must be 0 or more", fix="0 on the master node, 1..N-1 on the others")


def _refuse_on_errors(findings: list[Finding]) -> list[Finding]:
    if has_errors(findings):
        raise LaunchRefused(findings)
    return findings


def plan_launch(recipe: Recipe, store: RunStore, base_dir: Path, options: LaunchOptions | None = None) -> LaunchPlan:
    """Every check, then the plan of a new run (node 0's, for node mode). Creates nothing;
    raises LaunchRefused or another UserError when the launch must not happen."""
    options = options or LaunchOptions()
    check_options(options)
    if options.queue and options.slurm:
        raise UserError(message="--queue and --slurm do not go together", fix="SLURM queues jobs itself: leave out --queue")
    if options.node_rank:
        raise UserError(message=f"node {options.node_rank} joins a run; it does not plan one",
                        fix="use join() (`llmtui run RECIPE --node-rank K --run-id ID`)")
    resolved, model_ref = door.resolve_recipe(recipe, store)
    if options.slurm:
        return _plan_slurm(resolved, model_ref, store, base_dir, options)
    launch = resolved.launch
    cuda = cuda_device_count()
    if options.queue and (options.node_rank is not None or cluster.uses_hosts(launch)):
        raise UserError(message="--queue waits for this machine's devices; it does not apply to a run that spans "
                        "nodes", fix="leave out --queue (or launch.hosts), or use --slurm: SLURM queues jobs itself")
    ask = None  # what the launch asks of hosts and ports
    if options.node_rank == 0:
        ask = door.ClusterAsk(node_rank=0, master_port=cluster.resolve_port(launch, options.master_port))
    elif cluster.is_scaled(launch) or options.master_port:
        ask = door.ClusterAsk(master_port=options.master_port)
    findings = _refuse_on_errors(door.all_findings(resolved, store, base_dir, cluster=ask,
                                                   oversubscribe=options.oversubscribe))
    if options.node_rank == 0:
        port = ask.master_port
        nnodes = options.nnodes or launch.nodes or (len(cluster.hosts_of(launch, base_dir))
                                                    if cluster.uses_hosts(launch) else 0)
        node = cluster.NodeArgs(0, nnodes or None, options.master_addr)
        run_dir = Path(store.root) / (options.run_id or "<run-id>")
        built = cluster.build_launch(run_dir, launch, cuda, port=port, node=node, base_dir=base_dir)
        return LaunchPlan("nodes", resolved, model_ref, options, findings, built)
    port = options.master_port or (cluster.resolve_port(launch) if cluster.uses_hosts(launch) else None)
    built = cluster.build_launch(Path(store.root) / "<run-id>", launch, cuda, port=port, base_dir=base_dir)
    return LaunchPlan("local", resolved, model_ref, options, findings, built)


def _plan_slurm(recipe: Recipe, model_ref: str, store: RunStore, base_dir: Path, options: LaunchOptions) -> LaunchPlan:
    recipe = recipe.model_copy(deep=True)
    nodes = options.nodes or recipe.launch.nodes or 1
    recipe.launch.nodes = nodes  # frozen: every node's supervisor reads the same plan
    if options.gpus_per_node:
        recipe.launch.gpus_per_node = options.gpus_per_node
    if cluster.uses_hosts(recipe.launch):
        raise UserError(message="launch.hosts is for runs without a scheduler", key="launch.hosts",
                        fix="remove launch.hosts: SLURM chooses the nodes (use --nodes and --partition)")
    findings = _refuse_on_errors(door.recipe_findings(recipe, store, base_dir))
    slurm_options = slurm.SlurmOptions(
        nodes=nodes, partition=options.partition, gpus_per_node=options.gpus_per_node, time=options.time,
        account=options.account, job_name=f"llmtui-{recipe.name}",
        master_port=options.master_port or recipe.launch.master_port,
    )
    return LaunchPlan("slurm", recipe, model_ref, options, findings, slurm_options=slurm_options)


# ---------------------------------------------------------------- launch


def launch(plan: LaunchPlan, store: RunStore, say: Say = _quiet) -> Run:
    """Create the run folder and start it as planned; returns the run (status starting, or
    created for a SLURM job waiting in the queue)."""
    options = plan.options
    run = store.create(plan.recipe, recipe_file=options.recipe_file, run_id=options.run_id, model_ref=plan.model_ref,
                       lock=plan.mode != "slurm")
    try:
        if plan.mode == "nodes":  # first: the other nodes wait for these before they join
            node_plan = plan.launch.plan
            run.update(node_mode="nodes", nnodes=node_plan.nnodes, master_addr=node_plan.master_addr,
                       master_port=plan.launch.port, strategy=plan.recipe.launch.strategy,
                       world_size=node_plan.world_size, nodes=node_plan.nodes())
        record_provenance(run, plan, say)
        if plan.mode == "slurm":
            return _submit_slurm(run, plan, say)
        say(f"run {run.id} in {run.path}")
        if plan.mode == "nodes":
            say(f"node 0 of {node_plan.nnodes}, world size {node_plan.world_size}")
            say("start the other nodes with: " + cluster.join_command(
                options.recipe_file or "RECIPE", run.id, node_plan, options.runs_dir, options.overrides))
            node = cluster.NodeArgs(0, node_plan.nnodes, node_plan.master_addr)
            start_supervisor(run, port=plan.launch.port, node=node)
        else:
            if options.queue:
                _enqueue(run, plan, store)
            if options.group:
                run.update(group=options.group)
            start_supervisor(run, port=None if options.queue and not plan.recipe.launch.master_port else plan.launch.port,
                             queued=options.queue)
        run.load()
        if run.record.argv:
            say("command: " + " ".join(run.record.argv))
            note = world_note(run.record.argv)
            if note:
                say(note)
        return run
    finally:
        run.release_lock()


def record_provenance(run: Run, plan: LaunchPlan, say: Say = _quiet) -> None:
    """provenance.json: versions, machine, data fingerprint, seed and recipe (never blocks a launch)."""
    try:
        environment.write(run.path, plan.recipe, plan.options.overrides, Path.cwd())
    except (OSError, ValueError, TypeError) as exc:
        say(f"note: provenance.json not written: {exc}")


def _enqueue(run: Run, plan: LaunchPlan, store: RunStore) -> None:
    options = plan.options
    ranks, gpu_ids = plan_ranks(plan.recipe.launch, cuda_device_count())
    slots = options.slots or queue.default_slots()
    entry = queue.enqueue(store.root, run.id, priority=options.priority, slots=slots,
                          devices=gpu_ids if gpu_ids is not None else ranks)
    run.update(queue={"priority": options.priority, "slots": slots, "enqueued": entry.enqueued,
                      "devices": entry.devices})


def start_supervisor(run: Run, resume: bool = False, port: int | None = None,
                     node: cluster.NodeArgs | None = None, wait_s: float = 10.0, queued: bool = False,
                     adopt: bool = False) -> int:
    """Start the run's (or one node's) supervisor in its own session, handing it the run's lock,
    so no second supervisor can start between this check and its life. Returns its pid."""
    node_rank = node.node_rank if node else None
    fd = run.lock_fd
    if fd is None:
        fd = runlock.acquire(run.dir.lock(node_rank))
        if fd is None:
            raise RunError(message=f"{run.id} already has a live supervisor" + (f" for node {node_rank}" if node_rank
                                                                                 else ""),
                           fix=f"follow it with `llmtui show {run.id}`, or stop it first with `llmtui stop {run.id}`")
    argv = supervisor_argv(run.path, resume=resume, port=port) + ["--lock-fd", str(fd)]
    if node is not None:
        argv += ["--node-rank", str(node.node_rank), "--nnodes", str(node.nnodes), "--master-addr", node.master_addr]
    if queued:
        argv.append("--queued")
    if adopt:
        argv.append("--adopt")  # the ranks of a dead supervisor live on: follow them, start nothing
    owner = not node_rank
    try:
        if owner and not adopt:
            run.update(status="queued" if queued else "starting", phase=None if queued else "launching",
                       phase_since=time.time(), reason=None, error=None, hang=None, ended=None, exit_code=None,
                       stop_requested=None)
        log_path = run.dir.supervisor_log if node is None else run.dir.node_supervisor_log(node_rank)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL, stdout=log,
                                       stderr=subprocess.STDOUT, pass_fds=(fd,))
    finally:
        os.close(fd)
        if fd == run.lock_fd:
            run.lock_fd = None
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and process.poll() is None:
        record = run.load().record if owner else cluster.read_node(run.path, node_rank)
        if record.pid == process.pid:
            break
        time.sleep(0.05)
    return process.pid


def _submit_slurm(run: Run, plan: LaunchPlan, say: Say) -> Run:
    script = run.path / slurm.SCRIPT_NAME
    script.write_text(slurm.sbatch_script(run.path.resolve(), plan.slurm_options, env=cluster.passthrough_env()),
                      encoding="utf-8")
    script.chmod(0o755)
    run.update(node_mode="slurm", nnodes=plan.slurm_options.nodes, strategy=plan.recipe.launch.strategy,
               slurm={k: v for k, v in vars(plan.slurm_options).items() if v not in (None, "")})
    _submit(run, script, "not submitted")
    say(f"run {run.id} in {run.path}")
    say(f"submitted SLURM job {run.record.slurm_job}: {shlex.join(slurm.sbatch_argv(script))}")
    return run


def _submit(run: Run, script: Path, failed: str) -> None:
    try:
        job = slurm.submit(script)
    except UserError as exc:
        run.update(status="failed", ended=time.time(), reason=f"{failed}: {exc.message}")
        raise
    run.update(slurm_job=job, slurm_submitted=time.time())
    run.load()


# ---------------------------------------------------------------- join (node mode, node K > 0)


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = []
    for key in sorted(set(a) | set(b)):
        left, right = a.get(key), b.get(key)
        if isinstance(left, dict) and isinstance(right, dict):
            keys += _differences(left, right, f"{prefix}{key}.")
        elif left != right:
            keys.append(f"{prefix}{key}")
    return keys


def _node_zero_ready(path: Path) -> bool:
    """Node 0 has created the run and recorded its nodes and port (run.json exists from the moment the
    folder is made, before them: a node reading it then would take no port and no node count), or
    the run has gone past `created`, when the checks after this say what is wrong with it."""
    folder = RunDir(path)
    if not folder.record.is_file() or not folder.recipe_toml.is_file():
        return False
    run = Run(path).load()
    return run.record.node_mode == "nodes" or run.status != "created"


def _wait_for_run(store: RunStore, run_id: str, timeout_s: float, say: Say) -> Run:
    path = Path(store.root) / run_id
    deadline = time.monotonic() + timeout_s
    said = False
    while not _node_zero_ready(path):
        if time.monotonic() > deadline:
            raise RunError(message=f"run '{run_id}' did not appear in {store.root} within {timeout_s:.0f}s",
                           fix="start node 0 first with the same --run-id, and put the runs folder on "
                           "storage every node shares (--runs-dir or LLMTUI_RUNS_DIR)")
        if not said:
            say(f"waiting for node 0 to create run {run_id} in {store.root}...")
            said = True
        time.sleep(0.5)
    return Run(path).load()


@dataclass
class Join:
    """Node K's part of a run node 0 started: checked, ready to start (or to print)."""

    run: Run
    node: cluster.NodeArgs
    port: int
    recipe: Recipe

    def preview(self) -> list[str]:
        built = cluster.build_launch(self.run.path, self.recipe.launch, cuda_device_count(), port=self.port,
                                     node=self.node)
        return [f"would run on node {self.node.node_rank}: " + " ".join(built.argv)]


def plan_join(recipe: Recipe, store: RunStore, base_dir: Path, options: LaunchOptions, say: Say = _quiet) -> Join:
    """Checks for node K joining node 0's run (same recipe, world size, port); creates nothing."""
    check_options(options)
    k = options.node_rank
    if not options.run_id:
        raise UserError(message=f"node {k} must join node 0's run", fix="pass --run-id ID (node 0 prints it)")
    run = _wait_for_run(store, options.run_id, recipe.launch.join_timeout_s, say)
    frozen = run.recipe()
    different = _differences(frozen.model_dump(mode="json"), recipe.model_dump(mode="json"))
    if different:
        raise UserError(message=f"this recipe differs from the one node 0 started in {', '.join(different[:6])}",
                        fix="run the same recipe with the same --set overrides on every node")
    nnodes = int(run.record.nnodes or 0)
    if options.nnodes and nnodes and options.nnodes != nnodes:
        raise UserError(message=f"mismatched world size: --nnodes {options.nnodes} here, but node 0 started "
                        f"run {run.id} with {nnodes} nodes", fix=f"pass --nnodes {nnodes} (or leave it out)")
    nnodes = nnodes or options.nnodes
    if not nnodes or k >= nnodes:
        raise UserError(message=f"node rank {k} is outside the {nnodes} nodes of run {run.id}",
                        fix=f"use --node-rank 1..{nnodes - 1}")
    master_addr = options.master_addr or run.record.master_addr
    port = cluster.resolve_port(recipe.launch, options.master_port)
    if run.record.master_port and int(run.record.master_port) != port and options.master_port:
        raise UserError(message=f"--master-port {port} here, but node 0 listens on {run.record.master_port}",
                        fix="use the same --master-port on every node (or leave it out)")
    port = int(run.record.master_port or port)
    record = cluster.read_node(run.path, k)
    if record.status in ACTIVE and record.host == socket.gethostname() and \
            process_alive(record.pid, record.pid_create_time):
        raise UserError(message=f"node rank {k} already joined run {run.id} (pid {record.pid})",
                        fix="give each node a distinct --node-rank")
    if run.status not in ACTIVE:
        raise UserError(message=f"run {run.id} is {run.status}; it cannot be joined",
                        fix="start a new run with a new --run-id")
    _refuse_on_errors(door.join_findings(frozen, store, base_dir, node_rank=k, master_addr=master_addr))
    return Join(run, cluster.NodeArgs(k, nnodes, master_addr), port, frozen)


def join(plan: Join, say: Say = _quiet) -> Run:
    k, run = plan.node.node_rank, plan.run
    say(f"joining run {run.id} as node {k} of {plan.node.nnodes} (master {plan.node.master_addr}:{plan.port})")
    start_supervisor(run, port=plan.port, node=plan.node, wait_s=15.0)
    return run


# ---------------------------------------------------------------- stop


def stop(run: Run, grace_s: float = STOP_GRACE_S, wait: bool = True) -> bool:
    """Graceful stop: SIGTERM to the run's group (every rank agrees to stop at the next step and
    checkpoints); the supervisor SIGKILLs what is left after the grace period, or this does when
    the supervisor is gone. True when no process of the run is left."""
    run.load()
    if run.record.slurm_job:
        return slurm.stop(run, grace_s, wait)  # SIGTERM to the job's steps, scancel after the grace
    host = run.record.host
    if run.status in ACTIVE and host not in (None, socket.gethostname()):
        raise RunError(message=f"{run.id} is supervised on {host}", fix=f"run `llmtui stop {run.id}` on {host}")
    _reach_starting_supervisor(run)
    pgid = run.record.pgid
    if not pgid:
        run.refresh_truth()
        return True
    supervisor_up = run.supervisor_alive()
    if not supervisor_up and run.status in ACTIVE and group_processes(pgid):
        run.update(status="stopping", stop_requested=time.time())  # orphaned ranks: the outcome says stopped
    signal_group(pgid)
    _signal_adopter(run, pgid)
    if not wait:
        return False
    deadline = time.monotonic() + grace_s + 15.0
    while time.monotonic() < deadline:
        if not group_processes(pgid):
            run.refresh_truth()
            return True
        if not supervisor_up and time.monotonic() > deadline - 15.0:
            break
        time.sleep(0.2)
    for process in group_processes(pgid):
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(group_processes(pgid), timeout=5)
    if not supervisor_up:  # the supervisor would have freed its ranks' shared memory
        shm.reclaim(run.record.master_port or master_port_of(run.record.argv))
    if run.load().status in ACTIVE and not run.supervisor_alive():
        run.update(status="stopped", ended=time.time(), reason="stopped; processes killed after the grace period")
    return not group_processes(pgid)


def _reach_starting_supervisor(run: Run, timeout_s: float = SUPERVISOR_RECORD_S) -> None:
    """A supervisor being started (start, resume) holds the run's lock before it has recorded its
    pid and group, so run.json still names the last attempt's: the request goes into run.json,
    which it reads before launching ranks, and this waits until it has recorded itself, so the
    signal reaches it too."""
    if run.status not in ACTIVE or process_alive(run.record.pid, run.record.pid_create_time) \
            or not run.supervisor_alive():
        return
    run.update(status="stopping", stop_requested=time.time())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and run.supervisor_alive():
        if process_alive(run.load().record.pid, run.record.pid_create_time):
            return
        time.sleep(0.05)
    run.load()


def _signal_adopter(run: Run, pgid: int) -> None:
    """A supervisor that adopted orphaned ranks lives outside their group: it hears of the stop
    too (it records `stopping` and enforces the grace period)."""
    pid = run.record.pid
    if not pid or not process_alive(pid, run.record.pid_create_time):
        return
    try:
        if os.getpgid(pid) != pgid:
            os.kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass


# ---------------------------------------------------------------- resume


def _check_resumable(run: Run, holding_lock: bool = False) -> None:
    """`holding_lock`: this process holds the run's lock, so no supervisor of it lives."""
    run.refresh_truth(supervisor=False if holding_lock else None)
    if run.status in ACTIVE:
        alive = not holding_lock and run.supervisor_alive()
        live = "its supervisor is alive" if alive else "processes of the run are still alive"
        raise RunError(message=f"{run.id} is still {run.status} ({live})",
                       fix=f"follow it with `llmtui show {run.id}`, or stop it first with `llmtui stop {run.id}`")
    if run.status == "succeeded":
        raise RunError(message=f"{run.id} already succeeded", fix="start a new run instead")
    run.recipe()  # a readable frozen recipe, or a clear error


def resume(run: Run, options: LaunchOptions | None = None, say: Say = _quiet) -> Run:
    """Continue a stopped or failed run from its last complete checkpoint, the way it ran:
    a local supervisor, node K of a node-mode run, or a resubmitted SLURM job."""
    options = options or LaunchOptions()
    mode = run.record.node_mode
    if mode not in ("slurm", "nodes") and options.node_rank is not None:
        raise UserError(message=f"{run.id} was not started node by node", fix="leave out --node-rank")
    if mode == "slurm":
        return _resume_slurm(run, say)
    if mode == "nodes":
        return _resume_node(run, options, say)
    # a live run's supervisor holds the lock: refused at once; otherwise acquire waits out readers' brief
    # checks and a supervisor that has recorded its end and is exiting
    live = run.status in ("starting", "running") and runlock.held(run.dir.lock())
    fd = None if live else runlock.acquire(run.dir.lock())
    if fd is None:
        raise RunError(message=f"{run.id} is already running: its supervisor holds the run (pid {run.record.pid})",
                       fix=f"follow it with `llmtui show {run.id}`, or stop it first with `llmtui stop {run.id}`")
    run.lock_fd = fd
    try:
        run.load()
        if run.status in ACTIVE and run.record.host in (None, socket.gethostname()) \
                and group_processes(run.record.pgid):
            say(f"{run.id}: its supervisor was gone, but its ranks still train; a new supervisor adopts them "
                "and records how they end")
            start_supervisor(run, adopt=True)
            return run.load()
        _check_resumable(run, holding_lock=True)
        queued = _requeue(run)
        say(f"resuming {run.id} from its last complete checkpoint"
            + (f" once the queue lets it start (#{queue.position(run.path.parent, run.id) or '?'} in line, "
               f"priority {run.record.queue.get('priority', 0)})" if queued else ""))
        start_supervisor(run, resume=True, queued=queued)
    finally:
        run.release_lock()
    return run.load()


def _requeue(run: Run) -> bool:
    """A run that went through the queue goes back through it on resume, with its priority and
    slots: it waits its turn like any queued run (True), instead of starting beside the runs
    that hold the devices."""
    recorded = run.record.queue
    if not isinstance(recorded, dict):
        return False
    entry = queue.enqueue(run.path.parent, run.id, priority=int(recorded.get("priority") or 0),
                          slots=int(recorded.get("slots") or 0) or None, devices=recorded.get("devices") or 1)
    run.update(queue={**recorded, "enqueued": entry.enqueued})
    return True


def _resume_node(run: Run, options: LaunchOptions, say: Say) -> Run:
    node_rank = options.node_rank
    nnodes = int(run.record.nnodes or 0)
    if node_rank is None:
        raise UserError(message=f"{run.id} runs on {nnodes} nodes started by hand",
                        fix=f"run `llmtui resume {run.id} --node-rank K` on every node, node 0 first")
    if not 0 <= node_rank < nnodes:
        raise UserError(message=f"node rank {node_rank} is outside the {nnodes} nodes of {run.id}",
                        fix=f"use --node-rank 0..{nnodes - 1}")
    master_addr = options.master_addr or run.record.master_addr
    port = int(run.record.master_port or cluster.DEFAULT_PORT)
    if node_rank == 0:
        _check_resumable(run)
        for k in cluster.node_records(run.path):
            if k:
                cluster.node_json(run.path, k).unlink(missing_ok=True)  # this attempt's nodes register anew
        run.update(master_addr=master_addr)
        say(f"resuming {run.id} from its last complete checkpoint (node 0 of {nnodes})")
    else:
        deadline = time.monotonic() + run.recipe().launch.join_timeout_s
        while run.load().status not in ("starting", "running"):
            if time.monotonic() > deadline:
                raise RunError(message=f"node 0 did not resume {run.id}",
                               fix=f"run `llmtui resume {run.id} --node-rank 0` on node 0 first")
            time.sleep(0.5)
        say(f"resuming {run.id} as node {node_rank} of {nnodes}")
    start_supervisor(run, resume=True, port=port, node=cluster.NodeArgs(node_rank, nnodes, master_addr), wait_s=15.0)
    return run


def _resume_slurm(run: Run, say: Say) -> Run:
    """Resubmit the run's batch script with --resume (e.g. after a TIMEOUT)."""
    _check_resumable(run)
    known = {k: v for k, v in (run.record.slurm or {}).items() if k in slurm.SlurmOptions.__dataclass_fields__}
    script = run.path / slurm.SCRIPT_NAME
    script.write_text(slurm.sbatch_script(run.path.resolve(), slurm.SlurmOptions(**known),
                                          env=cluster.passthrough_env(), resume=True), encoding="utf-8")
    for k in cluster.node_records(run.path):
        cluster.node_json(run.path, k).unlink(missing_ok=True)
    run.update(status="created", reason=None, ended=None, slurm_job=None, slurm_state=None, stop_requested=None)
    _submit(run, script, "not resubmitted")
    say(f"resuming {run.id}: submitted SLURM job {run.record.slurm_job} (from the last complete checkpoint)")
    return run

