"""argparse types for the CLI's numbers: each refuses a value out of its range with a message that
says what it takes (`--slots 0` is not taken as 1, `--master-port 70000` is not a port), so that
argparse prints `llmtui run: error: argument --slots: 0 is not allowed: ...` and exits 2."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _number(kind: type, low: float | None, high: float | None, what: str, *, low_open: bool = False,
            name: str = "") -> Callable[[str], int | float]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not {'a whole number' if kind is int else 'a number'}; "
                                             f"it takes {what}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number; it takes {what}")
        below = low is not None and (value <= low if low_open else value < low)
        if below or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range; it takes {what}")
        return value

    parse.__name__ = name or kind.__name__  # argparse names the type in its own messages
    return parse


def count(low: int = 1, what: str = "") -> Callable[[str], int]:
    """A whole number ≥ low (1 by default: slots, nodes, GPUs, steps)."""
    return _number(int, low, None, what or f"a whole number of at least {low}", name="count")


def port(allow_zero: bool = False) -> Callable[[str], int]:
    """A TCP port: 1-65535 (0 too when the port may be picked free)."""
    low = 0 if allow_zero else 1
    return _number(int, low, 65535, f"a port from {low} to 65535", name="port")


def fraction(low_open: bool = False, high: float = 1.0, what: str = "") -> Callable[[str], float]:
    """A number from 0 (excluded when low_open) to `high`."""
    bound = "above 0" if low_open else "from 0"
    return _number(float, 0.0, high, what or f"a number {bound} to {high:g}", low_open=low_open, name="fraction")


def non_negative(what: str = "a number of at least 0") -> Callable[[str], float]:
    """A finite float ≥ 0 (days, seconds, a temperature)."""
    return _number(float, 0.0, None, what, name="number")


def integer(what: str = "a whole number") -> Callable[[str], int]:
    """Any whole number (a priority may be negative)."""
    return _number(int, None, None, what, name="integer")
