"""The `llmtui` command (and `python -m tuiapp.cli`). The bare command (the TUI, optionally with
--runs-dir) starts without importing the subcommands' modules: the recipe schema, chat, sweeps and
the rest cost ~0.3 s of the history's start-up and are imported where they are used."""

from __future__ import annotations

import sys


def tui_runs_dir(argv: list[str]) -> tuple[bool, str | None]:
    """(True, runs dir or None) when argv asks for the TUI alone; (False, None) otherwise."""
    if not argv:
        return True, None
    if len(argv) == 2 and argv[0] == "--runs-dir" and argv[1] and not argv[1].startswith("-"):
        return True, argv[1]
    if len(argv) == 1 and argv[0].startswith("--runs-dir=") and len(argv[0]) > len("--runs-dir="):
        return True, argv[0].split("=", 1)[1]
    return False, None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    tui, runs_dir = tui_runs_dir(argv)
    if not tui:
        from tuiapp.cli.main import main as cli_main

        return cli_main(argv)
    from tuiapp.core.common.errors import exit_code
    from tuiapp.ui.launch import open_tui

    return exit_code(lambda: open_tui(runs_dir))


if __name__ == "__main__":
    sys.exit(main())
