"""A run's model served over an OpenAI-compatible HTTP endpoint (`llmtui serve`): the record of
the server, its state, and how to start and stop it. Pure: the server process itself is
tuiapp.trainer.tools.openai_server (transformers) or vLLM's own server.

The server is supervised like a run: started in its own session (it outlives the command that
started it), its pid, process group and start time recorded in `runs/<id>/serve.json` (written
only by the command that starts or stops it, atomically), its output in `runs/<id>/serve.log`.
What it is doing is never taken from the record alone: a dead pid means it has exited, whatever
the record says, and a live one is asked over HTTP (`/health`) whether it is loading or serving.

The auth token never reaches the record, the command line or the log: it travels in the
server's environment ($LLMTUI_SERVE_TOKEN) and the record only says that one is required.

The device queue counts a served model (tuiapp.core.store.queue): its claim, `<run id>.serve` in
.queue/claims/, is owned by the server's own pid and process group, so it goes when the server
stops (`stop` removes it) or dies (the queue prunes a claim whose processes are gone). vLLM takes
one GPU (the lowest free one: no run's claim, no foreign process on it), given to it alone by
CUDA_VISIBLE_DEVICES, and a queued run waits for it; a serve is refused when no GPU is free. The
transformers backend answers on the CPU (tuiapp.trainer.tools.inference loads there), so its claim holds
no GPU (CUDA is hidden from it) and no CPU slot: a served model is idle between requests, and
counting it as a slot would hold every queued CPU run (1 slot by default) for as long as it is
served.

Several runs on one server (`llmtui serve RUN_A RUN_B`: peft adapters of one base, the base loaded
once): each run's serve.json holds the same server (pid, process group, port) with `runs`, every
run it serves, and `model`, the run's own model id; so `--status`, the TUI's list and doctor read
each run as served, and stopping any of them stops the one server and marks each run's record
stopped. The queue claim is one, the first run's (`claim`: its name in .queue/claims/).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tuiapp.core.common import trainer_tools
from tuiapp.core.common.errors import RunError, UserError
from tuiapp.core.machine.gpus import GpuInfo
from tuiapp.core.machine.procs import group_processes, process_alive
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store import queue

SERVE_JSON = rundir.SERVE_JSON
SERVE_LOG = rundir.SERVE_LOG
TOKEN_ENV = "LLMTUI_SERVE_TOKEN"
LOOPBACK = ("localhost", "127.0.0.1", "::1")
BACKENDS = ("auto", "transformers", "vllm")
STOP_GRACE_S = 10.0
# states of a served model, as `state()` derives them
LOADING, SERVING, EXITED, STOPPED, NOT_SERVED = "loading", "serving", "exited", "stopped", "not served"


def record_path(run_dir: Path) -> Path:
    return RunDir(run_dir).serve_record


def log_path(run_dir: Path) -> Path:
    return RunDir(run_dir).serve_log


def read_record(run_dir: Path) -> dict:
    try:
        data = json.loads(record_path(run_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_record(run_dir: Path, record: dict) -> None:
    atomic_write_text(record_path(run_dir), json.dumps(record, indent=2, sort_keys=True) + "\n")


def alive(record: dict) -> bool:
    return process_alive(record.get("pid"), record.get("create_time"))


def url_of(record: dict) -> str:
    host = record.get("host") or "localhost"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{record.get('port')}/v1"


def health(record: dict, timeout: float = 2.0) -> dict | None:
    """The server's own answer to GET /health ({"status": "loading"|"ok", ...}); None when it does
    not answer (not listening yet, or gone)."""
    host = record.get("host") or "localhost"
    if host in ("0.0.0.0", "::"):
        host = "localhost"
    host = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{host}:{record.get('port')}/health", timeout=timeout) as answer:
            data = json.loads(answer.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:  # 503 while loading carries the same JSON
        try:
            data = json.loads(exc.read().decode("utf-8"))
        except (ValueError, OSError):
            return None
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def state(record: dict) -> str:
    """loading | serving | exited | stopped | not served: the truth, from the process and the server."""
    if not record:
        return NOT_SERVED
    if not alive(record):
        return STOPPED if record.get("stopped_at") else EXITED
    answer = health(record)
    return SERVING if answer and answer.get("status") == "ok" else LOADING


def live_records(run_dirs: Iterable[Path]) -> dict[str, dict]:
    """Run id -> the record of each run whose server lives (a stat per run; a read and a pid check
    only where serve.json is): cheap enough for the history's poll."""
    out = {}
    for run_dir in run_dirs:
        if record_path(run_dir).is_file():
            record = read_record(run_dir)
            if record and alive(record):
                out[Path(run_dir).name] = record
    return out


def siblings(run_dir: Path, record: dict) -> list[Path]:
    """The other runs the same server serves (several adapters on one base), whose records still
    name this server (a later server of theirs is theirs alone)."""
    run_dir = Path(run_dir)
    out = []
    for name in record.get("runs") or []:
        other = run_dir.parent / str(name)
        if other != run_dir:
            theirs = read_record(other)
            if theirs.get("pid") == record.get("pid") and theirs.get("create_time") == record.get("create_time"):
                out.append(other)
    return out


@dataclass(frozen=True)
class Served:
    """A served model as the TUI's list and `llmtui serve --status` show it."""

    run_id: str
    run_dir: Path
    url: str
    state: str  # loading | serving (asked over HTTP)
    backend: str
    pid: int | None = None
    gpus: list[int] = field(default_factory=list)
    auth: bool = False
    shared: tuple[str, ...] = ()  # the other runs this server serves (adapters of one base)


def served_models(run_dirs: Iterable[Path]) -> list[Served]:
    """Every live server among these runs, with its state (an HTTP /health each: call off the UI thread)."""
    out = []
    for run_dir in run_dirs:
        record = live_records([run_dir]).get(Path(run_dir).name)
        if record is not None:
            name = Path(run_dir).name
            out.append(Served(name, Path(run_dir), url_of(record), state(record),
                              str(record.get("backend") or "?"), record.get("pid"), list(record.get("gpus") or []),
                              bool(record.get("auth")), tuple(r for r in record.get("runs") or [] if r != name)))
    return out


def log_tail(run_dir: Path, lines: int = 12) -> str:
    """The server's log (several runs on one server: the first run's serve.log, as the record names it)."""
    try:
        text = Path(read_record(run_dir).get("log") or log_path(run_dir)).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def log_error(run_dir: Path) -> str | None:
    """The server's own error line (`error: ...` or an exception's last line), when it printed one."""
    lines = [ln.strip() for ln in log_tail(run_dir, 200).splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith("error: ") or (": " in line and line.split(":")[0].endswith(("Error", "Exception"))):
            return line
    return None


# ---------------------------------------------------------------- checks before starting


def check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise UserError(message=f"--port {port} is not a TCP port", fix="use a port from 1 to 65535, e.g. --port 8001")


SERVE_PORT_FIX = "pick another --port, or stop what uses this one (`llmtui serve --status` lists the models llmtui serves)"


def check_free(host: str, port: int, fix: str = SERVE_PORT_FIX) -> list[str]:
    """Refuse a port something already listens on, before anything starts (as the server will
    bind it); returns the addresses the host name resolves to."""
    check_port(port)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(message=f"--host {host}: {exc.strerror}", fix="use localhost or an address of this machine") \
            from None
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            try:
                probe.bind(address)
            except OSError as exc:
                raise UserError(message=f"cannot listen on {host}:{port}: {exc.strerror or exc}", fix=fix) from None
    return [info[4][0] for info in infos]


def check_token(host: str, token: str | None) -> None:
    """Anything beyond loopback needs a token: the endpoint runs the model for whoever reaches it."""
    if host not in LOOPBACK and not token:
        raise UserError(message=f"--host {host} opens the endpoint beyond this machine, and no token is set",
                        fix=f"set one (--token TOKEN or ${TOKEN_ENV}); clients send it as their API key. "
                            "Or keep --host localhost and forward the port over SSH")
    if token is not None and (len(token) < 8 or any(c.isspace() for c in token)):
        raise UserError(message="the serve token is too short or has spaces",
                        fix="use at least 8 characters without spaces, e.g. `python -c 'import secrets; "
                            "print(secrets.token_urlsafe())'`")


def check_not_served(run_dir: Path) -> None:
    record = read_record(run_dir)
    if record and alive(record):
        raise RunError(message=f"{Path(run_dir).name} is already served on {url_of(record)} (pid {record.get('pid')})",
                       fix=f"use that endpoint, or stop it first: llmtui serve {Path(run_dir).name} --stop")


def server_argv(run_dir: Path | list[Path], port: int, host: str, model_id: str | None, checkpoint: int | None = None,
                python: str | None = None) -> list[str]:
    """The transformers server (the openai_server trainer tool): one run, or several runs' adapters
    on their one base (each named by its run id)."""
    dirs = [str(d) for d in run_dir] if isinstance(run_dir, list) else [str(run_dir)]
    argv = trainer_tools.argv("openai_server", [*dirs, "--port", str(port), "--host", host]
                              + (["--model-id", model_id] if model_id and len(dirs) == 1 else []), python)
    if checkpoint is not None:
        argv += ["--checkpoint", str(checkpoint)]
    return argv


def vllm_argv(model_path: str, port: int, host: str, model_id: str, adapter: str | None = None,
              python: str | None = None, adapters: dict[str, str] | None = None) -> list[str]:
    """vLLM's OpenAI server on a full model, or on the base with the run's LoRA adapter, or with
    several runs' (`adapters`: model id -> adapter folder; vLLM's --lora-modules, each a model of
    /v1/models, a request's `model` picking it). The token reaches it as $VLLM_API_KEY, never on
    the command line."""
    argv = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", host, "--port", str(port)]
    if adapter:
        adapters = {model_id: adapter}
    if adapters:
        several = ["--max-loras", str(len(adapters))] if len(adapters) > 1 else []  # vLLM's default: 1 per batch
        return argv + ["--model", model_path, "--enable-lora", *several,
                       "--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]
    return argv + ["--model", model_path, "--served-model-name", model_id]


# ---------------------------------------------------------------- the device queue


def claim_id(run_dir: Path) -> str:
    """The served model's name in .queue/claims/ (beside its run's own claim, if it trains again)."""
    return f"{Path(run_dir).name}.serve"


def take_devices(run_dir: Path, backend: str, cuda_gpus: list[GpuInfo]) -> list[int]:
    """Under queue.decision_lock: the GPUs the server gets. vLLM on CUDA: the lowest free one, or
    RunError naming who holds them; transformers (CPU) or no CUDA: none."""
    if backend != "vllm" or not cuda_gpus:
        return []
    root = Path(run_dir).parent
    live = queue.claims(root)
    devices = queue.fit(1, cuda_gpus=cuda_gpus, live=live, slots=1)
    if devices is None:
        holders = ", ".join(sorted(f"{name} (GPUs {c.get('devices')})" for name, c in live.items() if c.get("devices")))
        raise RunError(message="no free GPU to serve on: " + (f"held by {holders}" if holders else
                                                               "each is used by a process outside llmtui"),
                       fix="wait for a run to end (or stop one), or serve on the CPU with --backend transformers")
    return devices


def server_env(env: dict, backend: str, devices: list[int]) -> dict:
    """The server sees only the GPUs it claimed (none for the transformers backend, on the CPU)."""
    if backend == "vllm" and not devices:
        return env
    return {**env, "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in devices)}


def claim(run_dir: Path, devices: list[int], pid: int, create_time: float | None) -> None:
    """The served model's claim in the queue, owned by the server's process (group)."""
    queue.write_claim(Path(run_dir).parent, claim_id(run_dir), devices, pid, create_time, pgid=pid, slots_used=0)


def queue_claims(runs_root: Path) -> dict[str, dict]:
    """Run id -> the live claim of its served model, for every served model (`llmtui queue` lists them)."""
    suffix = claim_id(Path("x")).removeprefix("x")
    return {name.removesuffix(suffix): claim for name, claim in queue.claims(runs_root).items() if name.endswith(suffix)}


def queue_claim(run_dir: Path) -> dict | None:
    """The served model's live claim (None once its processes are gone: the queue pruned it)."""
    return queue.claims(Path(run_dir).parent).get(claim_id(run_dir))


# ---------------------------------------------------------------- stop


def stop(run_dir: Path, grace_s: float = STOP_GRACE_S) -> bool:
    """SIGTERM to the server's process group, SIGKILL after the grace period; the record says when.
    True when nothing of it is left."""
    record = read_record(run_dir)
    if not record:
        return True
    pgid = record.get("pgid")
    signalled = alive(record) and bool(pgid)
    if signalled:
        record["stopped_at"] = time.time()  # asked to stop: once it is gone it is stopped, not exited
        write_record(run_dir, record)
        try:
            os.killpg(pgid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and (alive(record) or group_processes(pgid)):
            time.sleep(0.1)
        if group_processes(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and (alive(record) or group_processes(pgid)):
                time.sleep(0.1)
    gone = not alive(record) and not group_processes(pgid)
    if gone:
        queue.release(Path(run_dir).parent, record.get("claim") or claim_id(run_dir))
        if signalled:
            for other in siblings(run_dir, record):  # the runs served with it: stopped too
                theirs = read_record(other)
                theirs["stopped_at"] = record["stopped_at"]
                write_record(other, theirs)
    return gone
