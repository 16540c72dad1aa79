"""Telling someone a run ended: the recipe's `[notify] command`, run without a shell, detached.

The command gets LLMTUI_EVENT, LLMTUI_RUN_ID, LLMTUI_RUN_NAME, LLMTUI_STATUS, LLMTUI_REASON and
LLMTUI_RUN_DIR in its environment and a one-line summary on stdin; its output goes to `log` (the
supervisor passes the run's RunDir.notify_log). A notification never holds a run up or fails it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path


def summary(event: str, run_id: str, name: str, reason: str | None) -> str:
    text = f"llmtui: {name} ({run_id}) {event}"
    return text + (f": {reason.splitlines()[0][:300]}" if reason else "")


def send(notify_spec, event: str, run_dir: Path, run_id: str, name: str, status: str,
         reason: str | None = None, log: Path | None = None) -> bool:
    """Start the notify command for `event` if the recipe asks for it; True when started."""
    command = (getattr(notify_spec, "command", "") or "").strip()
    if not command or event not in (getattr(notify_spec, "on", None) or []):
        return False
    try:
        argv = shlex.split(command)
    except ValueError:
        return False
    env = {**os.environ, "LLMTUI_EVENT": event, "LLMTUI_RUN_ID": run_id, "LLMTUI_RUN_NAME": name,
           "LLMTUI_STATUS": status, "LLMTUI_REASON": (reason or "")[:2000], "LLMTUI_RUN_DIR": str(run_dir)}
    try:
        with open(log or os.devnull, "ab") as out:
            process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True, cwd=run_dir)
        process.stdin.write((summary(event, run_id, name, reason) + "\n").encode())
        process.stdin.close()
    except OSError as exc:
        try:
            with open(log or os.devnull, "a", encoding="utf-8") as out:
                out.write(f"notify command failed to start: {exc}\n")
        except OSError:
            pass
        return False
    return True
