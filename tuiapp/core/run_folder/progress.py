"""Human formatting of run progress and summaries (shared by the CLI and the TUI)."""

from __future__ import annotations

import math
import time

from tuiapp.core.run_folder.metrics import as_number, peak_memory


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """'1 run', '2 runs' (or the given plural): never '1 run(s)'."""
    return f"{count:,} {noun if count == 1 else nouns or noun + 's'}"


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.1f}{unit}" if unit != "B" else f"{int(value)}B"
        value /= 1000.0
    return "-"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def fmt_number(value, spec: str = ".4g") -> str:
    if value is None:
        return "-"
    try:
        return format(float(value), spec)
    except (TypeError, ValueError):
        return str(value)


def fmt_time(stamp: float | None) -> str:
    if not stamp:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))


def eta_seconds(rows: list[dict]) -> float | None:
    """Seconds left, from the step rate of the last 20 train rows (the CLI and the TUI)."""
    if len(rows) < 2:
        return None
    last, first = rows[-1], rows[-20:][0]
    total = as_number(last.get("max_steps"))
    step = as_number(last.get("step")) or 0.0
    steps = step - (as_number(first.get("step")) or 0.0)
    elapsed = (as_number(last.get("time")) or 0.0) - (as_number(first.get("time")) or 0.0)
    if not total or steps <= 0 or elapsed <= 0:
        return None
    return max(0.0, (total - step) * elapsed / steps)


def progress_line(row: dict, rows: list[dict], eta: bool = True) -> str:
    """One line of a run's progress; `eta=False` for a run that has ended (no time is left to wait)."""
    step = row.get("step")
    total = row.get("max_steps")
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    parts.append(f"loss {fmt_number(row.get('loss'), '.4f')}")
    parts.append(f"lr {fmt_number(row.get('lr'), '.2e')}")
    if row.get("tokens_per_s") is not None:
        parts.append(f"tok/s {fmt_number(row.get('tokens_per_s'), '.0f')}")
    parts.append(f"mem {fmt_bytes(peak_memory(row))}")
    if eta:
        parts.append(f"ETA {fmt_duration(eta_seconds(rows))}")
    return "  ".join(parts)
