"""Tools under a clock: each call of a recipe's tool (a `[[method.tools]]` function or an environment's
method) in training runs with a timeout, its result cut to the token budget; a call that raises, hangs
or returns garbage ends with an error turn (`error: ...`, what the model reads) and a line in the run
folder's tool_errors.jsonl, and the run goes on. Past `limit` such calls in a row (a broken tool fails call
after call; a sampled bad expression between good calls is the policy's mistake, which it learns from) the
guard holds a fatal message naming the tool and its file:line, which the trainer raises after the step's
generation (TRL catches what a tool raises, so the run cannot be failed from inside the call). A call whose
arguments do not fit the tool's signature is the model's alone: an error turn and a line ("bad call"), never
counted towards the limit.

Each call runs in its own daemon thread that is never joined: a tool that hangs forever is left behind
and cannot hold the rank's exit (concurrent.futures joins its workers at interpreter exit) nor the
calls after it (a pool's workers would be used up).
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
import time
import traceback
from pathlib import Path

from tuiapp.core.config.tools import tool_output
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.rundir import RunDir

TOOL_ERRORS_FILE = rundir.TOOL_ERRORS_JSONL
BAD_CALL = "bad call"  # tool_errors.jsonl's kind of a call whose arguments do not fit the tool


class ToolError(RuntimeError):
    """Too many tool calls failed: the message names the tool and its file:line."""


def where(func) -> str:
    """FILE:LINE of a function's definition."""
    func = inspect.unwrap(func)
    try:
        return f"{inspect.getsourcefile(func)}:{inspect.getsourcelines(func)[1]}"
    except (OSError, TypeError):
        return getattr(func, "__module__", "?")


def _raised_at(exc: BaseException, func) -> str:
    source = inspect.getsourcefile(inspect.unwrap(func)) if callable(func) else None
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if source and f.filename == source]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else where(func)


class _Outcome:
    """What one tool call ended with, set by its daemon thread."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value = None
        self.error: BaseException | None = None


def _call_detached(func, args: tuple, kwargs: dict, timeout_s: float) -> _Outcome | None:
    """func(*args, **kwargs) in a daemon thread nobody joins; None when it did not end within timeout_s."""
    outcome = _Outcome()

    def run() -> None:
        try:
            outcome.value = func(*args, **kwargs)
        except BaseException as exc:  # handed to the caller, as a future would
            outcome.error = exc
        finally:
            outcome.done.set()

    threading.Thread(target=run, name="llmtui-tool", daemon=True).start()
    return outcome if outcome.done.wait(timeout_s) else None


def _bad_arguments(func, args: tuple, kwargs: dict) -> str:
    """Why the arguments do not fit func's signature ('' when they do, or it has none to read)."""
    try:
        signature = inspect.signature(func, follow_wrapped=False)  # a bound method's: without self
    except (TypeError, ValueError):
        return ""
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return str(exc)
    return ""


class Guard:
    """One run's tool calls: the clock, the budget, the failures in a row and their limit."""

    def __init__(self, timeout_s: float, output_tokens: int, limit: int, run_dir: Path | None = None,
                 tokenizer=None) -> None:
        self.timeout_s = timeout_s
        self.output_tokens = output_tokens
        self.limit = limit
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.tokenizer = tokenizer
        self.errors = 0  # every failed call
        self.in_a_row = 0  # failed calls since the last that worked
        self.calls = 0
        self.fatal: str | None = None
        self.step: int | str = "?"
        self._lock = threading.Lock()

    def cut(self, text: str) -> str:
        """The result within output_tokens tokens (characters x 4 without a tokenizer), '…' marking a cut."""
        if self.tokenizer is None:
            limit = self.output_tokens * 4
            return text if len(text) <= limit else text[:limit] + "…"
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= self.output_tokens:
            return text
        return self.tokenizer.decode(ids[: self.output_tokens]) + "…"

    def _record(self, name: str, func, kind: str, message: str, at: str) -> str:
        with self._lock:
            self.errors += 1
            self.in_a_row += kind != BAD_CALL
            if self.in_a_row > self.limit and self.fatal is None:
                self.fatal = (f"tool {name} ({at}) {message}; {self.in_a_row} tool calls in a row failed, past "
                              f"method.tool_error_limit ({self.limit})")
            if self.run_dir is not None:
                record = {"time": time.time(), "step": self.step, "tool": name, "kind": kind, "error": message,
                          "at": at}
                with RunDir(self.run_dir).tool_errors.open("a", encoding="utf-8") as handle:
                    handle.write(json.dumps(record) + "\n")
        return f"error: {message}"

    def call(self, name: str, func, args: tuple, kwargs: dict) -> str:
        """The tool's result as text, or an error turn."""
        with self._lock:
            self.calls += 1
        mistake = _bad_arguments(func, args, kwargs)
        if mistake:  # the model's call, not the tool: what it reads, and learns from
            return self._record(name, func, BAD_CALL, f"bad arguments: {mistake}", where(func))
        outcome = _call_detached(func, args, kwargs, self.timeout_s)
        if outcome is None:  # the thread stays behind, a daemon: it cannot hold the process
            return self._record(name, func, "timeout", f"did not return within {self.timeout_s:g}s", where(func))
        try:
            if outcome.error is not None:
                raise outcome.error
            value = outcome.value
        except Exception as exc:  # the tool's own error: the rollout reads it, the run goes on
            return self._record(name, func, "raised", f"raised {type(exc).__name__}: {exc}", _raised_at(exc, func))
        text = tool_output(value)
        if text is None:
            return self._record(name, func, "garbage", f"returned {type(value).__name__} {repr(value)[:80]}, not "
                                "text, a number or JSON data", where(func))
        with self._lock:
            self.in_a_row = 0
        return self.cut(text)

    def wrap(self, func, name: str | None = None):
        """func with the same signature and docstring (TRL builds the tool's schema from them), guarded."""
        label = name or func.__name__

        @functools.wraps(func)
        def guarded(*args, **kwargs):
            return self.call(label, func, args, kwargs)

        return guarded

    def wrap_class(self, cls):
        """A subclass of an environment class whose public methods (the tools) are guarded; reset is not."""
        guard = self
        members = {}
        for member, value in inspect.getmembers(cls, predicate=inspect.isfunction):
            if member.startswith("_") or member in ("reset", "get_reward"):
                continue

            def make(method, label):
                @functools.wraps(method)
                def guarded(self, *args, **kwargs):
                    return guard.call_method(label, method, self, args, kwargs)

                return guarded

            members[member] = make(value, member)
        return type(cls.__name__, (cls,), members)

    def call_method(self, name: str, method, instance, args: tuple, kwargs: dict) -> str:
        bound = functools.partial(method, instance)
        functools.update_wrapper(bound, method)
        return self.call(name, bound, args, kwargs)

    def check(self) -> None:
        """Raise the fatal message once the errors passed the limit."""
        if self.fatal is not None:
            raise ToolError(self.fatal)
