"""`llmtui doctor RUN`: every rank's phase, process state and Python stack, and which rank is behind;
the run's vLLM generation server and its model served by `llmtui serve` (a finished run too).

Stacks come from py-spy (`dump --nonblocking`: the rank is not paused, and a rank stopped with
SIGSTOP can still be read), else from the rank's own faulthandler (SIGUSR1 makes it write every
thread's stack into ranks/stack-<rank>.txt; see tuiapp.trainer.phases).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from tuiapp.core.common.errors import RunError
from tuiapp.core.machine.procs import process_alive
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store import served
from tuiapp.core.store.runs import Run

STACK_TIMEOUT_S = 5.0


@dataclass
class RankState:
    rank: int
    pid: int | None
    host: str | None
    phase: str
    since: float
    state: str  # psutil's status, or 'gone' / 'elsewhere'
    stack: str = ""


def py_spy() -> str | None:
    """The py-spy binary next to this Python (a dependency), or on PATH."""
    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def _state(pid: int | None, host: str | None) -> str:
    if host and host != socket.gethostname():
        return "elsewhere"
    if not pid or not process_alive(pid, None):
        return "gone"
    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return "gone"


def stack_by_py_spy(pid: int, timeout_s: float = STACK_TIMEOUT_S) -> str | None:
    binary = py_spy()
    if binary is None:
        return None
    try:
        out = subprocess.run([binary, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True,
                             timeout=timeout_s, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return text if out.returncode == 0 and "Thread" in text else None


def stack_by_signal(run_dir: Path, rank: int, pid: int, timeout_s: float = STACK_TIMEOUT_S) -> str | None:
    """Ask the rank's faulthandler for its stacks (a stopped rank cannot answer)."""
    path = RunDir(run_dir).stack(rank)
    try:
        before = path.stat().st_size
        os.kill(pid, signal.SIGUSR1)
    except OSError:
        return None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            if path.stat().st_size > before:
                time.sleep(0.2)  # let it finish writing every thread
                with open(path, encoding="utf-8", errors="replace") as handle:
                    handle.seek(before)
                    return handle.read().strip()
        except OSError:
            return None
    return None


def rank_states(run: Run) -> list[RankState]:
    started = run.record.started
    phases = rundir.read_phases(run.path, since=(started - 1) if started else None)
    world = int(run.record.world_size or run.record.ranks or max(phases, default=-1) + 1 or 1)
    out = []
    for rank in range(max(world, max(phases, default=-1) + 1)):
        record = phases.get(rank, {})
        pid, host = record.get("pid"), record.get("host")
        out.append(RankState(rank, pid, host, record.get("phase", "launching"),
                             float(record.get("since") or started or time.time()), _state(pid, host)))
    return out


def behind_rank(states: list[RankState]) -> RankState | None:
    """The rank holding the others up: a stopped or dead one first, else the one earliest in
    start-up (longest in its phase). None when no rank waits on another: a single rank, or every
    rank in the same phase."""
    for bad in ("stopped", "zombie", "gone", "disk-sleep"):
        found = [s for s in states if s.state == bad]
        if found and len(found) < len(states):
            return found[0]
    if len({rundir.phase_index(s.phase) for s in states}) < 2:
        return None
    return min(states, key=lambda s: (rundir.phase_index(s.phase), s.since))


def diagnose(run: Run, timeout_s: float = STACK_TIMEOUT_S) -> str:
    """The report `llmtui doctor` prints and the TUI shows."""
    run.load()
    states = rank_states(run)
    server_pid = (run.record.generation_server or {}).get("pid")
    server_alive = bool(server_pid) and _state(int(server_pid), None) != "gone"
    ranks_live = any(s.state not in ("gone", "elsewhere") for s in states)
    if not ranks_live and served.alive(served.read_record(run.path)):
        return "\n".join([f"{run.id}: {run.status}", *_served_lines(run, timeout_s)])  # a served finished run
    if not server_alive and not ranks_live and run.status in rundir.FINAL:
        raise RunError(message=f"{run.id} has ended ({run.status}): no live rank to inspect",
                       fix=f"doctor inspects a live run; `llmtui show {run.id}` tells how this one ended")
    if not server_alive and not ranks_live:
        raise RunError(message=f"{run.id} has no live rank on this machine ({run.status})",
                       fix="doctor reads the stacks of running ranks; run it on the machine that runs them")
    now = time.time()
    for state in states:
        if state.state in ("gone", "elsewhere") or not state.pid:
            continue
        state.stack = stack_by_py_spy(state.pid, timeout_s) or (
            "" if state.state == "stopped" else stack_by_signal(run.path, state.rank, state.pid, timeout_s) or "")
    lag = behind_rank(states)
    lines = [f"{run.id}: {run.status}" + (f" · {run.record.phase}" if run.status == "starting" else "")]
    hang = run.record.hang
    if isinstance(hang, dict) and hang.get("message"):
        lines.append(f"! {hang['message']}")
    if lag is not None:
        why = {"stopped": "it is stopped (SIGSTOP or Ctrl-Z): `kill -CONT %d` continues it" % (lag.pid or 0),
               "gone": "its process is gone", "zombie": "its process has exited",
               "disk-sleep": "it is blocked in the kernel (I/O)"}.get(
            lag.state, f"it is still in '{lag.phase}' after {now - lag.since:.0f}s")
        lines.append(f"behind: rank {lag.rank} (pid {lag.pid}) — {why}")
    lines += _server_lines(run, timeout_s) + _served_lines(run, timeout_s)
    for state in states:
        lines.append("")
        lines.append(f"rank {state.rank}  pid {state.pid or '?'}  {state.host or '?'}  {state.state}  "
                     f"phase '{state.phase}' for {now - state.since:.0f}s")
        if state.state == "elsewhere":
            lines.append(f"  on {state.host}: run `llmtui doctor {run.id}` there")
        elif state.stack:
            lines += ["  " + line for line in state.stack.splitlines()]
        elif state.state not in ("gone",):
            lines.append("  (no stack: py-spy could not read it and the rank did not answer SIGUSR1)")
    return "\n".join(lines)


def _server_lines(run: Run, timeout_s: float) -> list[str]:
    """The run's vLLM generation server (grpo/rloo, vllm_mode 'server'): its state and stack."""
    server = run.record.generation_server or {}
    pid = server.get("pid")
    if not pid:
        return []
    state = _state(int(pid), None)
    ready = "answering" if server.get("ready") else "starting"
    lines = ["", f"vLLM generation server  pid {pid}  GPUs {server.get('gpus')}  {state}  {ready} at "
             f"{server.get('url')}  (log: {server.get('log')})"]
    if state != "gone":
        stack = stack_by_py_spy(int(pid), timeout_s)
        lines += ["  " + line for line in stack.splitlines()] if stack else ["  (no stack: py-spy could not read it)"]
    return lines


def _served_lines(run: Run, timeout_s: float) -> list[str]:
    """The run's model served by `llmtui serve` (serve.json), while its server lives: its state, and
    its Python stack (py-spy)."""
    record = served.read_record(run.path)
    if not record or not served.alive(record):
        return []
    pid = int(record["pid"])
    gpus = f"  GPUs {record.get('gpus')}" if record.get("gpus") else ""
    lines = ["", f"served model ({record.get('backend')})  pid {pid}  {served.state(record)} on {served.url_of(record)}"
             f"{gpus}  {_state(pid, None)}  (log: {served.log_path(run.path)})"]
    stack = stack_by_py_spy(pid, timeout_s)
    lines += ["  " + line for line in stack.splitlines()] if stack else ["  (no stack: py-spy could not read it)"]
    return lines
