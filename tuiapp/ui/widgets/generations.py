"""The Generations pane's body: a GenerationBrowser drawn at the pane's width (completions wrap to
it; every other line is cut to it with …). The screen owns the browser and refreshes this after changing it."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from tuiapp.ui.generations import GenerationBrowser, generation_lines


class GenerationsView(Widget):
    DEFAULT_CSS = """
    GenerationsView { height: auto; }
    """

    def __init__(self, browser: GenerationBrowser, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.browser = browser

    def _text(self, width: int) -> Text:
        return Text("\n").join(generation_lines(self.browser, max(20, width)))

    def render(self) -> Text:
        return self._text(self.content_size.width or 80)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(generation_lines(self.browser, max(20, width)))

    @property
    def plain(self) -> str:
        """The text shown (tests, and what a screen reader would read)."""
        return self._text(self.content_size.width or 80).plain
