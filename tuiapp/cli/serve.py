"""`llmtui serve`: a run's model behind an OpenAI-compatible endpoint, started detached and
supervised like a run (tuiapp.core.store.served: the record, the state, stop). The server itself is
tuiapp.trainer.tools.openai_server (transformers' own server), or vLLM's when asked for and present; this process
never imports torch."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from pathlib import Path

from tuiapp.cli import numbers
from tuiapp.core.after.targets import check_shared_base, model_target
from tuiapp.core.common.errors import EXIT_FAILED, EXIT_OK, RunError, UserError
from tuiapp.core.common.methods import VLLM_ADAPTER_KINDS
from tuiapp.core.machine.gpus import cuda_available, detect_gpus
from tuiapp.core.store import queue, served
from tuiapp.core.store.runs import RunStore

READY_TIMEOUT_S = 600.0


def add_commands(add) -> None:
    p = add("serve", cmd_serve, "an OpenAI-compatible chat endpoint for a run's model (detached; --stop, --status)")
    p.add_argument("runs", nargs="*", metavar="run",
                   help="the run; several runs that trained peft adapters (LoRA...) of one base are served together, "
                        "the base loaded once, each run a model of /v1/models (omit with --status to list every "
                        "served model)")
    p.add_argument("--port", type=numbers.port(), default=8001, help="port (default: 8001)")
    p.add_argument("--host", default="localhost",
                   help="address to listen on (default: localhost); anything else needs a token")
    p.add_argument("--token", default=None, help=f"API key clients must send (default: ${served.TOKEN_ENV}; "
                   "none on localhost)")
    p.add_argument("--checkpoint", type=numbers.count(), default=None, metavar="N", help="checkpoint-N instead of final/")
    p.add_argument("--backend", choices=served.BACKENDS, default="auto",
                   help="transformers, or vllm (CUDA + the vllm package); auto: vllm when both are here")
    p.add_argument("--continuous-batching", action="store_true",
                   help="transformers backend: answer concurrent requests in one batch (transformers' continuous "
                        "batching); every request gets the run's [generate] sampling settings (another temperature "
                        "is refused) and /v1/completions is off. vLLM always batches")
    p.add_argument("--no-wait", action="store_true", help="return once started, before the model has loaded")
    p.add_argument("--stop", action="store_true", help="stop the run's server")
    p.add_argument("--status", action="store_true", help="the run's server (or every served model) and its state")
    p.add_argument("--json", action="store_true", help="with --status: one JSON document")


def _vllm_ready() -> str | None:
    """Why vLLM cannot serve here, or None."""
    if importlib.util.find_spec("vllm") is None:
        return "the vllm package is not installed"
    if not cuda_available():
        return "vLLM needs a CUDA GPU, and none is visible"
    return None


def _backend(choice: str, targets: list) -> str:
    if choice == "transformers":
        return "transformers"
    why = _vllm_ready()
    for target in targets:
        if why is None and target.kind != "full" and (target.kind != "peft" or target.method not in VLLM_ADAPTER_KINDS):
            why = (f"vLLM serves full models and LoRA adapters, and {Path(target.run_dir).name} trained a "
                   f"{target.method} adapter")
    if choice == "vllm" and why:
        raise UserError(message=f"--backend vllm: {why}",
                        fix="use --backend transformers (the default here)" if "adapter" not in why else
                            "use --backend transformers, or export the model merged and serve that")
    return "vllm" if why is None else "transformers"


def _argv(backend: str, runs: list, targets: list, args) -> list[str]:
    if backend == "transformers":
        if len(runs) > 1:
            return served.server_argv([r.path for r in runs], args.port, args.host, None)
        argv = served.server_argv(runs[0].path, args.port, args.host, runs[0].id, args.checkpoint)
        return argv + (["--continuous-batching"] if args.continuous_batching else [])
    target = targets[0]
    if target.kind == "full":
        return served.vllm_argv(target.path, args.port, args.host, runs[0].id)
    return served.vllm_argv(target.base, args.port, args.host, runs[0].id,
                            adapters={r.id: t.path for r, t in zip(runs, targets, strict=True)})


def _check_batching(runs: list) -> None:
    """--continuous-batching: one run, whose [generate] settings the batch can keep (see
    tuiapp.trainer.tools.openai_server: transformers 5.23's batch has one sampling setting and no
    repetition penalty)."""
    from tuiapp.core.config.frozen import frozen_recipe

    if len(runs) > 1:
        raise UserError(message="--continuous-batching serves one run: a batch runs one adapter at a time",
                        fix="serve the runs together without --continuous-batching, or each run alone with it")
    penalty = frozen_recipe(runs[0].path).generate.repetition_penalty
    if penalty != 1.0:
        raise UserError(message=f"{runs[0].id}'s [generate] repetition_penalty is {penalty}, and transformers' "
                                "continuous batching drops the repetition penalty",
                        fix=f"serve it without --continuous-batching: llmtui serve {runs[0].id}")


def start(runs: list, args, token: str | None) -> dict:
    """Checks, then the server in its own session; its record (written in each run's folder)."""
    if len(runs) > 1 and args.checkpoint is not None:
        raise UserError(message="--checkpoint picks one run's checkpoint, and several runs are named",
                        fix="serve their final models together, or that checkpoint alone: "
                            f"llmtui serve {runs[0].id} --checkpoint {args.checkpoint}")
    if args.continuous_batching:
        _check_batching(runs)
    targets = [model_target(run.path, args.checkpoint, purpose="be served") for run in runs]
    if len(runs) > 1:
        check_shared_base(targets)
    served.check_token(args.host, token)
    for run in runs:
        served.check_not_served(run.path)
    served.check_free(args.host, args.port)
    backend = _backend(args.backend, targets)
    run = runs[0]
    argv = _argv(backend, runs, targets, args)
    env = dict(os.environ)
    env.pop(served.TOKEN_ENV, None)
    if token:
        env[served.TOKEN_ENV if backend == "transformers" else "VLLM_API_KEY"] = token
    log = served.log_path(run.path)
    import psutil

    gpus = detect_gpus() if backend == "vllm" else []
    with queue.decision_lock(run.path.parent):  # the GPU is chosen and claimed as a run's are
        devices = served.take_devices(run.path, backend, gpus)
        with open(log, "ab") as out:
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    env=served.server_env(env, backend, devices), start_new_session=True,
                                    cwd=Path.cwd())
        try:
            created = psutil.Process(proc.pid).create_time()
        except psutil.Error:
            created = None
        served.claim(run.path, devices, proc.pid, created)
    record = {"pid": proc.pid, "pgid": proc.pid, "create_time": created, "host": args.host, "port": args.port,
              "backend": backend, "model": run.id, "target": targets[0].label, "argv": argv, "auth": bool(token),
              "started": time.time(), "log": str(log), "gpus": devices, "runs": [r.id for r in runs],
              "claim": served.claim_id(run.path), "batching": bool(args.continuous_batching and backend == "transformers")}
    for other, target in zip(runs[1:], targets[1:], strict=True):  # the same server, as each run's own record
        served.write_record(other.path, {**record, "model": other.id, "target": target.label})
    served.write_record(run.path, record)
    return record


def wait_ready(run_dir: Path, record: dict, timeout: float = READY_TIMEOUT_S) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = served.state(record)
        if now in (served.SERVING, served.EXITED, served.STOPPED):
            return now
        time.sleep(0.3)
    return served.LOADING


def _status_line(run_dir: Path, record: dict) -> str:
    now = served.state(record)
    where = served.url_of(record) if record else ""
    extra = f"  pid {record.get('pid')}  {record.get('backend')}  {record.get('target')}" if record else ""
    extra += f"  GPUs {record['gpus']}" if record.get("gpus") else ""
    auth = "  token required" if record.get("auth") else ""
    others = [r for r in record.get("runs") or [] if r != run_dir.name]
    auth += f"  with {', '.join(others)} (one base)" if others else ""
    auth += "  continuous batching" if record.get("batching") else ""
    return f"{run_dir.name}: {now}" + (f"  {where}{extra}{auth}" if now in (served.LOADING, served.SERVING) else "")


def _status_document(run_dir: Path, record: dict) -> dict:
    now = served.state(record)
    return {"run": run_dir.name, "state": now, "url": served.url_of(record) if record else None,
            **{k: record.get(k) for k in ("pid", "host", "port", "backend", "model", "target", "auth", "started",
                                          "stopped_at", "log", "gpus", "batching")},
            "runs": record.get("runs") or ([run_dir.name] if record else [])}


def cmd_serve(args) -> int:
    store = RunStore(args.runs_dir)
    if not args.runs:
        if not args.status:
            raise UserError(message="which run? `llmtui serve RUN` serves one",
                            fix="llmtui serve RUN [--port P], or llmtui serve --status to list served models")
        dirs = [d for d in store.run_dirs() if served.record_path(d).is_file()]
        rows = [(d, served.read_record(d)) for d in dirs]
        if args.json:
            print(json.dumps([_status_document(d, r) for d, r in rows], indent=2))
        else:
            live = [(d, r) for d, r in rows if served.state(r) in (served.LOADING, served.SERVING)]
            print("\n".join(_status_line(d, r) for d, r in live) or "no model is served")
        return EXIT_OK
    runs = [store.get(name) for name in args.runs]
    if args.stop:
        failed = False
        for run in runs:
            record = served.read_record(run.path)
            if not record or not served.alive(record):
                print(f"{run.id}: not served")
                continue
            gone = served.stop(run.path)
            others = [r for r in record.get("runs") or [] if r != run.id]
            print(f"{run.id}: stopped serving on {served.url_of(record)}"
                  + (f" (with {', '.join(others)}: the same server)" if others else "") if gone
                  else f"{run.id}: some processes of the server could not be killed (pgid {record.get('pgid')})")
            failed |= not gone
        return EXIT_FAILED if failed else EXIT_OK
    if args.status:
        documents = [(run, served.read_record(run.path)) for run in runs]
        if args.json:
            out = [_status_document(run.path, record) for run, record in documents]
            print(json.dumps(out[0] if len(out) == 1 else out, indent=2))
        else:
            print("\n".join(_status_line(run.path, record) for run, record in documents))
        return EXIT_OK
    token = args.token if args.token is not None else (os.environ.get(served.TOKEN_ENV) or None)
    record = start(runs, args, token)
    run, names = runs[0], ", ".join(r.id for r in runs)
    what = record["target"] if len(runs) == 1 else "adapters on one base"
    print(f"starting the {record['backend']} server of {names} ({what}) on {served.url_of(record)}; "
          f"log {record['log']}", flush=True)
    if args.no_wait:
        print(f"check with `llmtui serve {run.id} --status`; stop with `llmtui serve {run.id} --stop`")
        return EXIT_OK
    now = wait_ready(run.path, record)
    if now != served.SERVING:
        if now == served.LOADING:
            raise RunError(message=f"the server of {names} is still loading after {READY_TIMEOUT_S:.0f}s",
                           fix=f"see {record['log']}; `llmtui serve {run.id} --status`, or --stop")
        raise RunError(message=f"the server of {names} exited while starting: "
                               f"{served.log_error(run.path) or 'see its log'}", fix=f"see {record['log']}")
    models = ", ".join(f'"{r.id}"' for r in runs)
    print(f"serving {names} on {served.url_of(record)} (model{'s' if len(runs) > 1 else ''} {models}"
          + (", token required" if record["auth"] else "") + ")")
    print(f"  try: curl {served.url_of(record)}/chat/completions -H 'Content-Type: application/json' "
          f"-d '{{\"model\": \"{run.id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hi\"}}]}}'")
    print(f"  stop: llmtui serve {run.id} --stop" + (" (stops the one server of them all)" if len(runs) > 1 else ""))
    return EXIT_OK
