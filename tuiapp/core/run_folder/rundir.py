"""The run directory's protocol, typed: run.json, nodes/K.json, attempts, statuses and phases.

A leaf module: every writer and reader of these files takes its key names from here, so a key
is renamed in one place. Readers stay lenient (an old or damaged file never breaks a listing);
writers are strict (an unknown key is a programming error, caught by the tests).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from typing_extensions import NotRequired, TypedDict

# The run folder's files: what the CLI, the supervisor, the ranks and the UI read and write.
RUN_JSON = "run.json"  # the run's record (RunRecord)
RECIPE_TOML = "recipe.toml"  # the recipe as launched (written once; micro_batch 'auto' fixed by the probe)
METRICS_JSONL = "metrics.jsonl"  # one row per logged step and eval
METRICS_COLUMNS = "metrics.columns"  # the same rows in columns, kept by rank 0 (core.run_folder.columns)
EVENTS_JSONL = "events.jsonl"  # launched, phases, errors, outcomes
STDOUT_LOG = "stdout.log"  # the launcher's (and one rank's) output
SUPERVISOR_LOG = "supervisor.log"  # the supervisor's own output (node K's: nodes/K.supervisor.log)
RANKS_DIR = "ranks"  # each rank's log, phase record, stack dump and memory figure
NODES_DIR = "nodes"  # multi-node: node K's record (K.json), lock and supervisor log
CHECKPOINTS_DIR = "checkpoints"  # checkpoint-N folders
FINAL_DIR = "final"  # the trained model (adapter or full), written once through FINAL_STAGING
FINAL_STAGING = ".final-staging"
CHECKPOINT_STATE_JSON = "trainer_state.json"  # in checkpoint-N/: a checkpoint is finished once it holds this
SUPERVISOR_LOCK = ".supervisor.lock"  # held by the run's supervisor while it lives (machine.runlock)
PROVENANCE_JSON = "provenance.json"  # what made the run: versions, machine, data fingerprint, seed, recipe
BENCH_DIR = "bench"  # `llmtui eval --benchmark`: one JSON per evaluation (core.run_folder.benchmarks)
JUDGE_DIR = "judge"  # `llmtui eval --judge`: one JSON per judged comparison (core.after.judging)
EVALS_DIR = "evals"  # `llmtui eval`: one JSON per evaluation (core.run_folder.evals)
EXPORTS_DIR = "exports"  # one JSON per export made (core.run_folder.exports)
FINAL_INFO = "llmtui.json"  # in final/: what trained the model and from which base
META_JSON = "meta.json"  # tags and notes (core.store.meta)
SERVE_JSON = "serve.json"  # `llmtui serve`: the served model's record (core.store.served)
SERVE_LOG = "serve.log"  # `llmtui serve`: the server's output
PROBE_JSON = "probe.json"  # micro_batch 'auto': the probe's choice (core.plan.probe)
PROBE_DIR = "probe"  # the probing rank's rows and log
PROBE_ROWS_JSONL = "rows.jsonl"  # in probe/: one row per size tried
PROBE_LAUNCHER_LOG = "launcher.log"  # in probe/: the probing launcher's output
NOTIFY_LOG = "notify.log"  # the notify command's output (core.machine.notify)
VLLM_SERVER_LOG = "vllm-server.log"  # grpo/rloo's vLLM generation server's output (core.plan.generation_server)
COMPLETIONS_JSONL = "completions.jsonl"  # online RL: every generation (core.run_folder.completions)
TOOL_ERRORS_JSONL = "tool_errors.jsonl"  # RL tools: each tool call that raised (trainer.tool_guard)
PROFILE_DIR = "profile"  # train.profile_steps: torch.profiler's record of a few steps (trainer.loop.profiling)
PROFILE_SUMMARY_JSON = "summary.json"  # in profile/: the steps, their wall and device time, the top ops
PROFILE_OPS_TXT = "ops.txt"  # in profile/: torch's table of the ops, by self time
PROFILE_TRACE = "trace.json.gz"  # in profile/: the Chrome trace (Perfetto, chrome://tracing open it)


class RunDir:
    """A run folder's files and subfolders, by what they are: every path of a run is an attribute
    or a method here, so no other module joins a run folder with a file name. Paths only (no
    process, torch or recipe imports): the CLI, the supervisor, the ranks and the UI all use it;
    the frozen recipe's one parse is tuiapp.core.config.frozen.frozen_recipe."""

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    # the record, the recipe and the streams
    @property
    def record(self) -> Path:
        return self.path / RUN_JSON

    @property
    def recipe_toml(self) -> Path:
        return self.path / RECIPE_TOML

    @property
    def metrics(self) -> Path:
        return self.path / METRICS_JSONL

    @property
    def metrics_columns(self) -> Path:
        return self.path / METRICS_COLUMNS

    @property
    def events(self) -> Path:
        return self.path / EVENTS_JSONL

    @property
    def stdout_log(self) -> Path:
        return self.path / STDOUT_LOG

    @property
    def supervisor_log(self) -> Path:
        return self.path / SUPERVISOR_LOG

    @property
    def provenance(self) -> Path:
        return self.path / PROVENANCE_JSON

    @property
    def meta(self) -> Path:
        return self.path / META_JSON

    @property
    def notify_log(self) -> Path:
        return self.path / NOTIFY_LOG

    @property
    def completions(self) -> Path:
        return self.path / COMPLETIONS_JSONL

    @property
    def tool_errors(self) -> Path:
        return self.path / TOOL_ERRORS_JSONL

    @property
    def vllm_server_log(self) -> Path:
        return self.path / VLLM_SERVER_LOG

    @property
    def serve_record(self) -> Path:
        return self.path / SERVE_JSON

    @property
    def serve_log(self) -> Path:
        return self.path / SERVE_LOG

    @property
    def probe(self) -> Path:
        return self.path / PROBE_JSON

    @property
    def profile_dir(self) -> Path:
        return self.path / PROFILE_DIR

    @property
    def profile_summary(self) -> Path:
        return self.profile_dir / PROFILE_SUMMARY_JSON

    @property
    def profile_ops(self) -> Path:
        return self.profile_dir / PROFILE_OPS_TXT

    @property
    def profile_trace(self) -> Path:
        return self.profile_dir / PROFILE_TRACE

    @property
    def probe_dir(self) -> Path:
        return self.path / PROBE_DIR

    @property
    def probe_rows(self) -> Path:
        return self.probe_dir / PROBE_ROWS_JSONL

    @property
    def probe_launcher_log(self) -> Path:
        return self.probe_dir / PROBE_LAUNCHER_LOG

    # the model
    @property
    def final(self) -> Path:
        return self.path / FINAL_DIR

    @property
    def final_staging(self) -> Path:
        return self.path / FINAL_STAGING

    @property
    def final_info(self) -> Path:
        return self.final / FINAL_INFO

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"checkpoint-{step}"

    # after training
    @property
    def evals(self) -> Path:
        return self.path / EVALS_DIR

    @property
    def exports(self) -> Path:
        return self.path / EXPORTS_DIR

    @property
    def bench(self) -> Path:
        return self.path / BENCH_DIR

    @property
    def judge(self) -> Path:
        return self.path / JUDGE_DIR

    # the ranks
    @property
    def ranks(self) -> Path:
        return self.path / RANKS_DIR

    def rank_logs(self) -> list[Path]:
        """Every rank log (ranks/<start time>_rank<N>.log), oldest name first."""
        return sorted(self.ranks.glob("*_rank*.log"))

    def rank_log(self, rank: int) -> Path | None:
        """Rank `rank`'s latest log, None when it wrote none."""
        logs = sorted(self.ranks.glob(f"*_rank{rank}.log"))
        return logs[-1] if logs else None

    def new_rank_log(self, rank: int = 0, now: float | None = None) -> Path:
        """ranks/<start time>_rank<N>.log, the name DeepSpeed's launcher gives each rank's log."""
        stamp = time.strftime("%Y%m%d%H%M%S", time.localtime(now))
        return self.ranks / f"{stamp}_rank{rank}.log"

    def phase(self, rank: int) -> Path:
        return self.ranks / f"phase-{rank}.json"

    def phases(self) -> list[Path]:
        return list(self.ranks.glob("phase-*.json"))

    def stack(self, rank: int) -> Path:
        return self.ranks / f"stack-{rank}.txt"

    def rank_memory(self, rank: int) -> Path:
        """A rank's latest memory figures (core.run_folder.metrics), replaced whole."""
        return self.ranks / f"memory-{rank}.json"

    def rank_memories(self) -> list[Path]:
        return list(self.ranks.glob("memory-*.json"))

    # scale-out: node K's files
    @property
    def nodes(self) -> Path:
        return self.path / NODES_DIR

    def node_record(self, node_rank: int) -> Path:
        return self.nodes / f"{node_rank}.json"

    def node_log(self, node_rank: int) -> Path:
        return self.nodes / f"{node_rank}.log"

    def node_supervisor_log(self, node_rank: int) -> Path:
        return self.nodes / f"{node_rank}.{SUPERVISOR_LOG}"

    def lock(self, node_rank: int | None = None) -> Path:
        """The flock of the run's supervisor (node K's, K > 0: nodes/K.lock)."""
        return self.path / SUPERVISOR_LOCK if not node_rank else self.nodes / f"{node_rank}.lock"


def lock_path(run_dir: Path, node_rank: int | None = None) -> Path:
    """The flock of the run's supervisor (node K's, K > 0: nodes/K.lock)."""
    return RunDir(run_dir).lock(node_rank)

STATUSES = ("created", "queued", "starting", "running", "stopping", "stopped", "succeeded", "failed", "unknown")
ACTIVE = ("created", "queued", "starting", "running", "stopping")
FINAL = ("succeeded", "failed", "stopped")
# start-up phases, in order; a rank reports each one as it enters it (ranks/phase-<rank>.json)
PHASES = ("launching", "importing", "building ops", "joining ranks", "loading tokenizer", "tokenizing",
          "loading model", "first step", "training")
Status = Literal["created", "queued", "starting", "running", "stopping", "stopped", "succeeded", "failed", "unknown"]


# Attempt and Hang stay typed dicts: they live inside run.json's lists and values and are read
# as plain JSON by the front ends. The record itself is a slotted dataclass (no pydantic: the
# history imports this module at start-up).


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


@dataclass(slots=True)
class RunRecord:
    """run.json (every key optional), also node K's nodes/K.json (NODE_KEYS). Written by the run
    store (creation), the run service (before a start) and the run's supervisor (while it lives);
    read by everything, through these attributes only.

    Reading is lenient (from_json): a key of the wrong type is kept aside in `extra` (its
    attribute stays None) and written back untouched, like an unknown key, so an old or damaged
    file never breaks a listing and loses nothing. Writing is strict: `set` and Run.update take
    declared keys only."""

    id: str | None = None
    name: str | None = None
    status: Status | None = None
    created: float | None = None
    host: str | None = None
    recipe_file: str | None = None
    method: str | None = None
    model: str | None = None
    model_ref: str | None = None
    dataset: str | None = None
    trust_remote_code: bool | None = None
    recipe: dict | None = None
    attempts: list[Attempt] | int | None = None  # an int in runs written before attempts were a list
    # the current (or last) attempt
    pid: int | None = None
    pgid: int | None = None
    pid_create_time: float | None = None
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    error: dict | None = None  # the root cause: {rank, type, message, log}
    phase: str | None = None
    phase_since: float | None = None
    hang: Hang | None = None
    stop_requested: float | None = None
    queue: dict | None = None  # a queued launch: {priority, slots, enqueued}
    group: dict | None = None  # a sweep's run: {id, name, index, keys, values}
    devices: list[int] | None = None  # GPU ids the queue gave this run
    generation_server: dict | None = None  # grpo/rloo's vLLM server: {gpus, url, group_port, pid, log, argv, ready}
    argv: list[str] | None = None
    ranks: int | None = None
    gpus: list[int] | None = None
    accelerator: str | None = None
    resumed: bool | None = None
    # scale-out (tuiapp.core.plan.cluster, tuiapp.core.plan.slurm)
    strategy: str | None = None
    node_mode: str | None = None
    node_rank: int | None = None
    nnodes: int | None = None
    world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str | None = None
    nodes: list[dict] | None = None
    slurm: dict | None = None
    slurm_job: str | None = None
    slurm_submitted: float | None = None
    slurm_state: str | None = None
    # a merged model's run (llmtui merge)
    merged_from: list[str] | None = None
    merge: dict | None = None  # {method, weights, density}
    # --- not keys of the file
    extra: dict = field(default_factory=dict)  # unknown keys and values of the wrong type, kept as read
    orphans: bool = False  # in memory only (Run.refresh_truth): ranks outlived their supervisor
    _present: set = field(default_factory=set, init=False, repr=False, compare=False)  # keys written even when None

    @classmethod
    def from_json(cls, data: Any) -> RunRecord:
        """The record of a parsed run.json (or nodes/K.json); never raises."""
        record = cls()
        if not isinstance(data, dict):
            return record
        for key, value in data.items():
            accepts = _ACCEPTS.get(key)
            if accepts is None or (value is not None and not isinstance(value, accepts)):
                record.extra[key] = value
                continue
            object.__setattr__(record, key, value)
            record._present.add(key)
        return record

    def to_json(self) -> dict:
        """The dict written to disk: the keys read or set (None ones included), then every other
        key with a value, over the unknown and damaged ones kept as read."""
        out = dict(self.extra)
        for key in _ACCEPTS:
            value = getattr(self, key)
            if value is not None or key in self._present:
                out[key] = value
        return out

    def set(self, **values: Any) -> None:
        """Set declared keys (an unknown one raises KeyError); a key set to None is written as null."""
        check_keys(values, RUN_KEYS)
        for key, value in values.items():
            setattr(self, key, value)
            self._present.add(key)
            self.extra.pop(key, None)

    def copy(self) -> RunRecord:
        twin = replace(self, extra=dict(self.extra))
        twin._present = set(self._present)
        return twin

    @property
    def damaged(self) -> list[str]:
        """Declared keys whose value had the wrong type (kept aside in `extra`)."""
        return sorted(key for key in self.extra if key in _ACCEPTS)


_KINDS: dict[str, tuple[type, ...]] = {
    "str": (str,), "Status": (str,), "float": (int, float), "int": (int,), "bool": (bool,), "dict": (dict,),
    "Hang": (dict,), "list": (list,),
}


def _accepts(annotation: str) -> tuple[type, ...]:
    """The JSON types a field's annotation admits ('list[int] | None' → (list,))."""
    out: tuple[type, ...] = ()
    for part in annotation.split("|"):
        out += _KINDS.get(part.strip().split("[")[0], ())
    return out


_ACCEPTS = {f.name: _accepts(str(f.type)) for f in fields(RunRecord) if f.name not in ("extra", "orphans", "_present")}
RUN_KEYS = frozenset(_ACCEPTS)
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


def read_record(path: Path) -> RunRecord:
    """A run.json (or nodes/K.json) read leniently: an empty record when missing or unreadable."""
    try:
        return RunRecord.from_json(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError, UnicodeDecodeError):
        return RunRecord()


def record_of(data: Any) -> RunRecord | None:
    """run.json checked against the protocol (types of the known keys, a known status, attempts
    that are attempts), or None when it does not fit."""
    if not isinstance(data, dict):
        return None
    record = RunRecord.from_json(data)
    if record.damaged or (record.status is not None and record.status not in STATUSES):
        return None
    attempts = record.attempts
    if isinstance(attempts, list) and not all(
            isinstance(a, dict) and isinstance(a.get("number"), int) and isinstance(a.get("started"), (int, float))
            for a in attempts):
        return None
    return record


# ---------------------------------------------------------------- attempts and time


def attempts_of(record: RunRecord) -> list[dict]:
    """Every attempt recorded (oldest first); a run written before attempts were a list gives
    one synthetic attempt from started/ended."""
    raw = record.attempts
    if isinstance(raw, list):
        return [a for a in raw if isinstance(a, dict) and isinstance(a.get("started"), (int, float))]
    if isinstance(record.started, (int, float)):
        return [{"number": raw if isinstance(raw, int) and raw > 0 else 1, "started": record.started,
                 "ended": record.ended, "outcome": record.status, "reason": record.reason}]
    return []


def attempt_count(record: RunRecord) -> int:
    raw = record.attempts
    if isinstance(raw, int):
        return raw
    return len(attempts_of(record))


def first_started(record: RunRecord) -> float | None:
    attempts = attempts_of(record)
    return attempts[0]["started"] if attempts else record.started


def duration_s(record: RunRecord, now: float | None = None) -> float | None:
    """Time spent running, over every attempt; the live attempt counts up to now."""
    attempts = attempts_of(record)
    if not attempts:
        return None
    now = time.time() if now is None else now
    total = 0.0
    for index, attempt in enumerate(attempts):
        end = attempt.get("ended")
        if not isinstance(end, (int, float)):
            last = index == len(attempts) - 1
            end = (record.ended if last else None) or (now if last and record.status in ACTIVE else None)
        if isinstance(end, (int, float)) and end >= attempt["started"]:
            total += end - attempt["started"]
    return total


def new_attempt(record: RunRecord, host: str, resumed: bool, now: float | None = None) -> list[dict]:
    """The attempts list with one more (started now)."""
    attempts = [a for a in attempts_of(record)]
    attempts.append(Attempt(number=len(attempts) + 1, started=time.time() if now is None else now,
                            ended=None, outcome=None, reason=None, host=host, resumed=resumed))
    return attempts


def close_attempt(record: RunRecord, outcome: str, reason: str | None, now: float | None = None) -> list[dict]:
    """The attempts list with the last one ended."""
    attempts = attempts_of(record)
    if attempts and not attempts[-1].get("ended"):
        attempts[-1] = {**attempts[-1], "ended": time.time() if now is None else now, "outcome": outcome,
                        "reason": reason}
    return attempts


# ---------------------------------------------------------------- rank phases and errors


def phase_path(run_dir: Path, rank: int) -> Path:
    return RunDir(run_dir).phase(rank)


def stack_path(run_dir: Path, rank: int) -> Path:
    return RunDir(run_dir).stack(rank)


def write_phase(run_dir: Path, rank: int, phase: str, **extra: Any) -> None:
    """A rank enters a start-up phase (written atomically; the supervisor polls these)."""
    from tuiapp.core.run_folder.atomic import atomic_write_text

    path = phase_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"rank": rank, "phase": phase, "since": time.time(), "pid": os.getpid(),
                                        **extra}))


def read_phases(run_dir: Path, since: float | None = None) -> dict[int, dict]:
    """Each rank's latest phase record, written after `since` (this attempt's start)."""
    out: dict[int, dict] = {}
    for path in RunDir(run_dir).phases():
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
    for path in RunDir(run_dir).phases():
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
