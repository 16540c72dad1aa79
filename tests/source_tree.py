"""tuiapp's source files, listed and parsed once per test session: the structure tests walk them all."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def tuiapp_files() -> tuple[Path, ...]:
    return tuple(sorted((ROOT / "tuiapp").rglob("*.py")))


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The module's syntax tree; shared between tests, so only read, never changed."""
    return ast.parse(path.read_text(encoding="utf-8"), str(path))
