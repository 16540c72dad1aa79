"""`llmtui cache list|prune`: the tokenized datasets in the cache ($LLMTUI_CACHE/data, written by
tuiapp.trainer.dataset.tokenize_cache), their size and last use, and removing the ones no run needs.
Pure stdlib: no torch, no datasets."""

from __future__ import annotations

import fcntl
import json
import shutil
import sys
import time
from pathlib import Path

from tuiapp.cli import numbers
from tuiapp.core.common.built_folder import cache_root
from tuiapp.core.common.errors import EXIT_OK, UserError
from tuiapp.core.common.jsonout import write_document
from tuiapp.core.data import cache_entry
from tuiapp.core.run_folder.progress import fmt_bytes, fmt_duration

ENTRY_INFO = cache_entry.ENTRY_INFO


def entries(root: Path, checksums: bool = False) -> list[dict]:
    """Each tokenized dataset: key, path, bytes, built/used times, what it holds and its state (ok,
    damaged with why, unverified: written before checksums), newest use first. Sizes are always
    checked against the entry's manifest; `checksums` reads every file too."""
    folder = root / "data"
    out = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if not path.is_dir() or path.name.startswith("."):
            continue
        try:
            info = json.loads((path / ENTRY_INFO).read_text())
        except (OSError, ValueError):
            info = {}
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        used = info.get("used") or path.stat().st_mtime
        verdict, why = cache_entry.state(path, checksums=checksums)
        out.append({"key": path.name, "path": str(path), "bytes": size, "used": used, "built": info.get("built"),
                    **{k: info.get(k) for k in ("source", "method", "max_seq_len", "tokenizer", "documents", "rows")},
                    "state": verdict, "problem": why})
    return sorted(out, key=lambda e: -e["used"])


def _busy(root: Path, key: str) -> bool:
    """A rank holds the entry's lock (building it, or about to load it)."""
    lock = root / "locks" / f"data-{key}.lock"
    if not lock.exists():
        return False
    with open(lock, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def cmd_cache_list(args) -> int:
    root = cache_root()
    found = entries(root, checksums=not args.quick)
    if args.json:
        write_document(sys.stdout, {"cache": str(root / "data"), "entries": found,
                                    "bytes": sum(e["bytes"] for e in found)})
        return EXIT_OK
    if not found:
        print(f"no tokenized datasets in {root / 'data'}")
        return EXIT_OK
    now = time.time()
    print(f"{'key':<17} {'size':>9} {'used':>9}  {'rows':>9}  {'state':<10}  data")
    for e in found:
        what = f"{e.get('source') or '?'} ({e.get('method') or '?'}, max_seq_len {e.get('max_seq_len') or '?'})"
        print(f"{e['key']:<17} {fmt_bytes(e['bytes']):>9} {fmt_duration(now - e['used']) + ' ago':>9}  "
              f"{e.get('rows') if e.get('rows') is not None else '-':>9}  {e['state']:<10}  {what}")
        if e["state"] == "damaged":
            print(f"  ! {e['problem']} (the next run that needs it rebuilds it; or `llmtui cache prune --damaged`)")
    damaged = sum(e["state"] == "damaged" for e in found)
    print(f"{len(found)} entries, {fmt_bytes(sum(e['bytes'] for e in found))} in {root / 'data'}"
          + (f", {damaged} damaged" if damaged else ""))
    return EXIT_OK


def cmd_cache_prune(args) -> int:
    if args.older_than is None and not args.all and not args.damaged:
        raise UserError(message="say what to remove", key="cache prune",
                        fix="--older-than DAYS (entries not used for that long), --damaged or --all")
    if args.older_than is not None and args.older_than < 0:
        raise UserError(message=f"--older-than {args.older_than} is negative", fix="give a number of days, e.g. 30")
    root = cache_root()
    limit = time.time() - (args.older_than or 0) * 86400
    removed, kept_busy, freed = [], [], 0
    for e in entries(root, checksums=args.damaged):
        chosen = args.all or (args.older_than is not None and e["used"] <= limit) or \
            (args.damaged and e["state"] == "damaged")
        if not chosen:
            continue
        if _busy(root, e["key"]):
            kept_busy.append(e["key"])
            continue
        removed.append(e["key"])
        freed += e["bytes"]
        if not args.dry_run:
            shutil.rmtree(e["path"], ignore_errors=True)
            (root / "locks" / f"data-{e['key']}.lock").unlink(missing_ok=True)
    verb = "would remove" if args.dry_run else "removed"
    print(f"{verb} {len(removed)} entries ({fmt_bytes(freed)})" + "".join(f"\n  {k}" for k in removed))
    for key in kept_busy:
        print(f"kept {key}: a run is using it")
    return EXIT_OK


def add_command(add) -> None:
    p = add("cache", lambda args: args.cache_func(args), "tokenized datasets in the cache: list, prune")
    sub = p.add_subparsers(dest="cache_command", required=True)
    listing = sub.add_parser("list", help="each tokenized dataset: size, last use, what it holds")
    listing.add_argument("--json", action="store_true")
    listing.add_argument("--quick", action="store_true", help="check the files' sizes only, not their checksums")
    listing.set_defaults(cache_func=cmd_cache_list)
    prune = sub.add_parser("prune", help="remove tokenized datasets (never one a run is using)")
    prune.add_argument("--older-than", type=numbers.non_negative(), default=None, metavar="DAYS", help="not used for DAYS days")
    prune.add_argument("--all", action="store_true", help="every entry")
    prune.add_argument("--damaged", action="store_true", help="entries whose files fail their check")
    prune.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    prune.set_defaults(cache_func=cmd_cache_prune)
