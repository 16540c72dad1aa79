"""`open_tui`: the TUI on a runs folder, for the bare `llmtui` command. Imports the app only when
called, so the command line decides first whether the TUI is wanted at all."""

from __future__ import annotations


def open_tui(runs_dir: str | None) -> int:
    """The TUI on a runs folder (None: $LLMTUI_RUNS_DIR or ./runs) until the user quits."""
    from tuiapp.core.store.runs import RunStore
    from tuiapp.ui.app import run_app

    return run_app(RunStore(runs_dir).root)
