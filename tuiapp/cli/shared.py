"""What several command groups share: the error line, the one JSON document of a --json command, and a
torch-side tool in a child process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

from tuiapp.core.common import trainer_tools
from tuiapp.core.common.errors import EXIT_BAD_INPUT, EXIT_OK, UserError
from tuiapp.core.common.jsonout import error_document, stdout_to_stderr, write_document


def print_err(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


def trainer_tool(tool: str, argv: list[str]) -> int:
    """Run a torch-side tool (a name in trainer_tools.TOOLS) in a child process, so this process stays free
    of torch."""
    return subprocess.call(trainer_tools.argv(tool, argv), stdin=subprocess.DEVNULL)


def json_document(produce: Callable[[], object]) -> int:
    """A --json command's one document on stdout, in every state: what `produce` returns, or the error
    document of its UserError (exit 2); anything else printed meanwhile goes to stderr."""
    with stdout_to_stderr() as out:
        try:
            document = produce()
        except UserError as exc:
            print_err(str(exc))
            write_document(out, error_document(exc))
            return EXIT_BAD_INPUT
        write_document(out, document)
    return EXIT_OK


def saved_result(as_json: bool, produce: Callable[[], dict], table: Callable[[dict], list[str]]) -> int:
    """An evaluation command's output: with --json the result as one document (json_document); else
    its table's lines and 'saved PATH' (the result's file)."""
    if as_json:
        return json_document(produce)
    result = produce()
    print("\n".join(table(result)))
    print(f"saved {result['path']}")
    return EXIT_OK
