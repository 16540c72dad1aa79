"""Fixtures of the UI tests; the helpers live in ui_fixtures.py.

`runs_root` is a fresh runs folder holding copies of the real-run fixtures (tests/fixtures/runs,
made by tests/fixtures/make_runs.py), so a test may append to or change them freely.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ui_fixtures import real_runs  # noqa: E402


@pytest.fixture
def runs_root(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    real_runs(root)
    return root
