"""Chat with a run's model: answers stream in token by token, the conversation is kept, the
base model can answer beside it (ctrl+b), and the generation settings change between answers
(ctrl+g: temperature, top_p, max_new_tokens; the next answer uses them). The model runs in the inference server, a child
process started once by a thread worker (tuiapp.core.chat) and kept warm while the screen is
open; this process never imports torch. Workers only post messages; the handlers draw.
"""

from __future__ import annotations

import threading
from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input, Static

from tuiapp.core import meta
from tuiapp.core.chat import ChatSession, parse_settings, rate_text, settings_text
from tuiapp.core.errors import UserError
from tuiapp.core.runs import Run
from tuiapp.ui.widgets.header import AppHeader

MODELS = ("tuned", "base")


class ChatColumn(VerticalScroll):
    """One model's side of the conversation: a title, then a line per turn."""

    DEFAULT_CSS = """
    ChatColumn { width: 1fr; height: 1fr; border: round $primary-darken-2; padding: 0 1; }
    ChatColumn.-hidden { display: none; }
    ChatColumn .chat-user { color: $accent; margin-top: 1; }
    ChatColumn .chat-answer { color: $text; }
    ChatColumn .chat-note { color: $text-muted; }
    """

    def __init__(self, model: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model = model
        self.answer: Static | None = None  # the answer being streamed
        self.streamed = ""
        self.loading: Static | None = None  # '(loading the base model…)' until it is loaded

    def say(self, text: str, classes: str, before_answer: bool = False) -> Static:
        line = Static(text, classes=classes, markup=False)
        if before_answer and self.answer is not None:
            self.mount(line, before=self.answer)
        else:
            self.mount(line)
        self.scroll_end(animate=False)
        return line

    def ask(self, text: str) -> None:
        self.say(f"you: {text}", "chat-user")
        self.streamed = ""
        self.answer = self.say("…", "chat-answer")

    def stream(self, text: str) -> None:
        if self.answer is None:
            self.answer = self.say("", "chat-answer")
        self.streamed += text
        self.answer.update(self.streamed)
        self.scroll_end(animate=False)

    def finish(self, text: str | None, note: str = "") -> None:
        if self.answer is not None and text is not None:
            self.answer.update(text or "(empty answer)")
        if note:
            self.say(note, "chat-note")
        self.answer = None

    def clear(self) -> None:
        self.remove_children()
        self.answer = None


class ChatScreen(Screen):
    DEFAULT_CSS = """
    ChatScreen #chat-columns { height: 1fr; }
    ChatScreen #chat-title { height: auto; padding: 0 1; color: $text-muted; }
    """
    BINDINGS = [
        Binding("ctrl+b", "toggle_base", "Base beside", tooltip="Ask the base model too, side by side (or stop)"),
        Binding("ctrl+g", "settings", "Settings", tooltip="Generation settings for the next answers: temperature, "
                "top_p, max_new_tokens (empty: the run's [generate] table)"),
        Binding("ctrl+l", "reset", "New chat", tooltip="Forget the conversation and start again"),
        Binding("escape", "back", "Back", tooltip="Close the chat (the model server ends)"),
    ]

    class Ready(Message):
        """The inference server loaded the model(s)."""

        def __init__(self, event: dict) -> None:
            super().__init__()
            self.event = event

    class Streamed(Message):
        """A server event of an answer: loading, loaded, token, done or error."""

        def __init__(self, model: str, event: dict) -> None:
            super().__init__()
            self.model = model
            self.event = event

    class Failed(Message):
        """The server could not start, or died."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class Answered(Message):
        """Every model asked has answered the last message."""

    def __init__(self, run_id: str, checkpoint: int | None = None, vs_base: bool = False) -> None:
        super().__init__()
        self.run_id = run_id
        self.checkpoint = checkpoint
        self.vs_base = vs_base
        self.session: ChatSession | None = None
        self.ready = False
        self.busy = False
        self.failed: str | None = None
        self.tokens = {m: 0 for m in MODELS}  # token events received (tests: it streamed)
        self.answered = {m: 0 for m in MODELS}  # tokens of each model's last answer, as the server counted them
        self.run_name = run_id  # the name the run is shown with (display name, else its recipe's)
        self.target: dict = {}
        self.defaults: dict = {}  # the run's [generate] table, as the server reported it

    @property
    def models(self) -> list[str]:
        return ["tuned", "base"] if self.vs_base else ["tuned"]

    def compose(self) -> ComposeResult:
        yield AppHeader()
        yield Static("starting the model server…", id="chat-title", markup=False)
        with Horizontal(id="chat-columns"):
            yield ChatColumn("tuned", id="chat-tuned")
            yield ChatColumn("base", id="chat-base", classes="" if self.vs_base else "-hidden")
        yield Input(placeholder="loading the model…", id="chat-input", disabled=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        run_dir = self.app.config.runs_root / self.run_id
        try:
            self.run_name = meta.read_meta(run_dir).get("display_name") or Run(run_dir).load().name or self.run_id
        except Exception:  # an unreadable run.json: the server says why when it starts
            self.run_name = self.run_id
        self.sub_title = f"chat · {self.run_name}"
        self.column("tuned").border_title = "tuned"
        self.column("base").border_title = "base"
        self.start_server()

    def on_unmount(self) -> None:
        session, self.session = self.session, None
        if session is not None:  # the server ends on its own once stdin closes; do not wait here
            threading.Thread(target=session.close, name="chat-close", daemon=True).start()

    def column(self, model: str) -> ChatColumn:
        return self.query_one(f"#chat-{model}", ChatColumn)

    # ------------------------------------------------------------ workers

    @work(thread=True, exclusive=True, group="chat-server")
    def start_server(self) -> None:
        try:
            session = ChatSession(self.app.config.runs_root / self.run_id, self.checkpoint, load=self.models)
            self.session = session
            event = session.start()
        except UserError as exc:
            self.post_message(self.Failed(str(exc)))
            return
        except Exception as exc:  # a bug: say it, keep the app
            self.post_message(self.Failed(f"the chat could not start: {exc!r}"))
            return
        self.post_message(self.Ready(event))

    @work(thread=True, exclusive=True, group="chat-ask")
    def ask(self, text: str, models: list[str]) -> None:
        session = self.session
        try:
            for model in models:
                if session is None:
                    return
                session.ask(text, model, on_event=lambda event, m=model: self.post_message(self.Streamed(m, event)))
        except UserError as exc:
            self.post_message(self.Failed(str(exc)))
            return
        self.post_message(self.Answered())

    # ------------------------------------------------------------ handlers

    def settings(self) -> dict:
        """The settings the next answer uses: the run's [generate] table with the user's changes."""
        return {**self.defaults, **(self.session.overrides if self.session else {})}

    def show_title(self) -> None:
        target, settings = self.target, self.settings()
        temperature = settings.get("temperature") or 0
        sampling = "greedy" if not temperature else f"temperature {temperature:g}, top_p {settings.get('top_p')}"
        step = f" (step {target['step']})" if target.get("step") is not None else ""
        changed = " (ctrl+g: changed)" if self.session and self.session.overrides else " (ctrl+g)"
        self.query_one("#chat-title", Static).update(
            f"{self.run_name} · {target.get('label', 'final')}{step} · {target.get('kind')} {target.get('method')} · "
            f"{sampling}, up to {settings.get('max_new_tokens')} tokens{changed}"
            + (f" · system: {settings['system']}" if settings.get("system") else ""))

    def on_chat_screen_ready(self, message: Ready) -> None:
        self.ready = True
        target = message.event.get("target") or {}
        self.target = target
        self.defaults = dict(message.event.get("settings") or {})
        self.show_title()
        self.column("tuned").border_title = f"tuned · {target.get('label', 'final')}"
        self.column("base").border_title = f"base · {Path(str(target.get('base', ''))).name}"
        field = self.query_one("#chat-input", Input)
        field.disabled = False
        field.placeholder = "message (enter sends; ctrl+b base beside; ctrl+l new chat)"
        field.focus()

    def on_chat_screen_failed(self, message: Failed) -> None:
        self.failed = message.text
        self.busy = False
        self.query_one("#chat-title", Static).update(f"✗ {message.text}")
        self.query_one("#chat-input", Input).placeholder = "the model server is not running (esc: back)"
        self.notify(message.text, title="Chat", severity="error", markup=False, timeout=15)

    def on_chat_screen_streamed(self, message: Streamed) -> None:
        event, column = message.event, self.column(message.model)
        kind = event.get("event")
        if kind == "token":
            self.tokens[message.model] += 1
            column.stream(str(event.get("text", "")))
        elif kind == "loading":
            column.loading = column.say(f"(loading the {event.get('model')} model…)", "chat-note", before_answer=True)
        elif kind == "loaded" and column.loading is not None:  # the note goes once the model is there
            column.loading.remove()
            column.loading = None
        elif kind == "done":
            tokens = int(event.get("tokens") or 0)
            self.answered[message.model] = tokens
            column.finish(str(event.get("text", "")), rate_text(tokens, float(event.get("seconds") or 0)))
        elif kind == "error":
            column.finish(None, f"✗ {event.get('message')}")

    def on_chat_screen_answered(self, message: Answered) -> None:
        self.busy = False

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        if not text or not self.ready or self.busy:
            return
        event.input.value = ""
        self.busy = True
        for model in self.models:
            self.column(model).ask(text)
        self.ask(text, list(self.models))

    # ------------------------------------------------------------ actions

    def action_toggle_base(self) -> None:
        self.vs_base = not self.vs_base
        self.column("base").set_class(not self.vs_base, "-hidden")
        self.notify("the base model answers beside" if self.vs_base else "only the tuned model answers", title="Chat")

    def action_settings(self) -> None:
        """Edit the generation settings; the next answer (of every model shown) uses them."""
        if self.session is None or not self.ready:
            self.notify("the model server is not ready yet", title="Settings")
            return

        def apply(text: str | None) -> None:
            if text is None or self.session is None:
                return
            try:
                values = parse_settings(text)
            except UserError as exc:
                self.notify(str(exc), title="Settings", severity="error", markup=False)
                return
            self.session.overrides = {k: v for k, v in values.items() if v != self.defaults.get(k)}
            self.show_title()
            self.notify(settings_text(self.settings()) + " from the next answer", title="Settings")

        self.app.ask("Generation settings", "key=value: temperature (0 greedy), top_p, max_new_tokens, "
                     "repetition_penalty. Empty: the run's [generate] table.", settings_text(self.settings()), apply)

    def action_reset(self) -> None:
        if self.busy:
            return
        if self.session is not None:
            self.session.reset()
        for model in MODELS:
            self.column(model).clear()

    def action_back(self) -> None:
        self.app.pop_screen()
