"""What the user says about a run: tags, notes, a display name, archived; and deleting runs.

Kept in runs/<id>/meta.json, apart from run.json (which the run's supervisor owns while it
lives), so tagging a live run never races its status. Deleted runs go to runs/.trash/ and are
purged after TRASH_DAYS (or by `llmtui trash --purge`).
"""

from __future__ import annotations

import json
import re
import shutil
import time
import unicodedata
from pathlib import Path

from tuiapp.core.common.errors import RunError, UserError
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.rundir import ACTIVE, RunDir

META_NAME = rundir.META_JSON
TRASH_DIR = ".trash"
TRASH_DAYS = 30.0
TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$")


def read_meta(run_dir: Path) -> dict:
    try:
        data = json.loads(RunDir(run_dir).meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    tags = data.get("tags")
    data["tags"] = [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []
    return data


def _write(run_dir: Path, meta: dict) -> dict:
    atomic_write_text(RunDir(run_dir).meta, json.dumps(meta, indent=2, sort_keys=True))
    return meta


def change_tags(run_dir: Path, changes: list[str]) -> list[str]:
    """'+name' adds, '-name' removes, a bare name adds."""
    meta = read_meta(run_dir)
    tags = list(meta.get("tags") or [])
    for change in changes:
        sign, name = (change[0], change[1:]) if change[:1] in "+-" else ("+", change)
        if not TAG.match(name):
            raise UserError(message=f"'{name}' is not a valid tag",
                            fix="use letters, digits and . _ : / - (at most 64), starting with a letter or digit")
        if sign == "+" and name not in tags:
            tags.append(name)
        elif sign == "-" and name in tags:
            tags.remove(name)
    meta["tags"] = tags
    _write(run_dir, meta)
    return tags


def printable(text: str, what: str) -> str:
    """Text shown in terminals and the TUI: control characters (an escape sequence that clears the
    screen or retitles the terminal) are refused, not stored and echoed."""
    bad = sorted({c for c in text if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co") and c != "\t"})
    if bad:
        shown = ", ".join(repr(c) for c in bad[:5])
        raise UserError(message=f"the {what} holds control characters ({shown})",
                        fix=f"use printable text for the {what}")
    return text


def set_note(run_dir: Path, text: str) -> None:
    meta = read_meta(run_dir)
    meta["note"] = printable(text, "note").strip()
    _write(run_dir, meta)


def set_display_name(run_dir: Path, name: str) -> None:
    meta = read_meta(run_dir)
    meta["display_name"] = printable(name, "name").strip() or None
    _write(run_dir, meta)


def set_archived(run_dir: Path, archived: bool) -> None:
    meta = read_meta(run_dir)
    meta["archived"] = bool(archived)
    _write(run_dir, meta)


def trash_dir(runs_root: Path) -> Path:
    return Path(runs_root) / TRASH_DIR


def delete(run, runs_root: Path) -> Path:
    """Move a run that is not live into the trash; its new path. A live run is refused."""
    run.refresh_truth()
    if run.status in ACTIVE:
        raise RunError(message=f"{run.id} is {run.status}; a live run cannot be deleted",
                       fix=f"stop it first (`llmtui stop {run.id}`)")
    target = trash_dir(runs_root) / f"{run.id}"
    if target.exists():
        target = target.with_name(f"{run.id}.{int(time.time())}")
    target.parent.mkdir(parents=True, exist_ok=True)
    meta = read_meta(run.path)
    meta["deleted"] = time.time()
    _write(run.path, meta)
    run.path.rename(target)
    return target


def restore(run_id: str, runs_root: Path) -> Path:
    source = trash_dir(runs_root) / run_id
    if not source.is_dir():
        raise RunError(message=f"no run '{run_id}' in the trash", fix="see `llmtui trash`")
    target = Path(runs_root) / run_id.split(".")[0]
    if target.exists():
        raise RunError(message=f"{target} exists", fix="rename or delete it first")
    meta = read_meta(source)
    meta.pop("deleted", None)
    _write(source, meta)
    source.rename(target)
    return target


def trashed(runs_root: Path) -> list[tuple[Path, float]]:
    """Runs in the trash and when they were deleted (oldest first)."""
    out = []
    for path in trash_dir(runs_root).glob("*"):
        if path.is_dir():
            out.append((path, float(read_meta(path).get("deleted") or path.stat().st_mtime)))
    return sorted(out, key=lambda item: item[1])


def purge(runs_root: Path, older_than_days: float = TRASH_DAYS, now: float | None = None) -> list[str]:
    """Remove trashed runs deleted more than `older_than_days` ago; their names."""
    now = time.time() if now is None else now
    gone = []
    for path, deleted in trashed(runs_root):
        if now - deleted >= older_than_days * 86400:
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path.name)
    return gone
