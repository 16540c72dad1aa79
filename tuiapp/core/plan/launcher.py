"""What a run starts, as argv built by pure functions: ranks, ports, the DeepSpeed and
supervisor commands.

A run is a supervisor process (tuiapp.core.lifecycle.supervisor) that leads its own session and process
group; it starts DeepSpeed's real launcher, which starts the ranks, all in that group (on one
node its per-node launcher directly, as the `deepspeed` command would; across nodes the runner).
Never a shell, never a pipe to the caller: the run outlives whatever started it. Starting,
stopping and resuming live in tuiapp.core.lifecycle.service.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import sys
from pathlib import Path

from tuiapp.core.common.errors import RunError
from tuiapp.core.config.recipe import LaunchSpec
from tuiapp.core.machine.gpus import cuda_device_count  # noqa: F401 (where callers look for it)
from tuiapp.core.run_folder.rundir import RunDir

STOP_GRACE_S = 60.0


def torch_extensions_dir(env: dict | None = None) -> str:
    """Where ranks JIT-build DeepSpeed's ops (TORCH_EXTENSIONS_DIR): the user's setting, else a
    folder of the llmtui cache per Python environment and torch version. The default
    (~/.cache/torch_extensions) is shared by every environment, which rebuild the op in turn."""
    env = os.environ if env is None else env
    if env.get("TORCH_EXTENSIONS_DIR"):
        return env["TORCH_EXTENSIONS_DIR"]
    import hashlib
    from importlib import metadata

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    cache = Path(env.get("LLMTUI_CACHE") or "~/.cache/llmtui").expanduser()
    key = hashlib.sha1(f"{sys.prefix}\0{torch_version}".encode()).hexdigest()[:12]
    return str(cache / "torch_extensions" / key)


# PyTorch's CUDA allocator grows segments in place instead of caching a new block per batch shape:
# packed and padded batches change shape every step, and on an H200 the default let a run's reserved
# memory reach 2.3x its allocated peak (66.6 vs 28.8 GiB, bench/GPU_RESULTS.md), an OOM long after step 1.
ALLOCATOR_DEFAULT = "expandable_segments:True"


def rank_env(ranks_sharing: int = 1, base: dict | None = None) -> dict:
    """The environment of a run's ranks (and of the probe's): unbuffered output, no tokenizer
    threads, the CPU's threads split between the ranks that share it, DeepSpeed's op folder, and
    the allocator setting above unless the user set one (PYTORCH_ALLOC_CONF or the CUDA name)."""
    env = dict(os.environ if base is None else base)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["TORCH_EXTENSIONS_DIR"] = torch_extensions_dir(env)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, ranks_sharing))))
    if not env.get("PYTORCH_ALLOC_CONF") and not env.get("PYTORCH_CUDA_ALLOC_CONF"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR_DEFAULT
    return env


def plan_ranks(launch: LaunchSpec, cuda_count: int, reserved: int = 0) -> tuple[int, list[int] | None]:
    """How many ranks, and which GPU ids (None = the first N / CPU ranks). `reserved`: GPUs kept
    for a generation server, which 'all' leaves out."""
    gpus = launch.gpus
    if isinstance(gpus, list):
        if cuda_count and max(gpus) >= cuda_count:
            raise RunError(
                message=f"GPU ids {gpus} requested but only {cuda_count} GPUs are visible",
                key="launch.gpus",
                fix=f"use ids below {cuda_count}",
            )
        return len(gpus), (gpus if cuda_count else None)
    if gpus == "all":
        return max(1, cuda_count - reserved), None
    if cuda_count and gpus > cuda_count:
        raise RunError(
            message=f"{gpus} GPUs requested but only {cuda_count} are visible",
            key="launch.gpus",
            fix=f"set launch.gpus to at most {cuda_count}",
        )
    return gpus, None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def local_launch_argv(module: str, ranks: int, gpu_ids: list[int] | None, master_port: int, *,
                      rank_logs: Path | None = None, python: str | None = None) -> list[str]:
    """DeepSpeed's per-node launcher (deepspeed.launcher.launch) for ranks on this machine, started
    directly. On one node the `deepspeed` command (deepspeed.launcher.runner) only works out this
    same command and starts it: one process less, whose imports cost seconds before a rank starts.
    `--world_info` is {"localhost": device ids} in base64 JSON, as the runner encodes it."""
    ids = list(gpu_ids) if gpu_ids is not None else list(range(ranks))
    world = base64.urlsafe_b64encode(json.dumps({"localhost": ids}).encode()).decode()
    argv = [python or sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}",
            "--master_addr=127.0.0.1", f"--master_port={master_port}", "--module"]
    if rank_logs is not None:
        argv.append(f"--enable_each_rank_log={rank_logs}")
    return argv + ["--log_level=info", module]


def single_rank_argv(module: str, gpu_ids: list[int] | None, master_port: int, *,
                     python: str | None = None) -> list[str]:
    """One rank on this machine, started the way DeepSpeed's per-node launcher starts it (the same
    environment and arguments) but without that launcher: for one rank it would only wait on it,
    after importing torch and DeepSpeed for seconds first. `env` sets the variables and execs Python
    in the same process, so the recorded command is complete and can be run by hand."""
    ids = list(gpu_ids) if gpu_ids else [0]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in ids), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(master_port), "WORLD_SIZE": "1", "CROSS_RANK": "0", "CROSS_SIZE": "1",
           "LOCAL_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
           # `import deepspeed` sets this default in the launcher, and its ranks inherit it
           "PYTORCH_NVML_BASED_CUDA_CHECK": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK", "1")}
    return ["env", *(f"{key}={value}" for key, value in env.items()), python or sys.executable, "-u", "-m", module,
            "--local_rank=0"]


def rank_log_path(run_dir: Path, rank: int = 0) -> Path:
    """ranks/<start time>_rank<N>.log, the name DeepSpeed's launcher gives each rank's log."""
    return RunDir(run_dir).new_rank_log(rank)


def world_note(argv: list | None) -> str | None:
    """What the opaque --world_info of a per-node launch command says, for people reading it."""
    for arg in argv or []:
        if str(arg).startswith("--world_info="):
            try:
                world = json.loads(base64.urlsafe_b64decode(str(arg).split("=", 1)[1]))
            except ValueError:
                return None
            return "  (--world_info = " + json.dumps(world) + ": the device ids of each host's ranks)"
    return None


def starts_rank_directly(ranks: int) -> bool:
    """One local rank needs no launcher: the supervisor starts it and logs its output to ranks/."""
    return ranks == 1


def deepspeed_argv(
    run_dir: Path,
    ranks: int,
    gpu_ids: list[int] | None,
    master_port: int,
    resume: bool = False,
    python: str | None = None,
) -> list[str]:
    """The exact command of the DeepSpeed launcher for one node: each rank logs to ranks/. One rank
    is started without the launcher (`single_rank_argv`); the supervisor sends its output to ranks/."""
    if starts_rank_directly(ranks):
        argv = single_rank_argv("tuiapp.trainer", gpu_ids, master_port, python=python)
    else:
        argv = local_launch_argv("tuiapp.trainer", ranks, gpu_ids, master_port, rank_logs=RunDir(run_dir).ranks,
                                 python=python)
    argv += ["--run-dir", str(run_dir)]
    if resume:
        argv.append("--resume")
    return argv


def supervisor_argv(run_dir: Path, resume: bool = False, port: int | None = None, python: str | None = None) -> list[str]:
    argv = [python or sys.executable, "-m", "tuiapp.core.lifecycle.supervisor", str(run_dir)]
    if port:
        argv += ["--master-port", str(port)]
    if resume:
        argv.append("--resume")
    return argv


def signal_group(pgid: int, signum: int = signal.SIGTERM) -> None:
    """Signal a run's whole process group (supervisor, launcher, ranks)."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def master_port_of(argv: list | None) -> str | None:
    """The rendezvous port a recorded DeepSpeed command uses (`--master_port P` or `=P`)."""
    argv = [str(a) for a in argv or []]
    for i, arg in enumerate(argv):
        if arg == "--master_port" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(("--master_port=", "MASTER_PORT=")):
            return arg.split("=", 1)[1]
    return None
