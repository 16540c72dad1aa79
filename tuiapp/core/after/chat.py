"""Talking to a run's model without importing torch: a client of the inference server
(`python -m tuiapp.trainer.tools.serve`, JSON lines on its stdin/stdout). `llmtui chat` and the TUI's
chat screen both use it; the server starts once and stays warm until `close()`.

The server is a child on pipes on purpose (unlike a run, it should not outlive its user): when
the CLI or the TUI ends, its stdin closes and it exits. Its stderr (library logs, loading bars)
goes to a temporary file whose tail explains a failed start.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from tuiapp.core.after.targets import Target, model_target
from tuiapp.core.common import trainer_tools
from tuiapp.core.common.errors import RunError, UserError
from tuiapp.core.data.images import ImageProblem, check_image_file

SETTING_KEYS = ("system", "temperature", "top_p", "max_new_tokens", "repetition_penalty")


class ChatError(UserError):
    """The inference server could not start, or died."""


def server_argv(run_dir: Path, checkpoint: int | None, load: list[str], python: str | None = None) -> list[str]:
    argv = trainer_tools.argv("serve", [str(run_dir), "--load", ",".join(load)], python)
    if checkpoint is not None:
        argv += ["--checkpoint", str(checkpoint)]
    return argv


class ChatSession:
    """One warm inference server for one run (its final model or a checkpoint, and its base).

    Each model keeps its own history: `ask(text, model)` adds the user's turn and the answer;
    with `single_turn` set, each message is answered alone (no history sent, none kept).
    """

    def __init__(self, run_dir: Path, checkpoint: int | None = None, load: list[str] | None = None):
        self.run_dir = Path(run_dir)
        self.checkpoint = checkpoint
        self.target: Target = model_target(self.run_dir, checkpoint)  # clear errors before any process
        self.load = load or ["tuned"]
        self.history: dict[str, list[dict]] = {"tuned": [], "base": []}
        self.settings: dict = {}  # the run's [generate] table, as the server reported it
        self.overrides: dict = {}
        self.single_turn = False
        self.ready: dict = {}
        self._proc: subprocess.Popen | None = None
        self._log = None
        self._next_id = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------ the process

    def start(self) -> dict:
        """Start the server and wait until its models are loaded; the ready event."""
        self._log = tempfile.NamedTemporaryFile(prefix="llmtui-serve-", suffix=".log", delete=False)
        self._proc = subprocess.Popen(
            server_argv(self.run_dir, self.checkpoint, self.load), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, text=True, encoding="utf-8", bufsize=1,
        )
        while True:
            event = self._read()
            if event.get("event") == "fatal":
                self.close()
                raise ChatError(message=f"the model of {self.run_dir.name} could not be loaded: {event.get('message')}",
                                fix=f"see {self.log_path}")
            if event.get("event") == "ready":
                self.ready = event
                self.settings = dict(event.get("settings") or {})
                return event

    @property
    def log_path(self) -> str:
        return self._log.name if self._log else ""

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _read(self) -> dict:
        assert self._proc is not None and self._proc.stdout is not None
        while True:
            line = self._proc.stdout.readline()
            if not line:
                code = self._proc.wait()
                raise ChatError(message=f"the inference server ended (exit {code}): {self._stderr_tail()}",
                                fix=f"see {self.log_path}")
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not ours (a library that wrote to the real stdout): skip it
            if isinstance(event, dict):
                return event

    def _stderr_tail(self) -> str:
        try:
            lines = [ln for ln in Path(self.log_path).read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no log"
        errors = [ln for ln in lines if "Error" in ln or "error" in ln]
        return (errors or lines or ["no output"])[-1][:300]

    def _send(self, request: dict) -> None:
        if not self.alive:
            raise ChatError(message="the inference server is not running", fix="start the chat again")
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(request) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise ChatError(message=f"the inference server ended: {self._stderr_tail()}",
                            fix=f"see {self.log_path}") from None

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin:
                proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                proc.stdin.flush()
                proc.stdin.close()
        except (BrokenPipeError, OSError, ValueError):
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if self._log:
            self._log.close()

    def __enter__(self) -> "ChatSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ asking

    def stream(self, messages: list[dict], model: str = "tuned", settings: dict | None = None) -> Iterator[dict]:
        """Events of one answer: loading/loaded (a model's first use), token..., then done
        (or error, which ends it too)."""
        with self._lock:
            self._next_id += 1
            ident = self._next_id
            merged = {**self.overrides, **(settings or {})}
            self._send({"op": "generate", "id": ident, "model": model, "messages": messages, "settings": merged})
            while True:
                event = self._read()
                kind = event.get("event")
                if kind in ("loading", "loaded"):
                    yield event
                elif event.get("id") == ident:
                    yield event
                    if kind in ("done", "error"):
                        return

    def ask(self, text: str, model: str = "tuned", on_event=None, images: list[str] | None = None) -> dict:
        """The answer of `model` to `text` (with `images`, paths a vision-language model sees before
        the text), following its own history (none in single-turn mode); the done (or error) event."""
        history = self.history.setdefault(model, [])
        turn: dict = {"role": "user", "content": text}
        if images:
            turn["images"] = [str(Path(p).expanduser().resolve()) for p in images]
        messages = [*([] if self.single_turn else history), turn]
        last: dict = {}
        for event in self.stream(messages, model):
            if on_event:
                on_event(event)
            last = event
        if last.get("event") == "done" and not self.single_turn:
            history[:] = [*messages, {"role": "assistant", "content": last.get("text", "")}]
        return last

    def answering_settings(self) -> dict:
        """The settings this session's answers use: the run's [generate] table with the overrides.
        An arena gives them to the other run's session, so both answer a prompt alike."""
        return {k: v for k, v in {**self.settings, **self.overrides}.items() if k in SETTING_KEYS and v is not None}

    def reset(self) -> None:
        for history in self.history.values():
            history.clear()


def check_image(path: str) -> str:
    """An image to attach to a message: its absolute path, or UserError naming the problem (before
    anything is sent)."""
    text = str(path).strip()
    if not text:
        raise UserError(message="no image path given", fix="e.g. /image pictures/cat.png")
    resolved = str(Path(text).expanduser().resolve())
    try:
        check_image_file(resolved)
    except ImageProblem as problem:
        raise UserError(message=problem.message, fix=problem.fix) from None
    return resolved


def image_label(path: str) -> str:
    """'cat.png (64x64 PNG)' for a line that says what is attached."""
    try:
        width, height, kind = check_image_file(path)
    except ImageProblem:
        return Path(path).name
    return f"{Path(path).name} ({width}x{height} {kind})"


EDITABLE = {"temperature": float, "top_p": float, "max_new_tokens": int, "repetition_penalty": float}
ALIASES = {"temp": "temperature", "t": "temperature", "p": "top_p", "top-p": "top_p", "max_tokens": "max_new_tokens",
           "tokens": "max_new_tokens", "max-new-tokens": "max_new_tokens"}


def settings_text(settings: dict) -> str:
    """The editable settings as `temperature=0.7 top_p=0.9 max_new_tokens=128` (parse_settings reads it back)."""
    return " ".join(f"{key}={settings[key]:g}" if isinstance(settings[key], float) else f"{key}={settings[key]}"
                    for key in EDITABLE if settings.get(key) is not None)


def parse_settings(text: str) -> dict:
    """`temperature=0.7 top_p=0.9 max_new_tokens=64` (spaces or commas between) as overrides, checked
    as the CLI's flags are; an empty text is no override (the run's [generate] table)."""
    out: dict = {}
    for item in text.replace(",", " ").split():
        key, sep, raw = item.partition("=")
        key = ALIASES.get(key.strip().lower(), key.strip().lower())
        if not sep or key not in EDITABLE:
            raise RunError(message=f"'{item}' is not a generation setting",
                           fix="write key=value with a key of: " + ", ".join(EDITABLE))
        try:
            out[key] = EDITABLE[key](raw)
        except ValueError:
            raise RunError(message=f"{key}: '{raw}' is not a number", fix=f"e.g. {settings_text({key: 1})}") from None
    return check_overrides(out)


def rate_text(tokens: int, seconds: float) -> str:
    """'32 tokens in 0.41 s · 78 tokens/s': enough digits that a fast answer does not read 0.0s."""
    if seconds <= 0:
        return f"{tokens} tokens"
    shown = f"{seconds:.2f}" if seconds < 10 else f"{seconds:.1f}"
    rate = tokens / seconds
    return f"{tokens} token{'s' if tokens != 1 else ''} in {shown} s · {rate:,.0f} tokens/s" if rate >= 10 else \
        f"{tokens} token{'s' if tokens != 1 else ''} in {shown} s · {rate:.1f} tokens/s"


def check_overrides(values: dict) -> dict:
    """Generation settings given on the command line (None = the run's own)."""
    out = {k: v for k, v in values.items() if k in SETTING_KEYS and v is not None}
    if "temperature" in out and not 0 <= out["temperature"] <= 5:
        raise RunError(message=f"temperature {out['temperature']} is out of range", fix="use 0 (greedy) to 5")
    if "top_p" in out and not 0 < out["top_p"] <= 1:
        raise RunError(message=f"top_p {out['top_p']} is out of range", fix="use a value in (0, 1]")
    if "max_new_tokens" in out and out["max_new_tokens"] < 1:
        raise RunError(message="max_new_tokens must be at least 1", fix="e.g. --max-new-tokens 128")
    return out
