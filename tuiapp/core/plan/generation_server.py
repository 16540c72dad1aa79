"""A grpo/rloo run's vLLM generation server (method.vllm_mode = 'server').

The supervisor starts it in the run's process group, on GPUs of its own, before the ranks: its
command (TRL's `vllm-serve`, which runs vLLM's server with the endpoints TRL's client uses to
generate and to receive the trained weights), its log (vllm-server.log in the run folder), when it
is ready (GET /health), and what the ranks are told (the URL and the weight-sync port, in their
environment). A stop, the ranks' end or the server's death ends it with the rest of the group.
Pure functions apart from start() and the readiness probe; no torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tuiapp.core.common.methods import is_rl
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.run_folder.tail import tail_lines

URL_ENV = "LLMTUI_VLLM_SERVER_URL"
GROUP_PORT_ENV = "LLMTUI_VLLM_GROUP_PORT"
LOG_NAME = rundir.VLLM_SERVER_LOG
SERVER_MEMORY_DEFAULT = 0.9  # a server alone on its GPUs; method.vllm_gpu_memory_utilization when set
READY_POLL_S = 1.0


def server_gpu_count(recipe) -> int:
    """GPUs the recipe's generation server takes (0: no server)."""
    method = recipe.method
    if is_rl(method.kind) and method.generation_backend == "vllm" and method.vllm_mode == "server":
        return int(method.vllm_server_gpus)
    return 0


def split_devices(train_ids: list[int], reserved: int, visible: int, taken: list[int] | None = None
                  ) -> tuple[list[int], list[int]]:
    """(the ranks' GPU ids, the server's): `taken` = the ids the queue gave the run (the ranks'
    first, then the server's); else the server takes the lowest visible ids the ranks do not use."""
    if taken:
        return list(taken[:len(taken) - reserved]), list(taken[len(taken) - reserved:])
    spare = [i for i in range(visible) if i not in train_ids]
    return list(train_ids), spare[:reserved]


def devices_wanted(ranks: int, gpu_ids: list[int] | None, reserved: int, visible: int, queued: bool
                   ) -> int | list[int]:
    """What the run claims in the queue (queue.try_start's `want`): the server's GPUs are the
    run's too, after the ranks'. A queued run without named GPUs takes the lowest free ones."""
    if not reserved:
        return gpu_ids if gpu_ids is not None else ranks
    if gpu_ids is None and queued:
        return ranks + reserved
    train = gpu_ids if gpu_ids is not None else list(range(ranks))
    return train + split_devices(train, reserved, visible)[1]


def memory_share(method) -> float:
    return (float(method.vllm_gpu_memory_utilization) if "vllm_gpu_memory_utilization" in method.model_fields_set
            else SERVER_MEMORY_DEFAULT)


def server_argv(recipe, model_path: str, port: int, python: str | None = None) -> list[str]:
    """TRL's `vllm-serve` on the recipe's base model, loopback only (the ranks are on this machine)."""
    method = recipe.method
    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(recipe.train.precision, "auto")
    argv = [python or sys.executable, "-m", "trl.scripts.vllm_serve", "--model", model_path,
            "--host", "127.0.0.1", "--port", str(port), "--tensor_parallel_size", str(method.vllm_server_gpus),
            "--gpu_memory_utilization", str(memory_share(method)), "--dtype", dtype,
            "--max_model_len", str(recipe.train.max_seq_len)]
    if recipe.model.trust_remote_code:
        argv.append("--trust_remote_code")
    return argv


def rank_env(url: str, group_port: int) -> dict[str, str]:
    """What the ranks need to reach the server (tuiapp.trainer.methods.rl reads it)."""
    return {URL_ENV: url, GROUP_PORT_ENV: str(group_port)}


def log_path(run_dir: Path) -> Path:
    return RunDir(run_dir).vllm_server_log


def start(run_dir: Path, argv: list[str], gpu_ids: list[int], base_env: dict | None = None) -> subprocess.Popen:
    """The server process, in the caller's process group (a run's group is killed as one), its
    output appended to the run's vllm-server.log."""
    env = dict(os.environ if base_env is None else base_env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
    env["PYTHONUNBUFFERED"] = "1"
    path = log_path(run_dir)
    with open(path, "ab") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                cwd=os.getcwd())


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass
class Readiness:
    ready: bool
    reason: str | None = None  # why not: exited, timed out, stopped


def wait_ready(process: subprocess.Popen, url: str, timeout_s: float, run_dir: Path,
               stopped: Callable[[], bool] = lambda: False, poll_s: float = READY_POLL_S) -> Readiness:
    """Until the server answers /health, exits, the timeout passes, or `stopped()` says so."""
    deadline = time.monotonic() + timeout_s
    while True:
        code = process.poll()
        if code is not None:
            return Readiness(False, f"the vLLM generation server exited with code {code} before it was ready"
                             + _last_line(run_dir))
        if healthy(url):
            return Readiness(True)
        if stopped():
            return Readiness(False, "stopped while the vLLM generation server was starting")
        if time.monotonic() >= deadline:
            return Readiness(False, f"the vLLM generation server did not answer within {timeout_s:.0f}s "
                             "(method.vllm_server_timeout_s)" + _last_line(run_dir))
        time.sleep(poll_s)


def died_reason(code: int, run_dir: Path) -> str:
    return f"the vLLM generation server exited with code {code} while the ranks trained" + _last_line(run_dir)


def _last_line(run_dir: Path) -> str:
    """The server log's last non-empty line, which names what went wrong more often than not."""
    lines = [line.strip() for line in tail_lines(log_path(run_dir), 200, max_bytes=8192) if line.strip()]
    last = next((line for line in reversed(lines) if not line.startswith("$ ")), "")
    return f": {last[:300]} (see {LOG_NAME})" if last else f" (see {LOG_NAME})"
