"""The llmtui app: an app factory, and `run_app` for the bare `llmtui` command.

The app owns navigation: screens ask it to open a run, a form, a compare, a question or a
report (`open_*`), so no screen module imports another. It also shows what a worker's call
into the run service raised (ActionFailed, see tuiapp.ui.worker_errors).

The run view, the form and compare are imported when first opened (no cycle: no screen imports
the app): they bring numpy, the charts and the recipe schema, which the first frame of the
history does not need.
"""

from __future__ import annotations

import asyncio
import gc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from tuiapp.core.common.errors import UserError
from tuiapp.ui.commands import ActionsProvider
from tuiapp.ui.config import UiConfig
from tuiapp.ui.messages import ActionFailed
from tuiapp.ui.screens.confirm import ConfirmScreen
from tuiapp.ui.screens.help import HelpScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.report import ReportScreen
from tuiapp.ui.worker_errors import title_of

if TYPE_CHECKING:
    from tuiapp.core.config.recipe import Recipe


WORKER_THREADS = 64  # thread workers at once: every open screen's watchers, and the actions beside them


class LlmtuiApp(App):
    """Home (run history) at the bottom of the stack; every other screen is pushed on it."""

    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "llmtui"
    COMMANDS = App.COMMANDS | {ActionsProvider}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    BINDINGS = [
        Binding("question_mark", "help", "Help", tooltip="Every key of this screen"),
        Binding("f1", "help", "Help", show=False, tooltip="Every key of this screen (also while typing)"),
        Binding("q", "quit_app", "Quit", show=False, tooltip="Quit from any screen; runs keep going (a form with "
                "edits asks first)"),
        Binding("ctrl+q", "quit", "Quit", tooltip="Quit; runs keep going", show=False, priority=True),
    ]

    def __init__(self, config: UiConfig) -> None:
        super().__init__()
        self.config = config

    def on_mount(self) -> None:
        # Textual runs thread workers in the loop's default executor, which holds cpu_count + 4
        # threads (6 on 2 cores). The history and an open run view keep six watchers alive, so a
        # seventh worker (resume, stop, doctor) would wait for a free thread forever.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=WORKER_THREADS, thread_name_prefix="llmtui-worker"))
        self.push_screen(HomeScreen())
        # what start-up made (modules, the history's widgets) is kept: later full collections skip
        # it instead of walking it each time (~0.1 s pauses while compare loads 10 long runs)
        self.call_after_refresh(gc.freeze)

    def push_screen(self, screen, *args, **kwargs):
        self._width_classes(screen)
        return super().push_screen(screen, *args, **kwargs)

    def switch_screen(self, screen):
        self._width_classes(screen)
        return super().switch_screen(screen)

    def _width_classes(self, screen) -> None:
        """The breakpoint class (-narrow / -wide) on a new screen before its first frame: in a real
        terminal Textual sets it only at the next resize, so a form pushed at 80 columns drew its
        wide layout."""
        if isinstance(screen, Screen) and self.size.width:
            chosen = set(screen._get_breakpoint_classes(self.size.width, self.HORIZONTAL_BREAKPOINTS))
            for _, name in self.HORIZONTAL_BREAKPOINTS:
                screen.set_class(name in chosen, name)

    # ------------------------------------------------------------ navigation

    def open_run(self, run_id: str, replace: bool = False) -> None:
        """The run view of a run; `replace` swaps it for the current screen (after a launch)."""
        from tuiapp.ui.screens.run_view import RunViewScreen

        screen = RunViewScreen(run_id)
        if replace:
            self.switch_screen(screen)
        else:
            self.push_screen(screen)

    def open_form(self, recipe: Recipe | None = None, title: str = "New experiment") -> None:
        """The new-experiment form, empty or filled with a recipe."""
        from tuiapp.ui.screens.new_experiment import NewExperimentScreen

        self.push_screen(NewExperimentScreen(recipe, title=title))

    def open_clone(self, run_path: Path) -> None:
        """The form filled with a run's frozen recipe (its model as the user typed it)."""
        from tuiapp.ui import actions

        try:
            recipe, name = actions.recipe_to_clone(run_path)
        except UserError as exc:
            self.notify(str(exc), title="Cannot clone", severity="error", markup=False)
            return
        self.open_form(recipe, title=f"Clone of {name}")

    def open_compare(self, run_ids: list[str]) -> None:
        from tuiapp.ui.screens.compare import CompareScreen

        self.push_screen(CompareScreen(run_ids))

    def open_group(self, group_id: str) -> None:
        """A sweep: its runs ranked by its metric, the varied keys' table and heat map."""
        from tuiapp.ui.screens.group import GroupScreen

        self.push_screen(GroupScreen(group_id))

    def ask(self, question: str, detail: str, value: str, then: Callable[[str | None], None],
            placeholder: str = "") -> None:
        """One line of text in a modal (tags, a note, a name); `then` gets it, or None on esc."""
        from tuiapp.ui.screens.prompt import PromptScreen

        self.push_screen(PromptScreen(question, detail, value, placeholder), then)

    def open_chat(self, run_id: str, checkpoint: int | None = None, vs_base: bool = False,
                  vs_run: str | None = None) -> None:
        """Chat with a run's model (its inference server starts in the background); `vs_run`: an
        arena, that run's model answering the same prompts beside."""
        from tuiapp.ui.screens.chat import ChatScreen

        self.push_screen(ChatScreen(run_id, checkpoint=checkpoint, vs_base=vs_base, vs_run=vs_run))

    def open_evaluate(self, run_id: str) -> None:
        """Evaluate a run's model on held-out data (a child process); the history shows the new score."""
        from tuiapp.ui.screens.evaluate import EvaluateScreen

        screen = EvaluateScreen(run_id, self.config.runs_root / run_id, self.config.base_dir)
        self.push_screen(screen, lambda saved: self._evaluated(run_id) if saved else None)

    def _evaluated(self, run_id: str) -> None:
        for screen in self.screen_stack:
            refresh = getattr(screen, "refresh_eval", None)
            if callable(refresh):
                refresh(run_id)

    def open_export(self, run_id: str) -> None:
        """Export a run's model to a folder (a child process)."""
        from tuiapp.ui.screens.export import ExportScreen

        self.push_screen(ExportScreen(run_id, self.config.runs_root / run_id, self.config.base_dir))

    def open_served(self) -> None:
        """The models `llmtui serve` serves, with stop and doctor."""
        from tuiapp.ui.screens.served import ServedScreen

        self.push_screen(ServedScreen(self.config.runs_root))

    def confirm(self, question: str, detail: str, then: Callable[[bool | None], None]) -> None:
        """Ask yes/no in a modal; `then` gets the answer."""
        self.push_screen(ConfirmScreen(question, detail), then)

    def open_report(self, title: str, text: str) -> None:
        """A long text (doctor's report) in a scrollable modal."""
        self.push_screen(ReportScreen(title, text))

    def action_quit_app(self) -> None:
        """q on any screen: quit, after a question when the screen has something to lose."""
        question = getattr(self.screen, "quit_question", None)
        text = question() if callable(question) else None
        if text:
            self.confirm(text, "", lambda yes: self.exit() if yes else None)
        else:
            self.exit()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    # ------------------------------------------------------------ errors of workers

    def on_action_failed(self, message: ActionFailed) -> None:
        """Every failure a worker reported, shown the same way (screens reset their state first)."""
        self.notify(message.text, title=title_of(message.action), severity="error", markup=False,
                    timeout=12 if message.expected else 20)


def create_app(runs_root: Path | str, **options) -> LlmtuiApp:
    """The app on a runs folder; options are UiConfig fields (clock, base_dir, live...)."""
    return LlmtuiApp(UiConfig(runs_root=Path(runs_root), **options))


def run_app(runs_root: Path) -> int:
    """Run the TUI until the user quits; runs started from it keep going."""
    # textual-image asks the terminal which graphics it speaks (Kitty, Sixel) when first imported,
    # which works only before Textual reads the terminal: the data preview's pictures need it now
    from tuiapp.ui.widgets import example_images  # noqa: F401

    app = create_app(runs_root)
    app.run()
    return app.return_code or 0
