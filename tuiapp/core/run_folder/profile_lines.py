"""A run's profile (train.profile_steps, written by trainer.loop.profiling into profile/) as `llmtui show`
prints it: one line of what the profiled steps cost, and with --profile the top ops."""

from __future__ import annotations

import json

from tuiapp.core.run_folder.rundir import RunDir


def read(run_path) -> dict | None:
    try:
        return json.loads(RunDir(run_path).profile_summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def show_lines(run_path, ops: int = 0) -> list[str]:
    """`llmtui show` lines: the profiled steps, their time and the device's busy share, the top op;
    with `ops`, that many ops after it with their calls, time and share of the steps' wall time."""
    summary = read(run_path)
    if not summary:
        return []
    first, steps = summary.get("first_step", 0), summary.get("steps", 0)
    busy = summary.get("device_busy")
    top = (summary.get("ops") or [{}])[0]
    line = (f"  profile   steps {first}-{first + steps - 1}: {summary.get('step_s', 0):.3f} s a step"
            + (f", the GPU busy {busy:.0%} of it" if busy is not None else " (CPU clock)")
            + (f"; top {top['name']} {top['share']:.0%}" if top.get("name") else ""))
    if not ops:
        return [line + " (show --profile: the ops)"]
    clock = "GPU" if summary.get("clock") == "device" else "CPU"
    lines = [line, f"            {'op':<44} {'calls':>7} {clock + ' ms':>9} {'share':>6}"]
    for op in (summary.get("ops") or [])[:ops]:
        lines.append(f"            {_fit(op['name'], 44):<44} {op['calls']:>7} {op['self_us'] / 1e3:>9.2f} "
                     f"{op['share']:>6.1%}")
    lines.append(f"            all ops: {RunDir(run_path).profile_ops}; trace (Perfetto): {RunDir(run_path).profile_trace}")
    return lines


def _fit(name: str, width: int) -> str:
    """A long op name cut in its middle: its start and its end (forward and backward differ there)."""
    if len(name) <= width:
        return name
    head = (width - 1) // 2
    return name[:head] + "…" + name[-(width - 1 - head):]
