"""Fixtures of the core tests: a copy of the fixture runs (tests/fixtures/runs) to work on."""

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "runs"
SFT = "20260101-000218-sft-f004"
CRASHED = "20260101-000343-crashed-f006"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    shutil.copytree(FIXTURES, root)
    return root
