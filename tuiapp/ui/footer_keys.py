"""What the footer shows when not every key fits, and counts in words.

A screen names its actions in order of importance; the footer shows as many of them as fit
the width (in the screen's binding order), so a narrow footer is never cut mid-word. The help
screen and the command palette still list every key."""

from __future__ import annotations

from dataclasses import replace

from textual.app import App
from textual.binding import ActiveBinding

from tuiapp.core.run_folder.progress import plural  # noqa: F401 (the UI's word counts: '1 rank', '2 ranks')

PALETTE_CELLS = 13  # the docked "▏^p palette" key at the right


def footer_by_priority(app: App, bindings: dict[str, ActiveBinding], priority: list[str],
                       width: int) -> dict[str, ActiveBinding]:
    """The active bindings with the shown ones cut to those that fit `width`, most important first
    (actions not in `priority` come last, in binding order)."""
    shown = [(key, active) for key, active in bindings.items() if active.binding.show]
    rank = {action: index for index, action in enumerate(priority)}
    order = sorted(range(len(shown)), key=lambda i: rank.get(shown[i][1].binding.action, len(rank) + i))
    room, keep = width - PALETTE_CELLS, set()
    for index in order:
        binding = shown[index][1].binding
        cells = len(app.get_key_display(binding)) + len(binding.description) + 2
        if cells > room:
            break
        room -= cells
        keep.add(shown[index][0])
    return {key: active if key in keep or not active.binding.show
            else active._replace(binding=replace(active.binding, show=False)) for key, active in bindings.items()}

