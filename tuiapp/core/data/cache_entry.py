"""A tokenization cache entry that verifies itself (pure stdlib: the trainer writes entries, the CLI
lists them, neither needs the other).

At write, llmtui.json records `manifest`: each data file's size and sha256. On load (and in `llmtui
cache list`) `problem` compares the files with it: a missing, truncated, grown or changed file is a
damaged entry, named with its path; the trainer then rebuilds it (tuiapp.trainer.dataset.tokenize_cache).
An entry written before manifests existed has none: it is checked by loading it (Arrow's own checks
of the files' framing), and `cache list` shows it as unverified.
Hashing reads the files once per load: about 2.3 s per GB on this 2-core machine, next to the minutes a build takes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ENTRY_INFO = "llmtui.json"
CHUNK = 1 << 22


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest(folder: Path) -> dict[str, dict]:
    """{relative path: {"bytes", "sha256"}} of every file of the entry but its llmtui.json."""
    out = {}
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name == ENTRY_INFO or name.startswith(f".{ENTRY_INFO}"):
            continue
        out[name] = {"bytes": path.stat().st_size, "sha256": file_digest(path)}
    return out


def read_info(folder: Path) -> dict | None:
    """The entry's llmtui.json; None when it is missing or does not parse."""
    try:
        info = json.loads((Path(folder) / ENTRY_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def problem(folder: Path, *, checksums: bool = True) -> str | None:
    """Why the entry is damaged (None: its files are as written, or it has no manifest to check)."""
    folder = Path(folder)
    info = read_info(folder)
    if info is None:
        return f"{folder / ENTRY_INFO} is missing or does not parse"
    recorded = info.get("manifest")
    if not isinstance(recorded, dict):
        return None  # written before manifests: loading it checks the files
    for name, want in sorted(recorded.items()):
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{path} is missing"
        if size != want.get("bytes"):
            return f"{path} is {size:,} bytes, {want.get('bytes'):,} when it was written (truncated or overwritten)"
        if checksums and file_digest(path) != want.get("sha256"):
            return f"{path} changed since it was written (its sha256 differs)"
    return None


def state(folder: Path, *, checksums: bool = True) -> tuple[str, str | None]:
    """('ok' | 'damaged' | 'unverified', why) for `llmtui cache list`."""
    why = problem(folder, checksums=checksums)
    if why:
        return "damaged", why
    info = read_info(folder) or {}
    return ("ok", None) if isinstance(info.get("manifest"), dict) else ("unverified", "written before checksums")
