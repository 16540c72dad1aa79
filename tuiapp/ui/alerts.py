"""What is worth a bell: a run the app knows about ends, fails or is flagged hung, or a sweep
ends. Worked out from the status changes the history loader already sees (no polling of its
own); the home screen rings the terminal bell and shows a toast for each batch. No Textual here.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuiapp.core.run_folder.rundir import ACTIVE, FINAL
from tuiapp.ui.groups import build_groups
from tuiapp.ui.history import RunRow

SEVERITY = {"succeeded": "information", "stopped": "warning", "failed": "error"}


@dataclass(frozen=True)
class Alert:
    title: str
    text: str
    severity: str = "information"  # a Textual notification severity: information, warning, error


def run_alerts(before: dict[str, RunRow], after: list[RunRow], quiet: set[str] = frozenset()) -> list[Alert]:
    """A run that was live and is now final, or newly flagged hung. Runs first seen now (no
    `before`) and runs in `quiet` (the user just stopped them here) say nothing."""
    out = []
    for row in after:
        old = before.get(row.id)
        if old is None or row.id in quiet:
            continue
        if old.status in ACTIVE and row.status in FINAL:
            why = row.why() if row.status != "succeeded" else None
            best = f" · best eval loss {row.best_eval_loss:.4f}" if row.best_eval_loss is not None else ""
            best = f" · {row.held_out_text()}" if row.held_out is not None else best  # grpo/rloo: no eval loss
            text = f"{row.title}: {row.status}" + (f": {why}" if why else best)
            out.append(Alert(f"Run {row.status}", text, SEVERITY[row.status]))
        elif row.hang and not old.hang and row.status in ACTIVE:
            out.append(Alert("Run hung", f"{row.title}: {row.hang.get('message') or 'hung in start-up'}", "warning"))
    return out


def sweep_alerts(ended: list[RunRow], rows: dict[str, RunRow], records: dict[str, dict]) -> list[Alert]:
    """A sweep whose last run just ended (one of `ended`): how many succeeded and the best."""
    ids = {r.group_id for r in ended if r.group_id and r.status in FINAL}
    if not ids:
        return []
    members = [r for r in rows.values() if r.group_id in ids]
    out = []
    for group in build_groups(members, records, set()).values():
        if group.finished:
            succeeded = group.count(("succeeded",))
            out.append(Alert("Sweep finished", f"{group.name}: {succeeded}/{group.total} succeeded · {group.best_text()}",
                             "information" if succeeded == group.total else "warning"))
    return out
