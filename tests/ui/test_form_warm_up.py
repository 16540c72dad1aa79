"""The new-experiment form's modules are imported by the history's worker once its summaries are
done, so the first `n` does not import the recipe schema and the checks on the UI thread."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

DRIVER = r"""
import asyncio, sys, time
from pathlib import Path
from tuiapp.ui.app import LlmtuiApp
from tuiapp.ui.config import UiConfig
root = Path(sys.argv[1])
app = LlmtuiApp(UiConfig(runs_root=root, base_dir=root.parent, system_monitor=False, hf_cache_dirs=[], live=False))
WANTED = ("tuiapp.ui.screens.new_experiment", "tuiapp.core.config.recipe", "tuiapp.core.prelaunch.door")
async def main():
    async with app.run_test(size=(100, 30)) as pilot:
        before = [m for m in WANTED if m in sys.modules]
        deadline = time.monotonic() + 10
        while not all(m in sys.modules for m in WANTED) and time.monotonic() < deadline:
            await pilot.pause(0.05)
        print(before, getattr(app.screen, "summarized", None), [m for m in WANTED if m in sys.modules])
asyncio.run(main())
"""


def test_the_history_imports_the_form_once_idle(tmp_path):
    (tmp_path / "runs").mkdir()
    out = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path / "runs")], capture_output=True, text=True,
                         check=True, cwd=ROOT, timeout=120)
    # none of them at start-up; all of them within seconds of the summaries (none is imported by anything else)
    assert out.stdout.strip().splitlines()[-1] == \
        "[] True ['tuiapp.ui.screens.new_experiment', 'tuiapp.core.config.recipe', 'tuiapp.core.prelaunch.door']", out.stdout
