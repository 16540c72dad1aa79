"""One line of text in a modal: a run's tags, note or display name. Enter keeps it, esc drops it."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Static


class PromptScreen(ModalScreen[str | None]):
    BINDINGS = [
        Binding("escape", "cancel", "Cancel", tooltip="Close without changing anything"),
    ]

    def __init__(self, question: str, detail: str = "", value: str = "", placeholder: str = "") -> None:
        super().__init__()
        self.question = question
        self.detail = detail
        self.value = value
        self.placeholder = placeholder

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt-box"):
            yield Static(self.question, id="prompt-question", markup=False)
            if self.detail:
                yield Static(self.detail, id="prompt-detail", markup=False)
            yield Input(self.value, placeholder=self.placeholder, id="prompt-input")
            yield Static("enter saves · esc cancels", id="prompt-keys")

    @on(Input.Submitted, "#prompt-input")
    def submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
