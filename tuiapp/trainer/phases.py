"""This rank's start-up phase, for the supervisor's status and hang watchdog, and its stack on
demand (SIGUSR1 → faulthandler, for `llmtui doctor`)."""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
from pathlib import Path

from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.rundir import RunDir

_state: dict = {"run_dir": None, "rank": 0, "phase": None, "stack": None}


def start(run_dir: Path) -> None:
    """Called first thing in each rank: remember where to report, and dump every thread's stack
    into ranks/stack-<rank>.txt on SIGUSR1 (works even while the rank is stuck in C code)."""
    rank = int(os.environ.get("RANK", "0"))
    _state.update(run_dir=Path(run_dir), rank=rank)
    path = RunDir(run_dir).stack(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    _state["stack"] = open(path, "a", encoding="utf-8")  # kept open: faulthandler writes to its fd
    faulthandler.register(signal.SIGUSR1, file=_state["stack"], all_threads=True, chain=False)


def enter(phase: str) -> None:
    """This rank enters a start-up phase (one of rundir.PHASES)."""
    _state["phase"] = phase
    if _state["run_dir"] is None:
        return
    try:
        rundir.write_phase(_state["run_dir"], _state["rank"], phase, host=socket.gethostname(),
                           local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    except OSError:
        pass  # a full or read-only disk must not end training; the status just lags


def current() -> str | None:
    return _state["phase"]
