"""What a run shows, derived in one place for every front end: the TUI's history table, its detail
line and the run view's header, and `llmtui runs` / `show` (no Textual here: plain values).

The status comes from run.json (typed in tuiapp.core.run_folder.rundir), made true by refresh_truth; a front end
adds only what it sees itself: a stop the user just confirmed (`stopping` before the supervisor
writes it). A running run whose steps stopped (`stalled`), a start-up phase that made no progress
(`hung`) and ranks that outlived their supervisor (`orphaned`) are flagged, so nothing reads
`running` for a run that is starting, stuck or orphaned. The hints say what is wrong; each front end
adds its own way to act on it (a key, a command).
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.metrics import as_number
from tuiapp.core.run_folder.progress import fmt_duration

MARKS = {
    "created": "○", "queued": "◌", "starting": "○", "running": "●", "stopping": "◌", "stopped": "■", "succeeded": "✓",
    "failed": "✗", "stalled": "!", "hung": "!", "orphaned": "!",
}
FLAGS = ("stalled", "hung", "orphaned")  # shown as flagged (warning colour, the `flagged` filter)
ORPHANS_HINT = "the supervisor is gone but processes of the run remain"
STALL_FACTOR = 5.0  # a running run is stalled when its last step is older than this many median steps
STALL_MIN_S = float(os.environ.get("LLMTUI_STALL_MIN_S", "60"))  # and at least this old
STALL_WINDOW = 20  # the last train rows' step times the stall check reads
# a running run whose last this-many train rows have loss and grad_norm exactly 0 learns nothing (rewards all
# NaN/None or all equal, a broken loss): flagged stalled like one whose steps stopped
ZERO_STEPS = int(os.environ.get("LLMTUI_ZERO_STEPS", "10"))


@dataclass(frozen=True)
class StatusView:
    key: str  # a run.json status, or a flag (stalled, hung, orphaned)
    label: str  # 'starting · loading model 0:42'
    short: str  # the table's cell: 'starting 0:42'
    hint: str | None = None  # why a flag is raised

    @property
    def mark(self) -> str:
        return MARKS.get(self.key, "?")

    @property
    def flagged(self) -> bool:
        return self.key in FLAGS

    @property
    def badge(self) -> str:
        return f"{self.mark} {self.label}"

    @property
    def cell(self) -> str:
        return f"{self.mark} {self.short}"


def fmt_clock(seconds: float | None) -> str:
    """A stopwatch: 0:42, 12:03, 1:02:03."""
    if seconds is None or seconds < 0:
        return "0:00"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def status_view(status: str, now: float, *, phase: str | None = None, phase_since: float | None = None,
                hang: dict | None = None, orphans: bool = False, stop_requested: float | None = None,
                step_times: list[float] | tuple = (), stopping: bool = False,
                queue_position: int | None = None, zero_steps: int = 0) -> StatusView:
    """The status to show. `stopping`: the user confirmed a stop the run has not recorded yet;
    `queue_position`: a queued run's place in the device queue (tuiapp.core.store.queue.position)."""
    status = status or "unknown"
    active = status in rundir.ACTIVE
    if active and (stopping or status == "stopping"):
        since = as_number(stop_requested)
        clock = f" {fmt_clock(now - since)}" if since and status == "stopping" else ""
        return StatusView("stopping", "stopping" + clock, "stopping" + clock)
    if active and orphans:
        return StatusView("orphaned", "orphaned processes", "orphaned", ORPHANS_HINT)
    if status == "queued":
        place = f" #{queue_position}" if queue_position else ""
        label = f"queued{place}" + (" in the device queue" if place else "")
        return StatusView("queued", label, f"queued{place}")
    if status == "starting":
        phase = phase or "launching"
        since = as_number((hang or {}).get("since")) if isinstance(hang, dict) else None
        since = since or as_number(phase_since)
        clock = fmt_clock(now - since) if since else ""
        if isinstance(hang, dict) and hang.get("message"):
            return StatusView("hung", f"hung · {phase} {clock}".strip(), f"hung {clock}".strip(), str(hang["message"]))
        return StatusView("starting", f"starting · {phase} {clock}".strip(), f"starting {clock}".strip())
    if status == "running" and is_stalled(list(step_times), now):
        gaps = [b - a for a, b in zip(step_times, step_times[1:], strict=False) if b > a]
        return StatusView("stalled", "stalled", "stalled",
                          f"stalled: no step for {fmt_duration(now - step_times[-1])} (median step "
                          f"{statistics.median(gaps):.1f}s); check the log tail for a hung rank or NCCL timeout")
    if status == "running" and zero_steps >= ZERO_STEPS > 0:
        return StatusView("stalled", "stalled · learns nothing", "stalled",
                          f"stalled: loss and grad_norm exactly 0 for the last {zero_steps} steps, nothing is learned "
                          "(rewards all NaN/None or all equal within each group? a broken loss?)")
    return StatusView(status, status, status)


def zero_steps(rows: list[dict]) -> int:
    """How many of the last train rows have loss and grad_norm exactly 0 (a run that learns nothing)."""
    count = 0
    for row in reversed(rows):
        if row.get("split", "train") != "train" or "step" not in row:
            continue
        if row.get("loss") == 0 and row.get("grad_norm") == 0:
            count += 1
        else:
            break
    return count


def status_of(record: rundir.RunRecord, now: float, step_times: list[float] | tuple = (),
              stopping: bool = False, zero_steps: int = 0) -> StatusView:
    """status_view of a run's record. A `starting` run whose steps are already counting in this
    attempt (the supervisor records `running` at its next look) shows as running, not as the
    start-up phase it last wrote (`loading model` while the steps of a resumed run went on)."""
    hang = record.hang
    status = str(record.status or "unknown")
    if steps_counting(status, record, step_times):
        status, hang = "running", None
    return status_view(status, now, phase=record.phase,
                       phase_since=record.phase_since, hang=hang if isinstance(hang, dict) else None,
                       orphans=record.orphans, stop_requested=record.stop_requested,
                       step_times=step_times, stopping=stopping, zero_steps=zero_steps)


# ---------------------------------------------------------------- attempts, time and reasons


def steps_counting(status: str, record: rundir.RunRecord, step_times: list[float] | tuple) -> bool:
    """A `starting` run whose latest attempt already writes steps: it trains. Until its supervisor
    records the new attempt, the last one recorded has ended, and the steps are that attempt's."""
    attempts = rundir.attempts_of(record)
    if status == "starting" and attempts and attempts[-1].get("ended"):
        return False
    started = attempt_started(record)
    return status == "starting" and bool(step_times) and started is not None and step_times[-1] >= started


def attempt_started(record: rundir.RunRecord) -> float | None:
    """When the run's latest attempt started (a resume starts a new one)."""
    attempts = rundir.attempts_of(record)
    return as_number(attempts[-1].get("started")) if attempts else as_number(record.started)


def error_summary(error: dict | None) -> str | None:
    """The root cause in one line: 'rank 1: RuntimeError: boom'."""
    if not isinstance(error, dict) or not (error.get("message") or error.get("type")):
        return None
    kind = f"{error['type']}: " if error.get("type") else ""
    message = str(error.get("message") or "").strip().splitlines()
    return f"rank {error.get('rank', '?')}: {kind}{message[0] if message else ''}".strip()


def error_log(error: dict | None, run_path: Path | None = None) -> str | None:
    """The failing rank's log, relative to the run folder when it lies inside it."""
    if not isinstance(error, dict) or not error.get("log"):
        return None
    log = Path(str(error["log"]))
    if run_path is not None:
        try:
            return str(log.relative_to(run_path))
        except ValueError:
            try:
                return str(log.resolve().relative_to(Path(run_path).resolve()))
            except (ValueError, OSError):
                pass
    return str(log)


def reason_summary(lines: list[str]) -> str:
    """The most telling line of a failure reason: an explanation first, else the error itself."""
    first = lines[0].strip()
    if first and not first.startswith(("Traceback", "[")):
        return first
    return lines[-1].strip()


def why_text(record: rundir.RunRecord) -> str | None:
    """Why a run ended as it did, in one line: its root-cause error, else its reason."""
    summary = error_summary(record.error) if record.status == "failed" else None
    if summary:
        return summary
    reason = str(record.reason or "").strip().splitlines()
    return reason_summary(reason) if reason else None


def is_stalled(times: list[float], now: float) -> bool:
    """True when the last step is older than several median step times (and STALL_MIN_S)."""
    if len(times) < 3:
        return False
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    if not gaps:
        return False
    return now - times[-1] > max(STALL_MIN_S, STALL_FACTOR * statistics.median(gaps))
