"""Processes of a run: is a recorded pid still the same process, which processes share a group."""

from __future__ import annotations

import os

import psutil


def process_alive(pid: int | None, create_time: float | None) -> bool:
    """True when the process exists and is the same one we recorded (not a reused pid)."""
    if not pid:
        return False
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        if create_time is not None and abs(process.create_time() - create_time) > 1.0:
            return False
        return True
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


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
