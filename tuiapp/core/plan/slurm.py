"""SLURM: the sbatch script of a run, and its job through sbatch / squeue / sacct / scancel.

`llmtui run RECIPE --slurm` creates the run folder on the submit host, writes
`<run>/job.sbatch` and submits it with `sbatch --parsable`. The script runs one llmtui
supervisor per allocated node with `srun` (node rank = $SLURM_NODEID, master = the first host of
the allocation); each supervisor starts DeepSpeed's runner with --no_ssh (or torchrun for the
fsdp/ddp strategies), exactly as `llmtui run --node-rank K` does by hand. Node 0's supervisor
owns run.json; the job id is recorded there as `slurm_job`.

While a SLURM run is active its truth comes from the scheduler, not from a pid (the supervisor
runs on another machine): `job_state` asks sacct, then `scontrol show job` (clusters without
accounting), then squeue. Pure builders (`sbatch_script`, `*_argv`) are golden-tested.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tuiapp.core.common.errors import RunError
from tuiapp.core.run_folder.rundir import ACTIVE as RUN_ACTIVE

SCRIPT_NAME = "job.sbatch"
PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED"}
ACTIVE = PENDING | {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"}
# scheduler end states -> (run status, reason) when the supervisor could not record its own
ENDED = {
    "COMPLETED": ("failed", "the SLURM job completed but the run recorded no outcome; see slurm-<job>.out"),
    "FAILED": ("failed", "the SLURM job failed (a node's command exited non-zero); see slurm-<job>.out"),
    "CANCELLED": ("stopped", "the SLURM job was cancelled (scancel)"),
    "TIMEOUT": ("failed", "the SLURM job hit its time limit (--time); resume it with `llmtui resume`"),
    "NODE_FAIL": ("failed", "a node of the SLURM job failed"),
    "OUT_OF_MEMORY": ("failed", "the SLURM job ran out of memory (raise --mem or lower micro_batch)"),
    "PREEMPTED": ("failed", "the SLURM job was preempted"),
    "BOOT_FAIL": ("failed", "a node of the SLURM job failed to boot"),
    "DEADLINE": ("failed", "the SLURM job missed its deadline"),
    "REVOKED": ("failed", "the SLURM job was revoked"),
}
MISSING_S = 120.0  # a job the scheduler no longer knows, for this long after submit = gone


@dataclass
class SlurmOptions:
    nodes: int = 1
    partition: str | None = None
    gpus_per_node: int | None = None  # GRES request; None = no --gpus-per-node line (CPU clusters)
    time: str | None = None
    account: str | None = None
    job_name: str = "llmtui"
    master_port: int = 0  # 0 = derived from the job id, so two jobs on one node do not collide
    stop_signal_s: int = 120  # SIGTERM this long before the time limit: a checkpoint, then exit


@dataclass
class JobState:
    state: str  # PENDING, RUNNING, COMPLETED, ... ("" = unknown)
    exit_code: str | None = None
    reason: str | None = None
    source: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def pending(self) -> bool:
        return self.state in PENDING


# ---------------------------------------------------------------- pure builders


def sbatch_script(run_dir: Path, options: SlurmOptions, *, python: str | None = None, cwd: Path | None = None,
                  env: dict[str, str] | None = None, resume: bool = False) -> str:
    """The batch script: one supervisor per node through srun."""
    q = shlex.quote
    run_dir = Path(run_dir)
    lines = ["#!/bin/bash", f"#SBATCH --job-name={options.job_name}", f"#SBATCH --nodes={options.nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if options.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={options.gpus_per_node}")
    if options.partition:
        lines.append(f"#SBATCH --partition={options.partition}")
    if options.account:
        lines.append(f"#SBATCH --account={options.account}")
    if options.time:
        lines.append(f"#SBATCH --time={options.time}")
    lines += [
        f"#SBATCH --output={run_dir / 'slurm-%j.out'}",
        "#SBATCH --open-mode=append",
        f"#SBATCH --signal=TERM@{options.stop_signal_s}",
        "# written by `llmtui run --slurm`; every node runs the llmtui supervisor of this run, which",
        "# starts `python -m deepspeed.launcher.runner --no_ssh --node_rank $SLURM_NODEID",
        "# --master_addr $MASTER_ADDR ...` (or torchrun for launch.strategy fsdp/ddp) on its node.",
        "set -euo pipefail",
        f"cd {q(str(cwd or Path.cwd()))}",
        "export PYTHONUNBUFFERED=1",
    ]
    for key, value in sorted((env or {}).items()):
        lines.append(f"export {key}={q(value)}")
    port = str(options.master_port) if options.master_port else "$((20000 + SLURM_JOB_ID % 20000))"
    lines += [
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT={port}",
        "export MASTER_ADDR MASTER_PORT",
        f'srun --nodes={options.nodes} --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c \\',
        "  'exec \"$0\" -m tuiapp.core.lifecycle.supervisor \"$1\" --node-rank \"$SLURM_NODEID\" --nnodes \"$SLURM_NNODES\" "
        "--master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" --slurm" + (" --resume" if resume else "")
        + "' \\",
        f"  {q(python or sys.executable)} {q(str(run_dir))}",
    ]
    return "\n".join(lines) + "\n"


def sbatch_argv(script: Path) -> list[str]:
    return ["sbatch", "--parsable", str(script)]


def sacct_argv(job_id: str) -> list[str]:
    return ["sacct", "-n", "-X", "-P", "-j", str(job_id), "-o", "State,ExitCode,Reason"]


def scontrol_argv(job_id: str) -> list[str]:
    return ["scontrol", "show", "job", "-o", str(job_id)]


def squeue_argv(job_id: str) -> list[str]:
    return ["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T|%r"]


def scancel_argv(job_id: str, signal: str | None = None) -> list[str]:
    """scancel; with a signal, only signal the job's steps (a graceful stop), else cancel it."""
    if signal:
        return ["scancel", "--signal", signal, str(job_id)]
    return ["scancel", str(job_id)]


def parse_sacct(text: str) -> JobState | None:
    for line in text.splitlines():
        parts = line.strip().split("|")
        if parts and parts[0]:
            state = parts[0].split()[0].rstrip("+")  # "CANCELLED by 0" -> CANCELLED
            return JobState(state, parts[1] if len(parts) > 1 else None,
                            parts[2] if len(parts) > 2 and parts[2] not in ("", "None") else None, "sacct")
    return None


def parse_scontrol(text: str) -> JobState | None:
    fields = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:
            fields[key] = value
    if "JobState" not in fields:
        return None
    reason = fields.get("Reason")
    return JobState(fields["JobState"], fields.get("ExitCode"), None if reason in (None, "None") else reason,
                    "scontrol")


def parse_squeue(text: str) -> JobState | None:
    for line in text.splitlines():
        state, _, reason = line.strip().partition("|")
        if state:
            return JobState(state, None, None if reason in ("", "None") else reason, "squeue")
    return None


def parse_job_id(text: str) -> str:
    """`sbatch --parsable` prints 'JOBID' or 'JOBID;CLUSTER'."""
    first = (text.strip().splitlines() or [""])[-1].split(";")[0].strip()
    if not first.isdigit():
        raise RunError(message=f"sbatch did not print a job id: {text.strip()[:300]!r}",
                       fix="check the sbatch options (partition, account, time) with `sbatch --test-only`")
    return first


# ---------------------------------------------------------------- the scheduler


def available() -> bool:
    return shutil.which("sbatch") is not None


def _call(argv: list[str], timeout: float = 30.0) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


def submit(script: Path) -> str:
    """Submit a batch script; returns the job id."""
    if not available():
        raise RunError(message="sbatch is not installed on this machine",
                       fix="run `llmtui run --slurm` on a SLURM login node, or use --dry-run to see the script")
    result = _call(sbatch_argv(script), timeout=120)
    if result is None:
        raise RunError(message="sbatch did not answer within 120s", fix="check the SLURM controller (sinfo)")
    if result.returncode != 0:
        raise RunError(message=f"sbatch failed: {(result.stderr or result.stdout).strip()[:500]}",
                       fix="check --partition/--account/--time/--gpus-per-node against `sinfo`")
    return parse_job_id(result.stdout)


_CACHE: dict[str, tuple[float, JobState | None]] = {}
CACHE_S = 3.0  # the TUI refreshes often; ask the scheduler at most this often per job


def job_state(job_id: str, max_age_s: float = CACHE_S) -> JobState | None:
    """The job's state (cached for max_age_s), or None when the scheduler does not know it."""
    now = time.monotonic()
    cached = _CACHE.get(str(job_id))
    if cached and now - cached[0] < max_age_s:
        return cached[1]
    state = _ask_job_state(str(job_id))
    _CACHE[str(job_id)] = (now, state)
    return state


def _ask_job_state(job_id: str) -> JobState | None:
    """sacct, else scontrol (clusters without accounting), else squeue."""
    for argv, parse in ((sacct_argv(job_id), parse_sacct), (scontrol_argv(job_id), parse_scontrol),
                        (squeue_argv(job_id), parse_squeue)):
        if not shutil.which(argv[0]):
            continue
        result = _call(argv)
        if result is None or result.returncode != 0:
            continue
        state = parse(result.stdout)
        if state is not None:
            return state
    return None


def cancel(job_id: str, signal: str | None = None) -> bool:
    result = _call(scancel_argv(job_id, signal))
    return result is not None and result.returncode == 0


# ---------------------------------------------------------------- runs


def job_of(run) -> str | None:
    job = run.record.slurm_job
    return str(job) if job else None


def refresh(run, persist: bool = True) -> None:
    """The status truth of an active SLURM run: the scheduler's job state. Called by
    Run.refresh_truth instead of the pid check."""
    job = job_of(run)
    if not job or not available():
        return
    state = job_state(job)
    if state is None:
        submitted = run.record.slurm_submitted or run.record.created or 0
        if time.time() - submitted < MISSING_S:
            return
        status, reason = "failed", f"SLURM no longer knows job {job} (purged or cancelled before it ran)"
    elif state.active:
        # in memory only: node 0's supervisor owns run.json while the job runs (no racing writes)
        run.record.slurm_state = state.state
        return
    else:
        run.load()  # node 0's supervisor may have written the outcome just now
        if run.status not in RUN_ACTIVE:
            return
        status, reason = ENDED.get(state.state, ("failed", f"the SLURM job ended in state {state.state}"))
        reason = reason.replace("<job>", job)
        if state.reason:
            reason += f" (SLURM reason: {state.reason})"
    values = {"status": status, "ended": time.time(), "reason": reason,
              "slurm_state": state.state if state else None}
    run.record.set(**values)
    if persist:
        _save_fields(run, **values)


def _save_fields(run, **values) -> None:
    try:
        run.update(**values)
    except OSError:
        pass


def stop(run, grace_s: float, wait: bool = True) -> bool:
    """Graceful stop of a SLURM run: SIGTERM to the job's steps (each supervisor checkpoints and
    exits), then scancel after the grace period. True when the job is gone."""
    job = job_of(run)
    if not job:
        return True
    state = job_state(job, 0)
    if state is not None and state.pending:
        cancel(job)
    else:
        cancel(job, signal="TERM")
    if not wait:
        return False
    deadline = time.monotonic() + grace_s + 15.0
    cancelled = False
    while time.monotonic() < deadline:
        state = job_state(job, 0)
        if state is None or not state.active:
            break
        if not cancelled and time.monotonic() > deadline - 15.0:
            cancel(job)
            cancelled = True
        time.sleep(1.0)
    state = job_state(job, 0)
    run.load()
    if run.status in RUN_ACTIVE:
        run.update(status="stopped", ended=time.time(), reason="stopped on request (scancel)",
                   slurm_state=state.state if state else None)
    return state is None or not state.active
