"""User-facing errors: each names where the problem is and how to fix it."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from dataclasses import dataclass

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130  # the `llmtui` commands' exit codes


@dataclass
class UserError(Exception):
    """A problem with the user's input. Printed without a traceback; exit code 2."""

    message: str
    file: str | None = None
    line: int | None = None
    key: str | None = None
    fix: str | None = None

    def __str__(self) -> str:
        where = ""
        if self.file:
            where = self.file
            if self.line:
                where += f":{self.line}"
            where += ": "
        text = where
        if self.key:
            text += f"{self.key}: "
        text += self.message
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class RecipeError(UserError):
    """The recipe is malformed or inconsistent."""


class DatasetError(UserError):
    """The dataset cannot be read or does not match its declared format."""


class RunError(UserError):
    """A run id or directory is unknown or unusable."""


class RecipeErrors(RecipeError):
    """Several recipe problems reported together."""

    def __init__(self, errors: list[RecipeError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def did_you_mean(word: str, choices) -> str | None:
    """A 'did you mean' hint for an unknown name, or None."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean '{matches[0]}'?" if matches else None


def exit_code(command: Callable[[], int]) -> int:
    """A command's exit code: a UserError is printed without a traceback (2), Ctrl-C gives 130,
    and a reader that closed the pipe (`llmtui runs | head`) is no error."""
    try:
        return command()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
