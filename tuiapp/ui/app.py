"""The llmtui app: an app factory, and `run_app` for the bare `llmtui` command."""

from __future__ import annotations

from pathlib import Path

from textual.app import App
from textual.binding import Binding

from tuiapp.ui.commands import ActionsProvider
from tuiapp.ui.config import UiConfig


class LlmtuiApp(App):
    """Home (run history) at the bottom of the stack; every other screen is pushed on it."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "llmtui"
    COMMANDS = App.COMMANDS | {ActionsProvider}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    BINDINGS = [
        Binding("question_mark", "help", "Help", tooltip="Every key of this screen"),
        Binding("f1", "help", "Help", show=False, tooltip="Every key of this screen (also while typing)"),
        Binding("ctrl+q", "quit", "Quit", tooltip="Quit; runs keep going", show=False, priority=True),
    ]

    def __init__(self, config: UiConfig) -> None:
        super().__init__()
        self.config = config

    def on_mount(self) -> None:
        from tuiapp.ui.screens.home import HomeScreen

        self.push_screen(HomeScreen())

    def action_help(self) -> None:
        from tuiapp.ui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))


def create_app(runs_root: Path | str, **options) -> LlmtuiApp:
    """The app on a runs folder; options are UiConfig fields (clock, base_dir, live...)."""
    return LlmtuiApp(UiConfig(runs_root=Path(runs_root), **options))


def run_app(runs_root: Path) -> int:
    """Run the TUI until the user quits; runs started from it keep going."""
    app = create_app(runs_root)
    app.run()
    return app.return_code or 0
