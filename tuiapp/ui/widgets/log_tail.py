"""A log view that is fed lines (the tailing itself happens in a worker: tuiapp.ui.tail)."""

from __future__ import annotations

import re

from textual.widgets import Log

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")


class LogTail(Log):
    DEFAULT_CSS = """
    LogTail { height: 1fr; }
    """

    def __init__(self, max_lines: int = 5000, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=max_lines, highlight=False, auto_scroll=True, id=id, classes=classes)
        self.source = ""

    def show(self, lines: list[str], reset: bool = False) -> None:
        if reset:
            self.clear()
        if lines:
            self.write_lines([ANSI.sub("", line) for line in lines])
