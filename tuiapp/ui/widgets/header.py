"""The app's header: Textual's, with an icon a browser font can draw under `llmtui serve-ui`
(Textual's `⭘` shows as an empty box there)."""

from __future__ import annotations

from textual.widgets import Header

WEB_ICON = "*"  # ASCII: every web font has it


class AppHeader(Header):
    def on_mount(self) -> None:
        if self.app.is_web:
            self.icon = WEB_ICON
