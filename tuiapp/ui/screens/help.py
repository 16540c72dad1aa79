"""The help screen (?): every key of the screen below it and of the app, from the same
bindings the footer and the command palette show."""

from __future__ import annotations

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


def help_text(screen: Screen) -> str:
    lines = [f"[b]{escape(type(screen).__name__.removesuffix('Screen'))}[/b]", ""]
    for action in screen_actions(screen, include_hidden=True):
        state = "" if action.enabled else "  [dim](not now)[/dim]"
        lines.append(f"  [b $accent]{escape(action.key):>10}[/]  {escape(action.title)} — {escape(action.help)}{state}")
    lines += [f"  [b $accent]{'ctrl+p':>10}[/]  Palette — Search every action by name", "", TIPS]
    return "\n".join(lines)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def __init__(self, under: Screen) -> None:
        super().__init__()
        self.under = under

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box") as box:
            box.border_title = "Keys"
            yield Static(help_text(self.under), id="help-text")

    def action_close(self) -> None:
        self.dismiss(None)
