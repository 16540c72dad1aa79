"""What the history's management keys ask of core, as plain blocking functions (called from
thread workers): tags, notes, display names, archive, delete, and the queue's order. The same
calls `llmtui tag/note/rename/archive/delete/queue move` make (tuiapp.core.store.meta and .queue
decide; these only call them), so they raise the same UserError (RunError) on a refusal."""

from __future__ import annotations

from pathlib import Path

from tuiapp.core.common.errors import RunError
from tuiapp.core.store import meta, queue
from tuiapp.core.store.runs import Run

QUEUE_MOVES = ("top", "up", "down", "bottom")


def change_tags(run_path: Path, text: str) -> dict:
    """'+a -b c' (a bare name adds); meta.json afterwards."""
    changes = text.split()
    if changes:
        meta.change_tags(run_path, changes)
    return meta.read_meta(run_path)


def set_note(run_path: Path, text: str) -> dict:
    meta.set_note(run_path, text)
    return meta.read_meta(run_path)


def rename(run_path: Path, name: str) -> dict:
    """The name the run is shown with (empty: its recipe's name again)."""
    meta.set_display_name(run_path, name)
    return meta.read_meta(run_path)


def set_archived(run_path: Path, archived: bool) -> dict:
    meta.set_archived(run_path, archived)
    return meta.read_meta(run_path)


def delete(run_path: Path) -> Path:
    """Move a run that is not live to runs/.trash/ (a live run: RunError with its fix)."""
    return meta.delete(Run(run_path).load(), run_path.parent)


def move(runs_root: Path, run_id: str, where: str) -> dict[str, int]:
    """Reorder a queued run (top, up, down, bottom); every queued run's place afterwards."""
    try:
        order = queue.move(runs_root, run_id, where)
    except KeyError:
        status = Run(Path(runs_root) / run_id).load().status
        raise RunError(message=f"{run_id} is not waiting in the queue ({status})",
                       fix="only a queued run can be moved; see `llmtui queue`") from None
    return {entry.run_id: index for index, entry in enumerate(order, start=1)}
