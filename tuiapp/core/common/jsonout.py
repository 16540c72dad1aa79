"""Machine-readable output stays pure: one JSON document on stdout, everything else on stderr.

Libraries print to stdout behind our back (DeepSpeed's logger holds a handler on sys.stdout and
says 'Setting accelerator to CPU' on first import; C extensions write to fd 1 directly). Hoping
each logger was configured is not enough, so `stdout_to_stderr` works at the file-descriptor
level: while the tool works, fd 1 (and so sys.stdout) is a copy of fd 2, and the document is
written to the original stdout, which the context hands out as a stream.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from typing import IO, Iterator

from tuiapp.core.common.errors import UserError


@contextmanager
def stdout_to_stderr() -> Iterator[IO[str]]:
    """Point fd 1 at stderr for the body; yield a text stream on the real stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    out = os.fdopen(os.dup(saved), "w", encoding="utf-8")
    try:
        yield out
    finally:
        try:
            sys.stdout.flush()  # what libraries buffered goes to stderr, where it belongs
        except (OSError, ValueError):
            pass
        try:
            out.flush()
        except BrokenPipeError:
            pass
        finally:
            try:
                out.close()
            except BrokenPipeError:
                pass
            os.dup2(saved, 1)
            os.close(saved)


def error_document(exc: UserError) -> dict:
    """A user error as the one JSON document of a --json command."""
    return {"error": {"message": exc.message, "file": exc.file, "line": exc.line, "key": exc.key,
                      "fix": exc.fix, "text": str(exc)}}


def write_document(out: IO[str], document) -> None:
    out.write(json.dumps(document, indent=2, ensure_ascii=False, default=str) + "\n")
    out.flush()
