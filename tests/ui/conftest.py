"""Fixtures of the UI tests; the helpers live in ui_fixtures.py (synthetic run folders)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ui_fixtures import standard_runs  # noqa: E402


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    standard_runs(root)
    return root
