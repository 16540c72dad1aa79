"""The help screen (?): every key of the screen below it and of the app, from the same
bindings the footer and the command palette show."""

from __future__ import annotations

import textwrap

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from tuiapp.ui.commands import screen_actions

TIPS = """\
Mouse: click rows, headers (sort), tabs and panes; the wheel scrolls.
ctrl+p opens the command palette: every action above, by name.
Runs outlive the app: quit any time (q on any screen, ctrl+q even while typing), reopen with
`llmtui`, and running runs are followed again.
History: space marks a run and moves down; marks stay while you filter (u clears them).
Form: the line under it describes the focused field; list fields take one item per line.
Narrow terminal: panes are tabs (1-6 or p); wide: all panes at once, z zooms one."""


KEY_WIDTH = 14  # "  " + the key right-aligned in 10 + "  "


def help_text(screen: Screen, width: int = 0) -> str:
    """Every key with its title and description; with a width, each description wraps under
    itself (not under the keys), and the tips wrap too."""
    lines = [f"[b]{escape(type(screen).__name__.removesuffix('Screen'))}[/b]", ""]
    room = width - KEY_WIDTH if width > KEY_WIDTH + 20 else 0
    for action in screen_actions(screen, include_hidden=True):
        state = "" if action.enabled else "  (not now)"
        about = f"{action.title} — {action.help}{state}"
        parts = textwrap.wrap(about, room) if room else [about]
        parts = [escape(part) for part in parts]
        if state:
            parts[-1] = parts[-1].replace("(not now)", "[dim](not now)[/dim]")
        lines.append(f"  [b $accent]{escape(action.key):>10}[/]  {parts[0]}")
        lines += [" " * KEY_WIDTH + part for part in parts[1:]]
    lines += [f"  [b $accent]{'ctrl+p':>10}[/]  Palette — Search every action by name", ""]
    tips = " ".join(TIPS.splitlines()).replace(". ", ".\n").splitlines() if room else TIPS.splitlines()
    for tip in tips:
        lines += [escape(line) for line in (textwrap.wrap(tip, width, subsequent_indent="  ") if room else [tip])]
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(self, under: Screen) -> None:
        super().__init__()
        self.under = under

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box") as box:
            box.border_title = "Keys"
            yield Static(help_text(self.under, self._text_width()), id="help-text")

    def _text_width(self) -> int:
        """The columns inside the box: app.tcss's #help-box (width 100, at most 95%), less its border,
        padding and scrollbar."""
        return min(100, int(self.app.size.width * 0.95)) - 6

    def on_resize(self) -> None:
        self.query_one("#help-text", Static).update(help_text(self.under, self._text_width()))

    def action_close(self) -> None:
        self.dismiss(None)
