"""What the Evaluate and Export forms share: a modal that checks its fields, then runs a torch-side
tool (core.after.evaluation, core.after.exporting) in a thread worker, the tool itself a child process, so the
UI never waits on nor imports torch. The worker posts ToolStarted / ToolOutput / ToolFinished; the
handlers own the widgets. esc cancels a running tool (its process group is ended), else closes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from textual import work
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Static

from tuiapp.core.common.child_tool import ChildTool
from tuiapp.core.common.errors import UserError
from tuiapp.ui.messages import ToolFinished, ToolOutput, ToolStarted

LINE_WIDTH = 60  # the tool's last line, cut to one row of the form at 80 columns


class ToolFormScreen(ModalScreen[bool]):
    """Subclasses compose the fields and the `#tool-error`, `#tool-progress`, `#tool-result` and
    `#tool-keys` Statics, and say how a request is read, planned, run and shown."""

    DEFAULT_CSS = """
    /* the box, not the screen, keeps the top and bottom lines free: a padded modal screen drew the
       screen behind it one line down (its footer and status line gone) */
    ToolFormScreen { align: center middle; }
    #tool-box {
        width: 80; max-width: 100%; height: auto; max-height: 100%; margin: 1 0;
        border: thick $primary; background: $surface; padding: 0 1;
    }
    #tool-title { text-style: bold; margin-bottom: 1; }
    .tool-field { height: 1; }
    .tool-label { width: 7; color: $text-muted; }
    .tool-field Input { width: 1fr; }
    .tool-field Select { width: 24; }
    #tool-box Checkbox { margin-bottom: 1; }
    #tool-error { color: $text-error; }
    #tool-progress { color: $text-warning; }
    #tool-result-box { height: auto; max-height: 6; margin-top: 1; }
    #tool-result { text-wrap: nowrap; text-overflow: ellipsis; }
    #tool-keys { color: $text-muted; margin-top: 1; dock: bottom; }  /* always on screen */
    """
    BINDINGS = [
        Binding("ctrl+r", "start", "Run", tooltip="Check the fields and start"),
        Binding("escape", "cancel", "Cancel / close", tooltip="Cancel the running tool, else close"),
    ]
    ACTION = "run"  # the verb of the form's keys line
    IDLE_KEYS = "enter / ctrl+r {action} · tab next field · esc closes"

    def __init__(self, run_id: str, run_path: Path, base_dir: Path) -> None:
        super().__init__()
        self.run_id = run_id  # the run the tool works on, and the app's folder (relative paths)
        self.run_path = run_path
        self.base_dir = base_dir
        self.running = False
        self.succeeded = False
        self.started_at = 0.0
        self.last_line = ""
        self._child: ChildTool | None = None
        self._cancel_asked = False

    def tool_lines(self):
        """The form's lines under its fields: the refusal, the progress, the result and the keys."""
        yield Static("", id="tool-error", markup=False)
        yield Static("", id="tool-progress", markup=False)
        # a long file list scrolls: the keys line stays
        yield VerticalScroll(Static("", id="tool-result", markup=False), id="tool-result-box")
        yield Static("", id="tool-keys")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_start()

    # ------------------------------------------------------------ subclasses

    def request(self) -> Any:
        """The fields, read and checked (on the UI thread): the request, or UserError."""
        raise NotImplementedError

    def plan(self, request: Any) -> Any:
        """Core's checks, before any work (in the worker): the plan, or UserError."""
        raise NotImplementedError

    def tool_of(self, planned: Any) -> ChildTool:
        raise NotImplementedError

    def run_plan(self, planned: Any, on_line: Callable[[str], None], child: ChildTool) -> Any:
        raise NotImplementedError

    def summary_of(self, planned: Any) -> str:
        raise NotImplementedError

    def show_result(self, result: Any) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ flow

    def in_form_words(self, text: str) -> str:
        """A message of core's (written for the CLI) in the form's words: its fields, not flags."""
        return text

    @property
    def run_title(self) -> str:
        """The run as the history names it: its display name, else its recipe's name, else its id."""
        try:
            from tuiapp.core.store import meta
            from tuiapp.core.store.runs import Run

            shown = meta.read_meta(self.run_path).get("display_name")
            return str(shown or Run(self.run_path).load().record.name or self.run_id)
        except Exception:  # an unreadable run.json: its id still names it
            return self.run_id

    def show(self, selector: str, text: str) -> None:
        """A line of the form's state; hidden while it has nothing to say."""
        widget = self.query_one(selector, Static)
        widget.update(self.in_form_words(text))
        widget.display = bool(text)
        if selector == "#tool-result":
            self.query_one("#tool-result-box").display = bool(text)

    def on_mount(self) -> None:
        for selector in ("#tool-error", "#tool-progress", "#tool-result"):
            self.show(selector, "")
        self._show_keys()
        self.set_interval(1.0, self._tick)

    def _show_keys(self) -> None:
        keys = "esc cancels the run" if self.running else self.IDLE_KEYS.format(action=self.ACTION)
        self.query_one("#tool-keys", Static).update(keys)

    def action_start(self) -> None:
        if self.running:
            return
        self.show("#tool-result", "")
        try:
            request = self.request()
        except UserError as exc:
            self.show("#tool-error", f"✗ {exc}")
            return
        self.show("#tool-error", "")
        self.show("#tool-progress", "checking…")
        self.running = True
        self._cancel_asked = False
        self._show_keys()
        self.work_tool(request)

    @work(thread=True, exclusive=True, group="tool")
    def work_tool(self, request: Any) -> None:
        try:
            planned = self.plan(request)
        except UserError as exc:
            self.post_message(ToolFinished(error=str(exc), refused=True))
            return
        except Exception as exc:  # a bug: said in the form, the app stays
            self.post_message(ToolFinished(error=f"the checks failed unexpectedly: {exc!r}", refused=True))
            return
        child = self.tool_of(planned)
        self._child = child
        if self._cancel_asked:
            child.cancel()
        self.post_message(ToolStarted(self.summary_of(planned)))
        try:
            result = self.run_plan(planned, lambda line: self.post_message(ToolOutput(line)), child)
        except UserError as exc:
            self.post_message(ToolFinished(error=str(exc)))
        except Exception as exc:
            self.post_message(ToolFinished(error=f"failed unexpectedly: {exc!r}"))
        else:
            self.post_message(ToolFinished(result=result))

    def on_tool_started(self, message: ToolStarted) -> None:
        self.started_at = time.monotonic()
        self.last_line = message.summary
        self._show_progress()

    def on_tool_output(self, message: ToolOutput) -> None:
        line = message.line.rstrip("\n").rsplit("\r", 1)[-1].strip()  # a progress bar's last redraw
        if line:
            self.last_line = line
            self._show_progress()

    def _tick(self) -> None:
        if self.running and self.started_at:
            self._show_progress()

    def _show_progress(self) -> None:
        elapsed = int(time.monotonic() - self.started_at)
        line = self.last_line if len(self.last_line) <= LINE_WIDTH else self.last_line[:LINE_WIDTH - 1] + "…"
        self.show("#tool-progress", f"running {elapsed}s · {line}")

    def on_tool_finished(self, message: ToolFinished) -> None:
        self.running = False
        self.started_at = 0.0
        self._child = None
        self.show("#tool-progress", "")
        if message.error:
            self.show("#tool-error", f"✗ {message.error}")
        else:
            self.succeeded = True
            self.show_result(message.result)
        self._show_keys()

    def action_cancel(self) -> None:
        if not self.running:
            self.dismiss(self.succeeded)
            return
        self._cancel_asked = True
        if self._child is not None:
            self._child.cancel()
        self.show("#tool-progress", "cancelling…")

    def on_unmount(self) -> None:
        if self._child is not None:  # the app quit while the tool ran: it does not outlive the form
            self._child.cancel()
