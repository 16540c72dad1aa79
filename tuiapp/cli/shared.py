"""What several command groups share: the error line and a torch-side tool in a child process."""

from __future__ import annotations

import subprocess
import sys


def print_err(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


def trainer_tool(module: str, argv: list[str]) -> int:
    """Run a torch-side tool in a child process, so this process stays free of torch."""
    return subprocess.call([sys.executable, "-m", module, *argv], stdin=subprocess.DEVNULL)
