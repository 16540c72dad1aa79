"""A torch-side tool (one of tuiapp.core.common.trainer_tools.TOOLS) in a child process of its own session,
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

from tuiapp.core.common import trainer_tools


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

    def __init__(self, tool: str, argv: list[str], cwd: str | os.PathLike | None = None) -> None:
        """`tool`: a name in trainer_tools.TOOLS."""
        self._start(trainer_tools.argv(tool, argv), cwd)

    @classmethod
    def of_module(cls, module: str, argv: list[str], cwd: str | os.PathLike | None = None) -> ChildTool:
        """Any module's `python -m` run, with a tool's output handling (tests use a stdlib module)."""
        child = cls.__new__(cls)
        child._start([sys.executable, "-m", module, *argv], cwd)
        return child

    def _start(self, command: list[str], cwd: str | os.PathLike | None) -> None:
        self.argv = command
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
