"""Starting and stopping runs: argv built by pure functions, processes in their own session.

A run is a supervisor process (tuiapp.core.supervisor) that leads its own session and process
group; it starts the real `deepspeed` launcher, which starts the ranks, all in that group.
Never a shell, never a pipe to the caller: the run outlives whatever started it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tuiapp.core.errors import RunError
from tuiapp.core.preflight import detect_gpus
from tuiapp.core.recipe import LaunchSpec
from tuiapp.core.runs import Run, process_alive

STOP_GRACE_S = 60.0


def cuda_device_count() -> int:
    """GPUs visible through NVML; 0 on a machine without NVIDIA GPUs or with LLMTUI_FORCE_CPU."""
    if os.environ.get("LLMTUI_FORCE_CPU") == "1":
        return 0
    count = len(detect_gpus())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip()]
        return min(count, len(ids))
    return count


def plan_ranks(launch: LaunchSpec, cuda_count: int) -> tuple[int, list[int] | None]:
    """How many ranks, and which GPU ids (None = the first N / CPU ranks)."""
    gpus = launch.gpus
    if isinstance(gpus, list):
        if cuda_count and max(gpus) >= cuda_count:
            raise RunError(
                message=f"GPU ids {gpus} requested but only {cuda_count} GPUs are visible",
                key="launch.gpus",
                fix=f"use ids below {cuda_count}",
            )
        return len(gpus), (gpus if cuda_count else None)
    if gpus == "all":
        return max(1, cuda_count), None
    if cuda_count and gpus > cuda_count:
        raise RunError(
            message=f"{gpus} GPUs requested but only {cuda_count} are visible",
            key="launch.gpus",
            fix=f"set launch.gpus to at most {cuda_count}",
        )
    return gpus, None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def deepspeed_argv(
    run_dir: Path,
    ranks: int,
    gpu_ids: list[int] | None,
    master_port: int,
    resume: bool = False,
    python: str | None = None,
) -> list[str]:
    """The exact command of the DeepSpeed launcher for one node."""
    argv = [python or sys.executable, "-m", "deepspeed.launcher.runner", "--master_port", str(master_port)]
    if gpu_ids is not None:
        argv += ["--include", "localhost:" + ",".join(str(i) for i in gpu_ids)]
    else:
        argv += ["--num_gpus", str(ranks)]
    argv += ["--enable_each_rank_log", str(run_dir / "ranks"), "--module", "tuiapp.trainer", "--run-dir", str(run_dir)]
    if resume:
        argv.append("--resume")
    return argv


def supervisor_argv(run_dir: Path, resume: bool = False, port: int | None = None, python: str | None = None) -> list[str]:
    argv = [python or sys.executable, "-m", "tuiapp.core.supervisor", str(run_dir)]
    if port:
        argv += ["--master-port", str(port)]
    if resume:
        argv.append("--resume")
    return argv


def start(run: Run, resume: bool = False, port: int | None = None, wait_s: float = 10.0) -> int:
    """Start a run's supervisor detached from this process; returns its pid."""
    log = open(run.path / "supervisor.log", "ab")
    try:
        process = subprocess.Popen(
            supervisor_argv(run.path, resume, port),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            close_fds=True,
        )
    finally:
        log.close()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        run.load()
        if run.info.get("pid") == process.pid or process.poll() is not None:
            break
        time.sleep(0.05)
    return process.pid


def group_processes(pgid: int | None) -> list[psutil.Process]:
    """Every live process of a run's process group."""
    if not pgid:
        return []
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return found


def stop(run: Run, grace_s: float = STOP_GRACE_S, wait: bool = True) -> bool:
    """Graceful stop: SIGTERM to the run's group; the supervisor SIGKILLs what is left after
    the grace period. If the supervisor is gone, this does the killing. True when no process
    of the run is left."""
    run.load()
    if run.info.get("slurm_job"):
        from tuiapp.core import slurm  # SIGTERM to the job's steps, scancel after the grace period

        return slurm.stop(run, grace_s, wait)
    host = run.info.get("host")
    if run.info.get("status") in ("created", "running") and host not in (None, socket.gethostname()):
        # a multi-node run's supervisor on another machine: its pgid means nothing here
        raise RunError(message=f"{run.id} is supervised on {host}", fix=f"run `llmtui stop {run.id}` on {host}")
    pgid = run.info.get("pgid")
    if not pgid:
        return True
    supervisor_up = process_alive(run.info.get("pid"), run.info.get("pid_create_time"))
    try:
        os.killpg(pgid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    if not wait:
        return False
    deadline = time.monotonic() + grace_s + 15.0
    while time.monotonic() < deadline:
        if not group_processes(pgid):
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
    if run.load().status in ("created", "running"):
        run.update(status="stopped", ended=time.time(), reason="stopped; processes killed after the grace period")
    return not group_processes(pgid)
