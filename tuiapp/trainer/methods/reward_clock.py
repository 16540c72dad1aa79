"""Rewards under a clock: each call of a user's reward function in training gets the recipe's
timeout (the pre-launch check's 60 s by default), and a function that returns only NaN/None for
`bad_steps` calls in a row is caught. Either ends the run naming the function and its file:line
(on_error 'fail'), or scores that call None, which TRL ignores, and goes on ('skip', with a warning).

The timeout is SIGALRM on the rank's main thread (where the Trainer calls rewards): the handler
raises inside the hung call, so the error names the line it hung on. Off the main thread (never in
a rank) calls run without a clock.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import traceback
from pathlib import Path


class RewardTimeout(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise RewardTimeout in the running code once `seconds` have passed."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise RewardTimeout(f"did not return within {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def all_bad(scores) -> bool:
    """Every completion scored None or NaN (or nothing returned at all)."""
    if scores is None:
        return True
    try:
        values = list(scores)
    except TypeError:
        return False
    return all(v is None or (isinstance(v, float) and math.isnan(v)) for v in values)


def where(exc: BaseException, path: Path) -> str | None:
    """file:line of the deepest frame of the user's file in the exception's traceback."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path]
    return f"{path}:{frames[-1].lineno}" if frames else None


def defined_at(func, path: Path) -> str:
    code = getattr(func, "__code__", None)
    return f"{path}:{code.co_firstlineno}" if code is not None else str(path)


class Guard:
    """One reward function's clock and its run of NaN/None calls."""

    def __init__(self, label: str, function: str, func, path: Path, timeout_s: float, on_error: str, bad_steps: int,
                 fail):
        self.label, self.function, self.func, self.path = label, function, func, path
        self.timeout_s, self.on_error, self.bad_steps = timeout_s, on_error, bad_steps
        self.fail = fail  # (message, exc) -> raises the trainer's RewardFunctionError
        self.bad_in_a_row = 0

    def call(self, count: int, step, **kwargs):
        try:
            with deadline(self.timeout_s):
                scores = self.func(**kwargs)
        except RewardTimeout as exc:
            at = where(exc, self.path) or defined_at(self.func, self.path)
            message = (f"reward function {self.function} ({defined_at(self.func, self.path)}) did not return within "
                       f"{self.timeout_s:g}s at step {step}; it was at {at}")
            return self._bad(message, count, exc)
        if not all_bad(scores):
            self.bad_in_a_row = 0
            return scores
        self.bad_in_a_row += 1
        if self.bad_in_a_row < self.bad_steps:
            return scores
        calls = f"{self.bad_in_a_row} steps in a row" if self.bad_in_a_row > 1 else f"step {step}"
        message = (f"reward function {self.function} ({defined_at(self.func, self.path)}) returned NaN/None for every "
                   f"completion at {calls}: nothing can be learned from it")
        return self._bad(message, count, None)

    def _bad(self, message: str, count: int, exc: BaseException | None):
        if self.on_error == "fail":
            self.fail(message + " (on_error = 'skip' in its [[method.rewards]] table scores such calls None and "
                      "goes on)", exc)
        print(f"warning: {message}; skipped (on_error = 'skip'): scored None", flush=True)
        self.bad_in_a_row = 0
        return [None] * count
