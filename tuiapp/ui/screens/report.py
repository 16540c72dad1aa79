"""A long text in a scrollable modal: `llmtui doctor`'s report on a run (every rank's phase,
state and Python stack). Shown literally (stacks hold brackets)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tuiapp.ui.widgets.key_footer import KeyFooter


class ReportScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q", "close", "Close", tooltip="Back to the run"),
        Binding("up,k", "scroll(-1)", "Up", show=False),
        Binding("down,j", "scroll(1)", "Down", show=False),
        Binding("pageup", "scroll(-20)", "Page up", show=False),
        Binding("pagedown,space", "scroll(20)", "Page down", show=False),
    ]

    def __init__(self, title: str, text: str) -> None:
        super().__init__()
        self.title_text = title
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="report-box") as box:
            box.border_title = self.title_text
            box.border_subtitle = "esc closes"
            yield Static(self.text, id="report-text", markup=False)
        yield KeyFooter(compact=True)

    def action_scroll(self, lines: int) -> None:
        self.query_one("#report-box", VerticalScroll).scroll_relative(y=lines, animate=False)

    def action_close(self) -> None:
        self.dismiss(None)
