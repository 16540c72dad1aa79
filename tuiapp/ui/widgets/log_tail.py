"""A log view that is fed lines (the tailing itself happens in a worker): long lines wrap, the
view follows new lines while it is scrolled to the end (end: follow again), and a search
selects each match in turn (n / N)."""

from __future__ import annotations

import re

from textual import events
from textual.binding import Binding
from textual.widgets import TextArea
from textual.widgets.text_area import Selection

BACK_KEYS = ("up", "pageup", "ctrl+up", "ctrl+pageup")
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07")


class LogTail(TextArea):
    DEFAULT_CSS = """
    LogTail { height: 1fr; border: none; padding: 0; }
    LogTail:focus { border: none; }
    """
    BINDINGS = [
        Binding("home", "top", "Top", show=False, tooltip="Jump to the first line (stops following)"),
        Binding("end", "follow", "Follow", tooltip="Jump to the last line and follow new ones"),
        Binding("n", "find(1)", "Next match", tooltip="The next match of the search (/)"),
        Binding("N", "find(-1)", "Previous match", tooltip="The previous match of the search (/)"),
    ]

    def __init__(self, max_lines: int = 5000, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__("", read_only=True, soft_wrap=True, show_line_numbers=False, id=id, classes=classes)
        self.max_lines = max_lines
        self._lines: list[str] = []
        self.following = True
        self.pattern = ""  # the last search, matched case-insensitively
        self.match: tuple[int, int] | None = None  # (line, column) of the selected match

    @property
    def lines(self) -> list[str]:
        """The lines shown, without ANSI escapes."""
        return self._lines

    def show(self, lines: list[str], reset: bool = False) -> None:
        if reset:
            self._lines = []
            self.match = None
            self.load_text("")
        if not lines:
            return
        clean = [ANSI.sub("", line) for line in lines]
        if self._lines:
            self.insert("\n" + "\n".join(clean), self.document.end, maintain_selection_offset=True)
        else:
            self.load_text("\n".join(clean))
        self._lines += clean
        extra = len(self._lines) - self.max_lines
        if extra > 0:
            self.delete((0, 0), (extra, 0), maintain_selection_offset=True)
            del self._lines[:extra]
            if self.match is not None:
                self.match = (max(0, self.match[0] - extra), self.match[1])
        self.history.clear()  # a log is never undone
        if self.following:
            self.call_after_refresh(self._to_end)

    def _to_end(self) -> None:
        self.move_cursor(self.document.end)
        self.scroll_end(animate=False, immediate=True)

    def on_key(self, event: events.Key) -> None:
        if event.key in BACK_KEYS:  # the user reads back: stop following (end follows again)
            self.following = False

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self.following = False

    def action_top(self) -> None:
        self.following = False
        self.match = None
        self.move_cursor((0, 0))
        self.scroll_home(animate=False, immediate=True)

    def action_follow(self) -> None:
        self.following = True
        self._to_end()

    def search(self, pattern: str) -> bool:
        """Select the first match of pattern after the cursor (wrapping around); False if none."""
        self.pattern = pattern
        self.match = None
        return self.action_find(1, from_cursor=True)

    def action_find(self, direction: int = 1, from_cursor: bool = False) -> bool:
        if not self.pattern or not self._lines:
            return False
        needle = self.pattern.lower()
        row, column = self.match if self.match is not None else self.cursor_location
        count = len(self._lines)
        start = column if (from_cursor and self.match is None) else column + (1 if direction > 0 else -1)
        for step in range(count + 1):
            index = (row + direction * step) % count
            line = self._lines[index].lower()
            if step == 0:
                found = line.find(needle, max(0, start)) if direction > 0 else (line.rfind(needle, 0, max(0, start)) if start > 0 else -1)
            else:
                found = line.find(needle) if direction > 0 else line.rfind(needle)
            if found >= 0:
                self.match = (index, found)
                self.following = False
                self.selection = Selection((index, found), (index, found + len(needle)))
                self.scroll_cursor_visible(center=True, animate=False)
                return True
        return False
