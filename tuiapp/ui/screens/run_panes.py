"""Moved to tuiapp.ui.run_panes (pure text, not a screen); this name stays for old imports."""

from tuiapp.ui.run_panes import memory_text, node_text, samples_text, speed_text, status_text  # noqa: F401
