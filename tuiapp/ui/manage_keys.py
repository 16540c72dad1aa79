"""Run management keys, shared by the screens that show a run: tags, a note and a display name
(history and run view); archive, delete, the queue's order and cancel (history).

Each screen lists the bindings in its own BINDINGS (the footer, the palette and the help read
them from there) and says which run the keys act on (`managed_run`). The calls into core run in
thread workers (tuiapp.ui.manage); a refusal comes back as ActionFailed, shown by the app.
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.binding import Binding

from tuiapp.core.run_folder.rundir import ACTIVE
from tuiapp.core.store import meta
from tuiapp.ui import actions, manage
from tuiapp.ui.messages import QueueReordered, RunMetaChanged, RunsRemoved, RunStopped, RunStopping
from tuiapp.ui.worker_errors import reports_errors

META_BINDINGS = [
    Binding("number_sign", "tag", "Tag", tooltip="Add (+name) or remove (-name) tags of the run"),
    Binding("N", "note", "Note", tooltip="Write (or clear) a note about the run"),
    Binding("R", "rename", "Rename", tooltip="The name the run is shown with (its folder keeps its id)"),
]
HISTORY_BINDINGS = [
    Binding("x", "stop", "Stop", tooltip="Stop the run (checkpoint first), or cancel a queued one; asks first"),
    Binding("K", "queue('up')", "Queue ▲", tooltip="Move the queued run one place up in the queue"),
    Binding("J", "queue('down')", "Queue ▼", tooltip="Move the queued run one place down in the queue"),
    Binding("F", "queue('top')", "Queue first", tooltip="Move the queued run to the front of the queue"),
    Binding("a", "archive", "Archive", tooltip="Archive the run (hidden from the history), or unarchive it"),
    Binding("A", "show_archived", "Archived", tooltip="Show or hide archived runs"),
    Binding("D,delete", "delete", "Delete", tooltip="Move the run to runs/.trash (asks first; never a live run)"),
]


class Target:
    """The run a key acts on."""

    def __init__(self, run_id: str, path: Path, title: str, status: str) -> None:
        self.run_id = run_id
        self.path = path
        self.title = title
        self.status = status


class RunMetaActions:
    """Tag, note and rename of the screen's run (managed_run); RunMetaChanged when saved."""

    def managed_run(self) -> Target | None:
        raise NotImplementedError

    def action_tag(self) -> None:
        target = self.managed_run()
        if target is None:
            return
        tags = " ".join(f"#{t}" for t in meta.read_meta(target.path).get("tags") or []) or "none"

        def then(text: str | None) -> None:
            if text and text.strip():
                self.change_meta(target, "tag", text)

        self.app.ask(f"Tags of {target.title}", f"now: {tags}\n+name adds, -name removes (a bare name adds)", "", then,
                     placeholder="+baseline -old")

    def action_note(self) -> None:
        target = self.managed_run()
        if target is None:
            return

        def then(text: str | None) -> None:
            if text is not None:
                self.change_meta(target, "note", text)

        note = str(meta.read_meta(target.path).get("note") or "")
        self.app.ask(f"Note on {target.title}", "empty clears it", note, then, placeholder="what this run tries")

    def action_rename(self) -> None:
        target = self.managed_run()
        if target is None:
            return

        def then(text: str | None) -> None:
            if text is not None:
                self.change_meta(target, "rename", text)

        name = str(meta.read_meta(target.path).get("display_name") or "")
        self.app.ask(f"Show {target.title} as", f"its folder stays {target.run_id}; empty: the recipe's name again",
                     name or target.title, then)

    @work(thread=True, group="meta")
    def change_meta(self, target: Target, what: str, value) -> None:
        reports_errors(what)(_apply_meta)(self, target, what, value)


def _apply_meta(node, target: Target, what: str, value) -> None:
    calls = {"tag": manage.change_tags, "note": manage.set_note, "rename": manage.rename,
             "archive": manage.set_archived}
    notes = calls[what](target.path, value)
    node.post_message(RunMetaChanged(target.run_id, notes, what))


class HistoryManageActions(RunMetaActions):
    """Archive, delete, the queue's order and stop/cancel, for the history's cursor run."""

    def action_archive(self) -> None:
        target = self.managed_run()
        if target is not None:
            self.change_meta(target, "archive", not meta.read_meta(target.path).get("archived"))

    def action_delete(self) -> None:
        target = self.managed_run()
        if target is None:
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.delete_run(target)

        self.app.confirm(f"Delete {target.title}?", f"It moves to runs/.trash/ (restore with `llmtui trash --restore "
                         f"{target.run_id}`); purged after {meta.TRASH_DAYS:.0f} days.", answer)

    @work(thread=True, group="delete")
    @reports_errors("delete")
    def delete_run(self, target: Target) -> None:
        manage.delete(target.path)
        self.post_message(RunsRemoved([target.run_id]))

    def action_queue(self, where: str) -> None:
        target = self.managed_run()
        if target is None:
            return
        if target.status != "queued":
            self.notify(f"{target.title} is {target.status}, not waiting in the queue", title="Queue")
            return
        self.move_in_queue(target, where)

    @work(thread=True, group="queue")
    @reports_errors("queue")
    def move_in_queue(self, target: Target, where: str) -> None:
        positions = manage.move(self.app.config.runs_root, target.run_id, where)
        self.post_message(QueueReordered(target.run_id, positions))

    def action_stop(self) -> None:
        target = self.managed_run()
        if target is None:
            return
        if target.status not in ACTIVE:
            self.notify(f"{target.title} is {target.status}: nothing to stop", title="Stop")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.stop_run(target)

        if target.status == "queued":
            self.app.confirm(f"Cancel {target.title}?", "It leaves the queue and never starts.", answer)
        else:
            self.app.confirm(f"Stop {target.title}?", "It saves a checkpoint first; resume later with r in its run view.",
                             answer)

    @work(thread=True, group="control")
    @reports_errors("stop")
    def stop_run(self, target: Target) -> None:
        self.post_message(RunStopping(target.run_id))
        clean, status = actions.stop(target.path)
        self.post_message(RunStopped(target.run_id, clean, status))
