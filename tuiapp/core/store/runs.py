"""The run store: runs/<id>/ folders, their run.json, and the truth about their status."""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from tuiapp.core.common.errors import RunError
from tuiapp.core.common.secrets import is_secret_name, redact  # noqa: F401 (re-exported)
from tuiapp.core.machine import runlock, shm
from tuiapp.core.machine.procs import group_processes, process_alive
from tuiapp.core.plan import slurm
from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.metrics import read_jsonl, summarize
from tuiapp.core.run_folder.rundir import (  # noqa: F401 (ACTIVE, FINAL re-exported)
    ACTIVE,
    FINAL,
    STDOUT_LOG,
    RunDir,
    RunRecord,
    attempts_of,
    check_keys,
    close_attempt,
    read_phases,
)
from tuiapp.core.run_folder.tail import tail_lines

if TYPE_CHECKING:  # the schema (pydantic) is imported where a recipe is read: not at the history's start-up
    from tuiapp.core.config.recipe import Recipe

RUNS_ENV = "LLMTUI_RUNS_DIR"
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def default_runs_dir(explicit: str | Path | None = None) -> Path:
    if explicit:
        return Path(explicit)
    return Path(os.environ.get(RUNS_ENV) or "runs")


def new_run_id(name: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:40] or "run"
    return f"{stamp}-{slug}-{secrets.token_hex(2)}"


ERROR_MARKERS = ("Error", "error:", "Traceback", "Killed", "OutOfMemory", "CUDA out of memory", "exits with return code")


def error_lines(log: Path) -> tuple[bool, list[str]]:
    """(found an error, the last error lines) of one log."""
    lines = tail_lines(log, 200)
    hits = [i for i, line in enumerate(lines) if any(m in line for m in ERROR_MARKERS)]
    if not hits:
        return False, lines[-5:]
    first = hits[-1]
    for index in reversed(hits):
        if "Traceback" in lines[index]:
            first = index
            break
    chosen = [line for line in lines[first:] if line.strip()]
    errors = [line for line in chosen if any(m in line for m in ERROR_MARKERS)]
    return True, (errors or chosen)[-6:]


def rank_logs(run_dir: Path) -> list[Path]:
    """Per-rank logs of the latest attempt (DeepSpeed names them <start time>_rank<N>.log)."""
    logs = RunDir(run_dir).rank_logs()
    if not logs:
        return []
    latest = logs[-1].name.split("_rank")[0]
    return [p for p in logs if p.name.startswith(latest + "_rank")]


RANK_EXIT = re.compile(r"--local_rank=(\d+).*exits with return code = (-?\d+)")
SIGNAL_HINTS = {9: "SIGKILL: killed from outside, often the kernel's out-of-memory killer", 15: "SIGTERM",
                6: "SIGABRT: a crash in native code", 11: "SIGSEGV: a crash in native code"}


def explain_rank_exit(lines: list[str]) -> str | None:
    """'local rank 1 was killed by signal 9 (...)' from DeepSpeed's launcher line."""
    for line in reversed(lines):
        match = RANK_EXIT.search(line)
        if match:
            rank, code = int(match.group(1)), int(match.group(2))
            if code < 0:
                hint = SIGNAL_HINTS.get(-code, "")
                return f"local rank {rank} was killed by signal {-code}" + (f" ({hint})" if hint else "")
            return f"local rank {rank} exited with code {code}"
    return None


PEER_LOSS = re.compile(r"Connection reset by peer|Connection closed by peer|peer closed|Broken pipe|"
                       r"ProcessGroupGloo.*(closed|reset)|Socket Timeout", re.IGNORECASE)


def killed_rank(lines: list[str]) -> tuple[int, int] | None:
    """(local rank, signal) of a rank the launcher saw killed by a signal, from its exit line."""
    for line in reversed(lines):
        match = RANK_EXIT.search(line)
        if match and int(match.group(2)) < 0:
            return int(match.group(1)), -int(match.group(2))
    return None


def rank_log(run_dir: Path, rank: int) -> Path | None:
    """The latest attempt's log of one rank."""
    return RunDir(run_dir).rank_log(rank)


def root_cause(run_dir: Path, since: float | None = None) -> dict | None:
    """The first real exception of this attempt: the earliest `error` event a rank wrote
    (later ones are usually other ranks losing their peer). {rank, type, message, log}."""
    errors = [e for e in read_jsonl(RunDir(run_dir).events)
              if e.get("event") == ev.ERROR and (since is None or (e.get("time") or 0) >= since - 1)]
    if not errors:
        return None
    first = min(errors, key=lambda e: e.get("time") or 0)
    rank = first.get("rank")
    log = rank_log(run_dir, rank) if isinstance(rank, int) else None
    message = str(first.get("message") or "")
    prefix = f"rank {rank}: "
    if message.startswith(prefix):
        message = message[len(prefix):]
    kind = first.get("type")
    if kind and message.startswith(f"{kind}: "):
        message = message[len(kind) + 2:]
    return {"rank": rank, "type": kind, "message": message.strip(), "log": str(log) if log else None}


def cause_text(cause: dict) -> str:
    plain = str(cause.get("type") or "").startswith("signal ") or cause.get("type") == "killed"
    kind = f"{cause['type']}: " if cause.get("type") and not plain else ""
    text = f"rank {cause.get('rank', '?')}: {kind}{cause.get('message', '')}"
    return text + (f"\n(log: {cause['log']})" if cause.get("log") else "")


def failure_cause(run_dir: Path, log: Path | None = None, since: float | None = None) -> dict | None:
    """The root cause of a failed attempt: a rank killed by a signal (the OOM killer, say) comes
    first, since the other ranks then fail only because they lost their peer; else the first
    exception a rank recorded. {rank, type, message, log}, or None."""
    cause = root_cause(run_dir, since)
    lines = tail_lines(Path(log or RunDir(run_dir).stdout_log), 400)
    starts = [i for i, line in enumerate(lines) if line.startswith("$ ")]  # each attempt logs its command first
    killed = killed_rank(lines[starts[-1]:] if starts else lines)
    if killed and (cause is None or cause.get("rank") != killed[0]):
        rank, signum = killed
        hint = SIGNAL_HINTS.get(signum, "")
        then = f"; then {cause_text(cause).splitlines()[0]}" if cause else ""
        path = rank_log(run_dir, rank)
        return {"rank": rank, "type": f"signal {signum}",
                "message": f"killed by signal {signum}" + (f" ({hint})" if hint else "") + then,
                "log": str(path) if path else None}
    if cause and PEER_LOSS.search(cause.get("message") or ""):
        # a rank that raised only because a peer vanished: the peer that left no error of its own
        # (SIGKILL gives it no chance to) is the cause
        errored = {e.get("rank") for e in read_jsonl(RunDir(run_dir).events)
                   if e.get("event") == ev.ERROR and (since is None or (e.get("time") or 0) >= since - 1)}
        silent = sorted(r for r in read_phases(run_dir, since=(since - 1) if since else None) if r not in errored)
        if silent:
            path = rank_log(run_dir, silent[0])
            return {"rank": silent[0], "type": "killed",
                    "message": "ended without an error of its own (killed by a signal, e.g. SIGKILL by hand or by "
                    f"the kernel's out-of-memory killer); then {cause_text(cause).splitlines()[0]}",
                    "log": str(path) if path else None}
    return cause


def failure_reason(run_dir: Path, log: Path | None = None, since: float | None = None) -> str:
    """Why a run failed: failure_cause when one is known, else the last error lines of the first
    rank log holding an error, else of the main log (or `log`)."""
    cause = failure_cause(run_dir, log, since)
    if cause:
        return cause_text(cause)
    main = log or RunDir(run_dir).stdout_log
    for candidate in [*rank_logs(run_dir), main] if log is None else [main]:
        found, lines = error_lines(candidate)
        explained = explain_rank_exit(lines)
        if explained:
            lines = [explained, *lines]
        if found:
            prefix = f"[{candidate.name}] " if candidate != main else ""
            return prefix + "\n".join(lines)
    lines = error_lines(main)[1]
    return "\n".join([explain_rank_exit(lines) or "", *lines]).strip()


SUPERVISOR_GONE = "the run's supervisor is gone (killed, or the machine rebooted)"
LAUNCHER_LINE = re.compile(r"^\$ |\[(INFO|WARNING|DEBUG)\]|^\s*(env )?\S*python\S* ")  # a command or launcher chatter


def logged_errors(run_dir: Path) -> str | None:
    """The error lines (a traceback's end, a rank's exit in llmtui's words) of the first log that
    holds one; never the launcher's INFO lines or a command line."""
    for log in [*rank_logs(run_dir), RunDir(run_dir).stdout_log]:
        found, lines = error_lines(log)
        if not found:
            continue
        explained = explain_rank_exit(lines)
        kept = [line for line in lines if not LAUNCHER_LINE.search(line)]
        text = "\n".join(([explained] if explained else []) + kept).strip()
        if text:
            return (f"[{log.name}] " if log.name != STDOUT_LOG else "") + text
    return None


def unsupervised_outcome(run_dir: Path, record: RunRecord) -> tuple[str, str]:
    """The status and reason of an attempt that ended without its supervisor, from what its ranks
    recorded (their exit codes are lost with it): `succeeded` when they finished and saved final/,
    `stopped` after a stop checkpoint or a stop request, else `failed` with the rank's own root
    cause. Never the launcher's output lines or its command."""
    run_dir = Path(run_dir)
    started = record.started
    if record.status == "queued":
        return "failed", (f"{SUPERVISOR_GONE} while the run waited in the queue; it never started "
                          "(`llmtui resume` puts it back in the queue)")
    events = [e for e in read_jsonl(RunDir(run_dir).events)
              if started is None or (e.get("time") or 0) >= started - 1]
    kinds = {ev.kind(e): e for e in events}
    if ev.FINISHED in kinds and RunDir(run_dir).final.is_dir():
        return "succeeded", f"every step trained and the final model saved; {SUPERVISOR_GONE}, so no exit code"
    if ev.STOP_CHECKPOINT in kinds:
        step = kinds[ev.STOP_CHECKPOINT].get("step")
        return "stopped", f"stopped at step {step} with a checkpoint ({SUPERVISOR_GONE})"
    if record.stop_requested:
        return "stopped", f"stopped on request before a checkpoint was saved ({SUPERVISOR_GONE})"
    cause = failure_cause(run_dir, since=started)
    if cause:
        return "failed", f"{cause_text(cause)}\n({SUPERVISOR_GONE})"
    errors = logged_errors(run_dir)
    if errors:
        return "failed", f"{SUPERVISOR_GONE}; the logs' last errors:\n{errors}"
    return "failed", (f"{SUPERVISOR_GONE}, and its ranks ended without finishing, a stop checkpoint or an error "
                      f"of their own (killed?); the rank logs are in {RunDir(run_dir).ranks}")


@dataclass
class Run:
    """One run directory."""

    path: Path
    record: RunRecord = field(default_factory=RunRecord)
    lock_fd: int | None = field(default=None, repr=False)  # held while this process starts the run

    def release_lock(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    @property
    def dir(self) -> RunDir:
        """The run folder's files, by what they are."""
        return RunDir(self.path)

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def name(self) -> str:
        return self.record.name if self.record.name is not None else self.id

    @property
    def status(self) -> str:
        return self.record.status if self.record.status is not None else "unknown"

    @property
    def record_path(self) -> Path:
        return self.dir.record

    @property
    def metrics_path(self) -> Path:
        return self.dir.metrics

    @property
    def events_path(self) -> Path:
        return self.dir.events

    @property
    def log_path(self) -> Path:
        return self.dir.stdout_log

    @property
    def final_path(self) -> Path:
        return self.dir.final

    @property
    def checkpoints_path(self) -> Path:
        return self.dir.checkpoints

    def load(self) -> "Run":
        try:
            data = json.loads(self.record_path.read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not an object")
            self.record = RunRecord.from_json(data)
        except FileNotFoundError:
            self.record = RunRecord(status="unknown", reason="run.json is missing")
        except (ValueError, OSError, UnicodeDecodeError) as exc:
            self.record = RunRecord(status="unknown", reason=f"run.json is unreadable: {exc}")
        return self

    def save(self) -> None:
        atomic_write_text(self.record_path, json.dumps(self.record.to_json(), indent=2, sort_keys=True, default=str))

    def update(self, **values) -> None:
        check_keys(values)
        self.load()
        self.record.set(**values)
        self.save()

    def recipe(self) -> Recipe:
        from tuiapp.core.config.frozen import frozen_recipe  # the schema: not at start-up

        return frozen_recipe(self.dir)

    def metrics(self) -> list[dict]:
        return read_jsonl(self.metrics_path)

    def events(self) -> list[dict]:
        return read_jsonl(self.events_path)

    def summary(self) -> dict:
        return summarize(self.metrics())

    def supervisor_alive(self) -> bool:
        """A supervisor (or the process starting one) holds the run's lock; runs made before
        locks existed fall back to the recorded pid."""
        held = runlock.held(self.dir.lock())
        if held is None:
            return process_alive(self.record.pid, self.record.pid_create_time)
        return held

    def refresh_truth(self, persist: bool = True, supervisor: bool | None = None) -> "Run":
        """An active run whose supervisor is gone has ended: say how (unsupervised_outcome). While
        any process of the run lives, it is not called ended. `supervisor=False`: the caller holds
        the run's lock itself, so no supervisor lives (None: the lock says)."""
        if self.status not in ACTIVE:
            return self
        if self.record.slurm_job:
            slurm.refresh(self, persist)  # a SLURM run: the scheduler's job state is the truth
            return self
        if self.record.host not in (None, socket.gethostname()):
            return self  # its supervisor runs on another machine (multi-node): a lock here means nothing
        if self.record.node_mode == "slurm":
            return self  # submitted, not yet given a job id by the submitting process
        if supervisor is None and self.supervisor_alive():
            return self
        if runlock.held(self.dir.lock()) is None and not self.record.pid:
            return self  # no lock and no pid: nothing to judge by (made by hand or by an older llmtui)
        self.load()  # the supervisor may have just written the final status
        if self.status not in ACTIVE or (supervisor is None and self.supervisor_alive()):
            return self
        if group_processes(self.record.pgid):
            self.record.orphans = True  # ranks outlived their supervisor: `llmtui stop` ends them
            return self
        if self.status == "created" and not attempts_of(self.record):
            status, reason = "failed", "the process that created the run exited before starting it"
        else:
            status, reason = unsupervised_outcome(self.path, self.record)
        shm.reclaim(self.record.master_port)  # no rank is left to use its shared memory
        now = time.time()
        self.record.set(status=status, ended=now, reason=reason,
                        attempts=close_attempt(self.record, status, reason, now))
        if persist:
            try:
                self.update(status=status, ended=now, reason=reason, attempts=self.record.attempts)
            except OSError:
                pass
        return self


class RunStore:
    """All runs under one folder."""

    def __init__(self, root: str | Path | None = None):
        self.root = default_runs_dir(root)

    def create(self, recipe: Recipe, recipe_file: str | None = None, run_id: str | None = None,
               model_ref: str | None = None, lock: bool = False) -> Run:
        """A new run folder; `run_id` picks its name (multi-node runs: every node passes it). With
        `lock`, the run's lock is held by this process (run.lock_fd) until it hands it to the
        supervisor it starts, so the run is never seen without a live owner. The folder is made
        under a hidden name and renamed into place with its run.json, so no reader sees it half made."""
        self.root.mkdir(parents=True, exist_ok=True)
        if run_id is not None and (not ID_PATTERN.match(run_id) or ".." in run_id):
            raise RunError(message=f"'{run_id}' is not a valid run id",
                           fix="use letters, digits, '.', '_' and '-' (at most 128)")
        staging = Path(tempfile.mkdtemp(prefix=".creating-", dir=self.root))
        run = Run(staging)
        try:
            if lock:
                run.lock_fd = runlock.acquire(RunDir(staging).lock())
            RunDir(staging).recipe_toml.write_text(recipe.to_toml(), encoding="utf-8")
            run.record.set(
                name=recipe.name,
                status="created",
                created=time.time(),
                host=socket.gethostname(),
                recipe_file=recipe_file,
                method=recipe.method.kind,
                model=recipe.model.name,
                dataset=recipe.dataset.label,
                trust_remote_code=recipe.model.trust_remote_code,
                recipe=recipe.model_dump(mode="json"),
                attempts=[],
            )
            if model_ref and model_ref != recipe.model.name:
                run.record.set(model_ref=model_ref)
            for _ in range(5 if run_id is None else 1):
                path = self.root / (run_id or new_run_id(recipe.name))
                run.record.set(id=path.name)
                run.save()
                if path.exists():
                    continue
                try:
                    os.rename(staging, path)  # a run folder of the same name is never empty: refused
                except OSError as exc:
                    if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                        continue
                    raise
                run.path = path
                break
            else:
                if run_id is not None:
                    raise RunError(message=f"run '{run_id}' already exists in {self.root}",
                                   fix="choose a new --run-id (resume that run with `llmtui resume`)")
                raise RunError(message="could not create a unique run folder", file=str(self.root))
        except BaseException:
            run.release_lock()
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return run

    def run_names(self) -> list[str]:
        """The run folders' names (ids), oldest first; cheaper than paths for 10,000 runs."""
        try:
            with os.scandir(self.root) as entries:
                return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def run_dirs(self) -> list[Path]:
        return [self.root / name for name in self.run_names()]

    def list(self, refresh: bool = True) -> list[Run]:
        runs = [Run(p).load() for p in self.run_dirs()]
        if refresh:
            for run in runs:
                run.refresh_truth()
        return runs

    def get(self, ref: str) -> Run:
        """A run by id, unique id prefix, or name (the latest run of that name)."""
        if not ref or not ID_PATTERN.match(ref) or ".." in ref:
            raise RunError(message=f"'{ref}' is not a valid run id or name", fix="see `llmtui runs`")
        exact = self.root / ref
        if exact.is_dir():
            return Run(exact).load().refresh_truth()
        dirs = self.run_dirs()
        prefixed = [p for p in dirs if p.name.startswith(ref)]
        if len(prefixed) == 1:
            return Run(prefixed[0]).load().refresh_truth()
        named = [r for r in (Run(p).load() for p in dirs) if r.name == ref]
        if named:
            return max(named, key=lambda r: (r.record.created or 0, r.id)).refresh_truth()
        if len(prefixed) > 1:
            raise RunError(message=f"'{ref}' matches {len(prefixed)} runs", fix="give more of the id")
        raise RunError(message=f"no run '{ref}' in {self.root}", fix="see `llmtui runs`")

    def latest_succeeded(self, name: str) -> Run | None:
        done = [r for r in self.list(refresh=False) if r.name == name and r.status == "succeeded"]
        return max(done, key=lambda r: (r.record.created or 0, r.id)) if done else None

    def resolve_model(self, model_name: str) -> str:
        """Turn 'run:NAME' into the path of that run's final model; other names pass through."""
        if not model_name.startswith("run:"):
            return model_name
        name = model_name[4:]
        run = self.latest_succeeded(name)
        if run is None or not run.final_path.is_dir():
            raise RunError(
                message=f"no succeeded run named '{name}' with a final model in {self.root}",
                key="model.name",
                fix="train that run first, or check `llmtui runs`",
            )
        return str(run.final_path.resolve())
