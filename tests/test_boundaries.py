"""The CLI and core never import torch, transformers, deepspeed or textual."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = ["torch", "transformers", "deepspeed", "textual", "peft", "datasets"]
# every command group of the CLI package: what the bare `llmtui` must not load
SUBCOMMAND_MODULES = sorted(f"tuiapp.cli.{path.stem}" for path in (ROOT / "tuiapp" / "cli").glob("*.py")
                            if not path.stem.startswith("__"))


def imported_of(modules: list[str], unwanted: list[str]) -> list[str]:
    """Which of `unwanted` a fresh interpreter has loaded after importing `modules`."""
    code = f"import sys, {', '.join(modules)}; print([m for m in {unwanted!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return ast.literal_eval(out.stdout.strip())


def test_core_and_cli_import_no_heavy_modules():
    modules = [*SUBCOMMAND_MODULES, "tuiapp.core.checks", "tuiapp.core.supervisor", "tuiapp.core.launcher"]
    assert imported_of(modules, FORBIDDEN) == []


def test_ui_imports_no_torch():
    assert imported_of(["tuiapp.ui.app"], ["torch", "transformers", "deepspeed", "tuiapp.trainer"]) == []


def test_import_contracts_hold():
    """pyproject's import-linter contracts: core layers without cycles, pure core, UI without torch."""
    linter = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(linter), "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


def test_the_tui_starts_without_the_schema_or_the_subcommands():
    """The bare `llmtui` imports what the history's first rows need: not pydantic (the recipe
    schema, ~0.2 s), the subcommands, sweeps or numpy (bench/bench_ui.py's start-up)."""
    modules = ["tuiapp.cli.__main__", "tuiapp.ui.launch", "tuiapp.core.runs", "tuiapp.core.errors", "tuiapp.ui.app"]
    unwanted = ["pydantic", "tuiapp.core.recipe", *SUBCOMMAND_MODULES, "tuiapp.core.sweep", "numpy", "torch"]
    assert "tuiapp.cli.main" in SUBCOMMAND_MODULES and "tuiapp.cli.runs" in SUBCOMMAND_MODULES
    assert imported_of(modules, unwanted) == []


def test_a_run_or_compare_opens_without_the_schema():
    """The run view and compare import no pydantic either (the recipe schema took ~0.5 s the first
    time one of them opened)."""
    modules = ["tuiapp.ui.screens.compare", "tuiapp.ui.screens.run_view"]
    assert imported_of(modules, ["pydantic", "tuiapp.core.recipe", "tuiapp.cli"]) == []


def test_the_bare_command_is_told_from_subcommands():
    from tuiapp.cli.__main__ import tui_runs_dir

    assert tui_runs_dir([]) == (True, None)
    assert tui_runs_dir(["--runs-dir", "r"]) == (True, "r")
    assert tui_runs_dir(["--runs-dir=r"]) == (True, "r")
    for argv in (["run", "x.toml"], ["--help"], ["--runs-dir", "r", "ls"], ["--runs-dir"], ["--runs-dir="], ["-h"]):
        assert tui_runs_dir(argv) == (False, None), argv
