"""ruff (rules F, I, B; configured in pyproject.toml) finds nothing in the code, the tests and the benchmarks."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff() -> list[str]:
    beside_python = Path(sys.executable).parent / "ruff"  # the venv's own, pinned in the test extra
    if beside_python.is_file():
        return [str(beside_python)]
    if shutil.which("ruff"):
        return ["ruff"]
    return [sys.executable, "-m", "ruff"]


def test_ruff_finds_nothing():
    cmd = [*ruff(), "check", "--no-cache", "--output-format", "concise", "tuiapp", "tests", "bench"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (
        f"`{' '.join(cmd)}` found problems (fix them; many with `ruff check --fix`):\n{result.stdout}{result.stderr}"
    )
