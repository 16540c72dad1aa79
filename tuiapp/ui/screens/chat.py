"""Chat with a run's model: answers stream in token by token, the conversation is kept (or not:
ctrl+t answers each message alone), the base model can answer beside it (ctrl+b), a second run can
answer the same prompts beside it (an arena: `vs_run`, from the history with two runs marked), and
the generation settings change between answers (ctrl+g: temperature, top_p, max_new_tokens; the
next answer uses them, in an arena for both runs). `/image PATH` typed in the input attaches an
image to the next message, for a vision-language model. Each run's model runs in its own inference
server, a child process started once by a thread worker (tuiapp.core.after.chat) and kept warm while the
screen is open; this process never imports torch. Workers only post messages; the handlers draw.
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
from textual.widgets import Input, Static

from tuiapp.core.after.chat import ChatSession, check_image, image_label, parse_settings, rate_text, settings_text
from tuiapp.core.common.errors import UserError
from tuiapp.core.store import meta
from tuiapp.core.store.runs import Run
from tuiapp.ui.footer_keys import footer_by_priority
from tuiapp.ui.widgets.header import AppHeader
from tuiapp.ui.widgets.key_footer import KeyFooter

MODELS = ("tuned", "other", "base")  # the run, the arena's second run, the run's base
IMAGE_COMMAND = "/image"  # `/image PATH` in the input: the next message shows a VLM that image


INPUT_HINTS = ("message (enter sends; /image PATH attaches an image; ctrl+b base beside; ctrl+t single turn; "
               "ctrl+l new chat)", "message (enter sends; /image PATH; ctrl+b base; ctrl+l new chat; ? keys)",
               "message (enter sends; ? keys)")


def input_hint(width: int) -> str:
    """The input's placeholder: the longest of INPUT_HINTS that fits the box (borders and padding)."""
    return next((hint for hint in INPUT_HINTS if len(hint) <= width - 6), INPUT_HINTS[-1])


def run_name(run_dir: Path) -> str:
    """The name a run is shown with: its display name, else its recipe's name, else its id."""
    try:
        return meta.read_meta(run_dir).get("display_name") or Run(run_dir).load().name or run_dir.name
    except Exception:  # an unreadable run.json: the server says why when it starts
        return run_dir.name


class ChatColumn(VerticalScroll):
    """One model's side of the conversation: a title, then a line per turn."""

    DEFAULT_CSS = """
    ChatColumn { width: 1fr; height: 1fr; border: round $primary-darken-2; padding: 0 1; }
    ChatColumn.-hidden { display: none; }
    ChatColumn .chat-user { color: $accent; margin-top: 1; }
    ChatColumn .chat-answer { color: $text; }
    ChatColumn .chat-note { color: $text-muted; }
    ChatColumn .chat-failed { color: $error; }
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

    def ask(self, text: str, images: list[str] | None = None) -> None:
        shown = "".join(f"[image {Path(p).name}] " for p in images or [])
        self.say(f"you: {shown}{text}", "chat-user")
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
    ChatScreen #chat-title { height: 1; padding: 0 1; color: $text-muted; text-wrap: nowrap; text-overflow: ellipsis; }
    """
    BINDINGS = [
        Binding("ctrl+b", "toggle_base", "Base beside", tooltip="Ask the base model too, side by side (or stop)"),
        Binding("ctrl+g", "settings", "Settings", tooltip="Generation settings for the next answers: temperature, "
                "top_p, max_new_tokens (empty: the run's [generate] table)"),
        Binding("ctrl+t", "single_turn", "Single turn", tooltip="Answer each message alone (no conversation "
                "history), or keep the conversation again"),
        Binding("ctrl+l", "reset", "New chat", tooltip="Forget the conversation and start again"),
        Binding("ctrl+r", "judge_pair", "Judge pair", tooltip="An arena: send the last prompt and both runs' "
                "answers to a judge (an endpoint URL or a run served by `llmtui serve`); the verdict is shown "
                "and saved in the first run's judge/ folder"),
        Binding("escape", "back", "Back", tooltip="Close the chat (the model server ends)"),
    ]
    # the keys the footer keeps when not all fit (at 80 columns esc Back was cut, a stray letter after it)
    FOOTER_PRIORITY = ["back", "help", "toggle_base", "settings", "reset", "single_turn", "judge_pair"]

    class Ready(Message):
        """The inference server(s) loaded the model(s): the run's ready event (and the other run's)."""

        def __init__(self, event: dict, other: dict | None = None) -> None:
            super().__init__()
            self.event = event
            self.other = other or {}

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

    class Judged(Message):
        """The judge's verdict on the arena's last pair (the saved result), or why there is none."""

        def __init__(self, result: dict | None, error: str = "") -> None:
            super().__init__()
            self.result = result
            self.error = error

    def __init__(self, run_id: str, checkpoint: int | None = None, vs_base: bool = False,
                 vs_run: str | None = None) -> None:
        super().__init__()
        self.run_id = run_id
        self.checkpoint = checkpoint
        self.vs_base = vs_base
        self.vs_run = vs_run  # an arena: this run's final model answers each prompt beside
        self.session: ChatSession | None = None
        self.other: ChatSession | None = None  # the arena's second run's server
        self.single_turn = False
        self.ready = False
        self.busy = False
        self.failed: str | None = None
        self.tokens = {m: 0 for m in MODELS}  # token events received (tests: it streamed)
        self.answered = {m: 0 for m in MODELS}  # tokens of each model's last answer, as the server counted them
        self.run_name = run_id  # the name the run is shown with (display name, else its recipe's)
        self.other_name = vs_run or ""
        self.target: dict = {}
        self.other_target: dict = {}
        self.defaults: dict = {}  # the run's [generate] table, as the server reported it
        self.attached: list[str] = []  # images the next message shows the model (/image PATH)
        self.sees_images: dict = {}  # model -> whether it reads images, as the server reported it
        self.last_prompt = ""  # the last message sent, and each column's finished answer to it
        self.last_answers: dict[str, str] = {}
        self.judge_spec = ""  # the judge last used for a pair (offered again)
        self.judged: dict | None = None  # the last verdict's saved result

    @property
    def models(self) -> list[str]:
        """The columns that answer the next message."""
        return ["tuned"] + (["other"] if self.vs_run else []) + (["base"] if self.vs_base else [])

    def sessions(self) -> list[ChatSession]:
        return [s for s in (self.session, self.other) if s is not None]

    def route(self, model: str) -> tuple[ChatSession | None, str]:
        """The server that answers for a column, and the model it names there."""
        return (self.other, "tuned") if model == "other" else (self.session, model)

    def compose(self) -> ComposeResult:
        yield AppHeader()
        yield Static("starting the model server…", id="chat-title", markup=False)
        with Horizontal(id="chat-columns"):
            yield ChatColumn("tuned", id="chat-tuned")
            yield ChatColumn("other", id="chat-other", classes="" if self.vs_run else "-hidden")
            yield ChatColumn("base", id="chat-base", classes="" if self.vs_base else "-hidden")
        yield Input(placeholder="loading the model…", id="chat-input", disabled=True)
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        root = self.app.config.runs_root
        self.run_name = run_name(root / self.run_id)
        if self.vs_run:
            self.other_name = run_name(root / self.vs_run)
            self.sub_title = f"chat · {self.run_name} vs {self.other_name}"
        else:
            self.sub_title = f"chat · {self.run_name}"
        self.column("tuned").border_title = self.run_name if self.vs_run else "tuned"
        self.column("other").border_title = self.other_name
        self.column("base").border_title = "base"
        self.start_server()

    def on_unmount(self) -> None:
        sessions, self.session, self.other = self.sessions(), None, None
        for session in sessions:  # a server ends on its own once stdin closes; do not wait here
            threading.Thread(target=session.close, name="chat-close", daemon=True).start()

    def column(self, model: str) -> ChatColumn:
        return self.query_one(f"#chat-{model}", ChatColumn)

    # ------------------------------------------------------------ workers

    @work(thread=True, exclusive=True, group="chat-server")
    def start_server(self) -> None:
        """The run's server (and the arena's other run's), started side by side: two loads at once."""
        root = self.app.config.runs_root
        started: dict[str, dict] = {}
        try:
            session = ChatSession(root / self.run_id, self.checkpoint, load=[m for m in self.models if m != "other"])
            self.session = session
            if self.vs_run:  # its checks too before any process
                self.other = ChatSession(root / self.vs_run, None, load=["tuned"])
            in_parallel(lambda: started.__setitem__("tuned", session.start()),
                        *([lambda: started.__setitem__("other", self.other.start())] if self.other else []))
            if self.other is not None:  # both answer alike: the first run's settings
                self.other.overrides = session.answering_settings()
        except UserError as exc:
            self.post_message(self.Failed(str(exc)))
            return
        except Exception as exc:  # a bug: say it, keep the app
            self.post_message(self.Failed(f"the chat could not start: {exc!r}"))
            return
        self.post_message(self.Ready(started["tuned"], started.get("other")))

    @work(thread=True, exclusive=True, group="chat-ask")
    def ask(self, text: str, models: list[str], images: list[str] | None = None) -> None:
        """Each server answers in its own thread (an arena's two runs at once); one server's
        models one after the other."""
        by_session: dict[int, list[str]] = {}
        for model in models:
            session, _ = self.route(model)
            if session is not None:
                by_session.setdefault(id(session), []).append(model)

        def answer(columns: list[str]) -> None:
            for model in columns:
                session, name = self.route(model)
                if session is None:
                    return
                session.ask(text, name, on_event=lambda event, m=model: self.post_message(self.Streamed(m, event)),
                            images=images)

        try:
            in_parallel(*[lambda columns=columns: answer(columns) for columns in by_session.values()])
        except UserError as exc:
            self.post_message(self.Failed(str(exc)))
            return
        self.post_message(self.Answered())

    # ------------------------------------------------------------ handlers

    def settings(self) -> dict:
        """The settings the next answer uses: the run's [generate] table with the user's changes."""
        return {**self.defaults, **(self.session.overrides if self.session else {})}

    @property
    def active_bindings(self):
        return footer_by_priority(self.app, super().active_bindings, self.FOOTER_PRIORITY, self.size.width)

    def on_resize(self) -> None:
        self.refresh_bindings()
        field = self.query("#chat-input")
        if self.ready and not self.failed and field:
            field.first(Input).placeholder = input_hint(self.size.width)

    def show_title(self) -> None:
        settings = self.settings()
        temperature = settings.get("temperature") or 0
        sampling = "greedy" if not temperature else f"temperature {temperature:g}, top_p {settings.get('top_p')}"
        changed = " (ctrl+g: changed)" if self.session and self.session.overrides else " (ctrl+g)"
        who = f"{self.run_name} · {target_text(self.target)}"
        if self.vs_run:
            who += f" vs {self.other_name} · {target_text(self.other_target)}"
        self.query_one("#chat-title", Static).update(
            f"{who} · {sampling}, up to {settings.get('max_new_tokens')} tokens{changed}"
            + (" · single turn (ctrl+t)" if self.single_turn else "")
            + (f" · system: {settings['system']}" if settings.get("system") else ""))

    def on_chat_screen_ready(self, message: Ready) -> None:
        self.ready = True
        target = message.event.get("target") or {}
        self.target = target
        self.other_target = message.other.get("target") or {}
        self.defaults = dict(message.event.get("settings") or {})
        self.sees_images = dict(message.event.get("images") or {})
        self.show_title()
        label = target.get("label", "final")
        self.column("tuned").border_title = f"{self.run_name} · {label}" if self.vs_run else f"tuned · {label}"
        self.column("other").border_title = f"{self.other_name} · {self.other_target.get('label', 'final')}"
        self.column("base").border_title = f"base · {Path(str(target.get('base', ''))).name}"
        field = self.query_one("#chat-input", Input)
        field.disabled = False
        field.placeholder = input_hint(self.size.width)
        field.focus()

    def on_chat_screen_failed(self, message: Failed) -> None:
        self.failed = message.text
        self.busy = False
        first = message.text.strip().splitlines()[0] if message.text.strip() else "the chat could not start"
        self.query_one("#chat-title", Static).update(f"✗ {first}")
        # the whole error with its fix, where the answers would be (a toast went after 15 s, over the input)
        self.column("tuned").say(f"✗ {message.text.strip()}", "chat-note chat-failed")
        self.query_one("#chat-input", Input).placeholder = "the model server is not running (esc: back)"

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
            self.last_answers[message.model] = str(event.get("text", ""))
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
        if text == IMAGE_COMMAND or text.startswith(IMAGE_COMMAND + " "):
            self.attach(text[len(IMAGE_COMMAND):])
            return
        self.busy = True
        self.last_prompt, self.last_answers = text, {}
        images, self.attached = self.attached, []
        for model in self.models:
            self.column(model).ask(text, images)
        self.ask(text, list(self.models), images)

    def attach(self, path: str) -> None:
        """The image goes with the next message (checked now: it exists and decodes)."""
        try:
            resolved = check_image(path)
        except UserError as exc:
            self.notify(str(exc) + (f"\n{exc.fix}" if exc.fix else ""), title="Image", severity="error", markup=False)
            return
        self.attached.append(resolved)
        note = f"(attached {image_label(resolved)} to the next message)"
        if self.sees_images and not self.sees_images.get("tuned", True):
            note += " — this model reads text only; its server will refuse the image"
        for model in self.models:
            self.column(model).say(note, "chat-note")

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
            if self.other is not None:  # the arena's other run answers alike
                self.other.overrides = self.session.answering_settings()
            self.show_title()
            self.notify(settings_text(self.settings()) + " from the next answer", title="Settings")

        self.app.ask("Generation settings", "key=value: temperature (0 greedy), top_p, max_new_tokens, "
                     "repetition_penalty. Empty: the run's [generate] table.", settings_text(self.settings()), apply)

    def action_single_turn(self) -> None:
        """Answer each message alone (the conversation so far is not sent), or keep it again."""
        self.single_turn = not self.single_turn
        for session in self.sessions():
            session.single_turn = self.single_turn
        note = ("(single turn: each message is answered alone)" if self.single_turn
                else "(the conversation is kept again)")
        for model in self.models:
            self.column(model).say(note, "chat-note")
        if self.ready:
            self.show_title()

    def action_reset(self) -> None:
        if self.busy:
            return
        for session in self.sessions():
            session.reset()
        for model in MODELS:
            self.column(model).clear()

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_judge_pair(self) -> None:
        if not self.vs_run:
            self.notify("judging a pair needs an arena: mark two runs in the history and press C",
                        title="Judge", severity="warning", markup=False)
            return
        if self.busy or not all(m in self.last_answers for m in ("tuned", "other")):
            self.notify("ask something first: the judge compares both runs' answers to the last prompt",
                        title="Judge", severity="warning", markup=False)
            return
        def chosen(spec: str | None) -> None:
            if spec and spec.strip():
                self.judge_spec = spec.strip()
                self.send_to_judge(self.judge_spec)

        self.app.ask("Judge this pair with", "an OpenAI-compatible endpoint (http://host:port/v1) or a run served "
                     "by `llmtui serve` (its id or name)", self.judge_spec, chosen)

    @work(thread=True, exclusive=True, group="chat-judge")
    def send_to_judge(self, spec: str) -> None:
        from tuiapp.core.after import judging
        from tuiapp.core.store.runs import RunStore

        root = self.app.config.runs_root
        try:
            judge = judging.resolve_judge(spec, RunStore(root))
            result = judging.judge_pair(root / self.run_id, self.vs_run or "", self.last_prompt,
                                        self.last_answers["tuned"], self.last_answers["other"], judge)
        except UserError as exc:
            self.post_message(self.Judged(None, str(exc)))
            return
        self.post_message(self.Judged(result))

    def on_chat_screen_judged(self, message: Judged) -> None:
        if message.result is None:
            self.notify(message.error, title="Judge", severity="error", markup=False, timeout=10)
            return
        item = message.result["items"][0]
        outcome = {"win": f"{self.run_name} (A) is better", "loss": f"{self.other_name} (B) is better",
                   "tie": "a tie"}.get(item["outcome"], f"no verdict could be read: {item['reply'][:60]!r}")
        line = f"judge ({message.result['judge']}): {outcome}"
        for model in ("tuned", "other"):
            self.column(model).say(line, "chat-note")
        self.judged = message.result


def target_text(target: dict) -> str:
    """'final (step 60) · full sft': which model of a run answers."""
    step = f" (step {target['step']})" if target.get("step") is not None else ""
    return f"{target.get('label', 'final')}{step} · {target.get('kind')} {target.get('method')}"


def in_parallel(*jobs) -> None:
    """Run the jobs in threads of their own (one inline) and wait for all; the first error is raised."""
    errors: list[BaseException] = []

    def run(job) -> None:
        try:
            job()
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(job,), name="chat-side", daemon=True) for job in jobs[1:]]
    for thread in threads:
        thread.start()
    if jobs:
        run(jobs[0])
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
