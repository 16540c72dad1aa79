"""The run directory's protocol, typed: run.json, nodes/K.json, attempts, statuses and phases.

A leaf module: every writer and reader of these files takes its key names from here, so a key
is renamed in one place. Readers stay lenient (an old or damaged file never breaks a listing);
writers are strict (an unknown key is a programming error, caught by the tests).
"""

from __future__ import annotations

import json
import os
import time
from functools import cache
from pathlib import Path
from typing import Any, Literal

from typing_extensions import NotRequired, TypedDict  # pydantic validates these on Python < 3.12

# The run folder's files: what the CLI, the supervisor, the ranks and the UI read and write.
RUN_JSON = "run.json"  # the run's record (RunRecord)
RECIPE_TOML = "recipe.toml"  # the recipe as launched (written once; micro_batch 'auto' fixed by the probe)
METRICS_JSONL = "metrics.jsonl"  # one row per logged step and eval
EVENTS_JSONL = "events.jsonl"  # launched, phases, errors, outcomes
STDOUT_LOG = "stdout.log"  # the launcher's (and one rank's) output

STATUSES = ("created", "queued", "starting", "running", "stopping", "stopped", "succeeded", "failed", "unknown")
ACTIVE = ("created", "queued", "starting", "running", "stopping")
FINAL = ("succeeded", "failed", "stopped")
# start-up phases, in order; a rank reports each one as it enters it (ranks/phase-<rank>.json)
PHASES = ("launching", "importing", "building ops", "joining ranks", "loading tokenizer", "tokenizing",
          "loading model", "first step", "training")
Status = Literal["created", "queued", "starting", "running", "stopping", "stopped", "succeeded", "failed", "unknown"]


# Typed dicts, not pydantic models: the history imports this module at start-up, and only
# record_of (tests, doctor) needs validation, through a TypeAdapter built on first use.


class Attempt(TypedDict):
    """One start of the run's supervisor: the first launch or a resume."""

    number: int
    started: float
    ended: NotRequired[float | None]
    outcome: NotRequired[str | None]
    reason: NotRequired[str | None]
    host: NotRequired[str | None]
    resumed: NotRequired[bool]


class Hang(TypedDict):
    """A start-up phase that made no progress within launch.startup_timeout_s."""

    phase: str
    rank: int | None
    since: float
    message: str


class RunRecord(TypedDict, total=False):
    """run.json (every key optional). Written by the run store (creation),
    the run service (before a start) and the run's supervisor (while it lives); read by everything."""

    id: str | None
    name: str | None
    status: Status
    created: float | None
    host: str | None
    recipe_file: str | None
    method: str | None
    model: str | None
    model_ref: str | None
    dataset: str | None
    trust_remote_code: bool
    recipe: dict | None
    attempts: list[Attempt] | int
    # the current (or last) attempt
    pid: int | None
    pgid: int | None
    pid_create_time: float | None
    started: float | None
    ended: float | None
    exit_code: int | None
    reason: str | None
    error: dict | None  # the root cause: {rank, type, message, log}
    phase: str | None
    phase_since: float | None
    hang: Hang | None
    stop_requested: float | None
    queue: dict | None  # a queued launch: {priority, slots, enqueued}
    group: dict | None  # a sweep's run: {id, name, index, keys, values}
    devices: list[int] | None  # GPU ids the queue gave this run
    generation_server: dict | None  # grpo/rloo's vLLM server: {gpus, url, group_port, pid, log, argv, ready}
    argv: list[str] | None
    ranks: int | None
    gpus: list[int] | None
    accelerator: str | None
    resumed: bool | None
    # scale-out (tuiapp.core.plan.cluster, tuiapp.core.plan.slurm)
    strategy: str | None
    node_mode: str | None
    node_rank: int | None
    nnodes: int | None
    world_size: int | None
    master_addr: str | None
    master_port: int | None
    launcher: str | None
    nodes: list[dict] | None
    slurm: dict | None
    slurm_job: str | None
    slurm_submitted: float | None
    slurm_state: str | None


RUN_KEYS = frozenset(RunRecord.__annotations__)
# nodes/K.json: what node K's supervisor records of itself
NODE_KEYS = frozenset({
    "status", "pid", "pgid", "pid_create_time", "started", "ended", "exit_code", "reason", "argv", "host",
    "ranks", "gpus", "accelerator", "attempts", "resumed", "strategy", "nnodes", "world_size", "master_addr",
    "master_port", "node_mode", "nodes", "node_rank", "phase", "phase_since", "hang", "error",
    "stop_requested",
})


def check_keys(values: dict, allowed: frozenset = RUN_KEYS) -> None:
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise KeyError(f"not a run.json key: {', '.join(unknown)} (declare it in tuiapp.core.run_folder.rundir)")


@cache
def _record_adapter():
    from pydantic import TypeAdapter

    return TypeAdapter(RunRecord)


def record_of(info: dict) -> RunRecord | None:
    """run.json validated against the protocol (types of the known keys), or None when it does
    not fit."""
    from pydantic import ValidationError

    try:
        return _record_adapter().validate_python(info)
    except ValidationError:
        return None


# ---------------------------------------------------------------- attempts and time


def attempts_of(info: dict) -> list[dict]:
    """Every attempt recorded (oldest first); a run written before attempts were a list gives
    one synthetic attempt from started/ended."""
    raw = info.get("attempts")
    if isinstance(raw, list):
        return [a for a in raw if isinstance(a, dict) and isinstance(a.get("started"), (int, float))]
    if isinstance(info.get("started"), (int, float)):
        return [{"number": raw if isinstance(raw, int) and raw > 0 else 1, "started": info["started"],
                 "ended": info.get("ended"), "outcome": info.get("status"), "reason": info.get("reason")}]
    return []


def attempt_count(info: dict) -> int:
    raw = info.get("attempts")
    if isinstance(raw, int):
        return raw
    return len(attempts_of(info))


def first_started(info: dict) -> float | None:
    attempts = attempts_of(info)
    return attempts[0]["started"] if attempts else info.get("started")


def duration_s(info: dict, now: float | None = None) -> float | None:
    """Time spent running, over every attempt; the live attempt counts up to now."""
    attempts = attempts_of(info)
    if not attempts:
        return None
    now = time.time() if now is None else now
    total = 0.0
    for index, attempt in enumerate(attempts):
        end = attempt.get("ended")
        if not isinstance(end, (int, float)):
            last = index == len(attempts) - 1
            end = (info.get("ended") if last else None) or (now if last and info.get("status") in ACTIVE else None)
        if isinstance(end, (int, float)) and end >= attempt["started"]:
            total += end - attempt["started"]
    return total


def new_attempt(info: dict, host: str, resumed: bool, now: float | None = None) -> list[dict]:
    """The attempts list with one more (started now)."""
    attempts = [a for a in attempts_of(info)]
    attempts.append(Attempt(number=len(attempts) + 1, started=time.time() if now is None else now,
                            ended=None, outcome=None, reason=None, host=host, resumed=resumed))
    return attempts


def close_attempt(info: dict, outcome: str, reason: str | None, now: float | None = None) -> list[dict]:
    """The attempts list with the last one ended."""
    attempts = attempts_of(info)
    if attempts and not attempts[-1].get("ended"):
        attempts[-1] = {**attempts[-1], "ended": time.time() if now is None else now, "outcome": outcome,
                        "reason": reason}
    return attempts


# ---------------------------------------------------------------- rank phases and errors

RANKS_DIR = "ranks"


def phase_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / RANKS_DIR / f"phase-{rank}.json"


def stack_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / RANKS_DIR / f"stack-{rank}.txt"


def write_phase(run_dir: Path, rank: int, phase: str, **extra: Any) -> None:
    """A rank enters a start-up phase (written atomically; the supervisor polls these)."""
    from tuiapp.core.run_folder.metrics import atomic_write_text

    path = phase_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"rank": rank, "phase": phase, "since": time.time(), "pid": os.getpid(),
                                        **extra}))


def read_phases(run_dir: Path, since: float | None = None) -> dict[int, dict]:
    """Each rank's latest phase record, written after `since` (this attempt's start)."""
    out: dict[int, dict] = {}
    for path in (Path(run_dir) / RANKS_DIR).glob("phase-*.json"):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            rank = int(record["rank"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if since is not None and (record.get("since") or 0) < since:
            continue
        out[rank] = record
    return out


def clear_phases(run_dir: Path) -> None:
    for path in (Path(run_dir) / RANKS_DIR).glob("phase-*.json"):
        path.unlink(missing_ok=True)


def phase_index(phase: str | None) -> int:
    return PHASES.index(phase) if phase in PHASES else -1


def behind(phases: dict[int, dict], world: int, started: float) -> tuple[int | None, str, float]:
    """The rank furthest behind in start-up: (rank, its phase, since when). A rank that wrote
    nothing yet is still 'launching' since the attempt started."""
    worst: tuple[int, float, int | None, str] | None = None
    for rank in range(max(world, 1)):
        record = phases.get(rank)
        phase = record.get("phase") if record else "launching"
        since = float(record.get("since") or started) if record else started
        key = (phase_index(phase), since, rank, phase)
        if worst is None or key[:2] < worst[:2]:
            worst = key
    _, since, rank, phase = worst
    return rank, phase, since
