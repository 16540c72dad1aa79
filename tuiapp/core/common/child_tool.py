"""A torch-side tool (`python -m tuiapp.trainer.<tool>`) in a child process of its own session,
its output read line by line, the `error:` / `  fix:` lines it prints kept; the CLI echoes the
lines, the TUI shows them as progress. The process never shares the caller's interpreter, so
neither front end imports torch; `cancel` ends the tool's whole process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class ToolOutcome:
    code: int
    errors: list[str] = field(default_factory=list)  # the tool's "error: ..." and "  fix: ..." lines
    cancelled: bool = False

    def message_and_fix(self, failed: str, fix: str) -> tuple[str, str]:
        """The tool's own error and fix when it printed them, else `failed` and `fix`."""
        message = self.errors[0][len("error: "):] if self.errors else failed
        found_fix = self.errors[1].strip()[len("fix: "):] if len(self.errors) > 1 else fix
        return message, found_fix


class ChildTool:
    """One run of a trainer tool; `run` blocks (call it from a thread), `cancel` from any thread."""

    def __init__(self, module: str, argv: list[str], cwd: str | os.PathLike | None = None) -> None:
        self.argv = [sys.executable, "-m", module, *argv]
        self.cwd = cwd
        self._proc: subprocess.Popen | None = None
        self._cancelled = threading.Event()
        self._lock = threading.Lock()

    def run(self, on_line: Callable[[str], None] | None = None) -> ToolOutcome:
        with self._lock:
            if self._cancelled.is_set():
                return ToolOutcome(code=-signal.SIGTERM, cancelled=True)
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, errors="replace",
                                          start_new_session=True, cwd=self.cwd)
        errors: list[str] = []
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if on_line is not None:
                on_line(line)
            if line.startswith("error: ") or (errors and line.startswith("  fix: ")):
                errors.append(line.rstrip("\n"))
        return ToolOutcome(code=self._proc.wait(), errors=errors, cancelled=self._cancelled.is_set())

    def cancel(self) -> None:
        """SIGTERM to the tool's process group (its model loads and workers too); nothing when done."""
        self._cancelled.set()
        with self._lock:
            proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
