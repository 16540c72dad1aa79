"""The machine's resources for a launch: the GPUs it asks for, CPU ranks against the cores, the
memory estimate against free GPU memory or RAM, checkpoints against free disk.

Each problem is a Finding with the recipe key it concerns and how to fix it. Errors stop a
launch; warnings are shown and the run may go on. CUDA is detected without importing torch:
NVML (nvidia-ml-py) when it loads, else /proc/driver/nvidia/gpus; LLMTUI_FORCE_CPU=1 acts as CPU.
The door (door.py) calls these as rules of its machine phase.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import psutil

from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import is_full
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.machine.gpus import GpuInfo, cuda_available, detect_gpus
from tuiapp.core.plan import pipeline_plan
from tuiapp.core.plan.cluster import DEEPSPEED_LAUNCHED, active_hosts, hosts_of, plan_node, uses_hosts
from tuiapp.core.plan.estimate import (
    GB,
    USABLE_FRACTION,
    Estimate,
    count_parameters,
    estimate_recipe,
    trainable_parameters,
)
from tuiapp.core.plan.generation_server import server_gpu_count
from tuiapp.core.run_folder.progress import plural


def free_disk_bytes(runs_dir: str | Path) -> int:
    """Free bytes on the file system that holds runs_dir (or its nearest existing parent)."""
    path = Path(runs_dir).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


# ---------------------------------------------------------------- GPUs


def requested_gpus(recipe: Recipe, gpus: list[GpuInfo]) -> list[int]:
    """The GPU indices a launch asks for ('all' = every detected GPU)."""
    wanted = recipe.launch.gpus
    if wanted == "all":  # less the generation server's GPUs (grpo/rloo with vllm_mode 'server')
        ids = [g.index for g in gpus]
        return ids[:max(1, len(ids) - server_gpu_count(recipe))]
    if isinstance(wanted, int):
        return list(range(wanted))
    return list(wanted)


def cpu_ranks(recipe: Recipe) -> int:
    wanted = recipe.launch.gpus
    return 1 if wanted == "all" else wanted if isinstance(wanted, int) else len(wanted)


def check_gpus(recipe: Recipe, gpus: list[GpuInfo]) -> list[Finding]:
    """Requested GPUs exist and are free. Needs the NVML list (skipped when it is empty)."""
    if not gpus:
        return []
    out: list[Finding] = []
    wanted = recipe.launch.gpus
    indices = [g.index for g in gpus]
    if isinstance(wanted, int) and wanted > len(gpus):
        out.append(Finding("error", "launch.gpus", f"asks for {wanted} GPUs; this machine has {len(gpus)}",
                           f"set launch.gpus = {len(gpus)} or 'all'"))
    if isinstance(wanted, list):
        missing = [i for i in wanted if i not in indices]
        if missing:
            out.append(Finding("error", "launch.gpus", f"GPU ids {missing} do not exist; this machine "
                               f"has {indices}", f"use ids from {indices}, or launch.gpus = 'all'"))
    out += fp8_gpu_rules(recipe, gpus)
    free = [g.index for g in gpus if not g.other_processes]
    for gpu in gpus:
        if gpu.index in requested_gpus(recipe, gpus) and gpu.other_processes:
            held = sum(p.used_bytes for p in gpu.other_processes)
            pids = ", ".join(str(p.pid) for p in gpu.other_processes)
            fix = f"use free GPUs with launch.gpus = {free}" if free else "stop those processes or wait"
            out.append(Finding("warning", "launch.gpus", f"GPU {gpu.index} ({gpu.name}) is in use by "
                               f"pid {pids}, holding {held / GB:.1f} GB", fix))
    return out


# ---------------------------------------------------------------- world and memory


@dataclass(frozen=True)
class World:
    """The ranks a launch of the recipe runs: `nodes` machines, at most `per_node` ranks on one."""

    nodes: int
    per_node: int
    size: int


def launch_world(recipe: Recipe, gpus: list[GpuInfo], *, cuda: bool, base_dir: Path | None = None,
                 nodes: int | None = None, per_node: int | None = None) -> World:
    """Nodes x ranks per node, as the launch computes them (tuiapp.core.plan.cluster): hosts mode
    counts the hosts' slots DeepSpeed uses, node mode `plan_node`'s plan, one machine the ranks
    that launch.gpus asks for. `nodes` / `per_node` (the CLI's --nodes / --gpus) override the
    recipe's launch.nodes / launch.gpus_per_node."""
    launch = recipe.launch.model_copy(update={k: v for k, v in (("nodes", nodes), ("gpus_per_node", per_node)) if v})
    local = len(requested_gpus(recipe, gpus)) if cuda and gpus else cpu_ranks(recipe)
    if uses_hosts(launch) and launch.strategy in DEEPSPEED_LAUNCHED:  # DeepSpeed's runner on the head node
        counts = [n for _, n in active_hosts(launch, hosts_of(launch, base_dir))] or [local]
        return World(len(counts), max(counts), sum(counts))
    if launch.nodes > 1 or uses_hosts(launch):  # node by node, SLURM, torchrun over nodes
        plan = plan_node(launch, local, node_rank=0, nnodes=None, master_addr="node0", master_port=None,
                         base_dir=base_dir)
        return World(plan.nnodes, plan.ranks_per_node, plan.world_size)
    ranks = per_node or local
    return World(1, ranks, ranks)


def memory_estimate(recipe: Recipe, model_config: dict, *, gpus: list[GpuInfo] | None = None,
                    cuda: bool | None = None, base_dir: Path | None = None, nodes: int | None = None,
                    per_node: int | None = None) -> Estimate:
    """The one estimate `llmtui estimate`, the TUI form and preflight show: the recipe's world
    (launch_world), against the free memory of the GPUs it asks for on this machine."""
    if gpus is None:
        gpus = detect_gpus()
    if cuda is None:
        cuda = cuda_available(gpus)
    world = launch_world(recipe, gpus, cuda=cuda, base_dir=base_dir, nodes=nodes, per_node=per_node)
    capacity = None
    if cuda:
        chosen = [g for g in gpus if g.index in requested_gpus(recipe, gpus)]
        capacity = min((g.total_bytes - sum(p.used_bytes for p in g.other_processes) for g in chosen),
                       default=None)
    est = estimate_recipe(recipe, model_config, world.per_node, world.nodes, gpu_memory_bytes=capacity,
                          cuda=cuda, world=world.size)
    if recipe.launch.strategy == "pipeline":
        est = pipeline_plan.with_stages(est, recipe, model_config)
    return est


# ---------------------------------------------------------------- memory and disk


OVERSUBSCRIBE_FLAG = "--oversubscribe"
OVER_MARGIN = 2.0  # a need this many times what the machine has is an error, not a warning


def oversubscribe(findings: list[Finding]) -> list[Finding]:
    """`llmtui run --oversubscribe`: the machine-size errors (memory far beyond it, more CPU ranks
    than cores) become warnings; every other error stays."""
    return [Finding("warning", f.key, f.message, f"{OVERSUBSCRIBE_FLAG} given: launching anyway")
            if f.level == "error" and OVERSUBSCRIBE_FLAG in (f.fix or "") else f for f in findings]


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_cpu_ranks(recipe: Recipe, cores: int | None = None) -> list[Finding]:
    """A local launch without CUDA runs launch.gpus CPU ranks on this machine: no more than its
    cores (nodes and SLURM check where their ranks start)."""
    launch = recipe.launch
    if uses_hosts(launch) or launch.nodes > 1:
        return []
    ranks, cores = cpu_ranks(recipe), cores or cpu_cores()
    if ranks <= cores:
        return []
    return [Finding("error", "launch.gpus", f"asks for {ranks} CPU ranks; this machine has {cores} CPU cores "
                    "(and no CUDA GPU)", f"set launch.gpus = {cores} or fewer, or pass {OVERSUBSCRIBE_FLAG} "
                    "to launch anyway")]


def check_memory(recipe: Recipe, model_config: dict, *, cuda: bool, gpus: list[GpuInfo],
                 ram_available: int | None = None, base_dir: Path | None = None) -> list[Finding]:
    """The memory estimate against the requested GPUs (or RAM for CPU ranks): a warning when it
    does not fit, an error beyond OVER_MARGIN times what there is."""
    est = memory_estimate(recipe, model_config, gpus=gpus, cuda=cuda, base_dir=base_dir)
    if cuda:
        capacity = est.gpu_memory_bytes
        if capacity and est.total > OVER_MARGIN * capacity:
            _, _, advice = (est.warning or "").partition(": try ")
            return [Finding("error", None, f"memory: about {size_text(est.total)} per GPU, over {OVER_MARGIN:.0f}x "
                            f"the {size_text(capacity)} free", (f"try {advice}, " if advice else "")
                            + f"or pass {OVERSUBSCRIBE_FLAG} to launch anyway")]
        if est.fits is False:
            need, _, advice = est.warning.partition(": try ")
            return [Finding("warning", None, f"memory: {need}", f"try {advice}" if advice else None)]
        capacity = est.gpu_memory_bytes
        where = f" of {capacity / GB:.1f} GB free" if capacity else ""
        ranks = f" ({est.world_size} ranks on {est.nodes} nodes)" if est.nodes > 1 else ""
        return [Finding("info", None, f"memory: about {est.total / GB:.1f} GB per GPU{where}{ranks}")]
    ranks = est.n_gpus  # CPU ranks on this machine
    # each rank's runtime and model, offload, and the data cache's first tokenization in one of them
    need = est.ram_per_rank * ranks + est.memory.cpu_offload_total + est.ram_first_tokenizing
    if ram_available is None:
        ram_available = psutil.virtual_memory().available
    if need > OVER_MARGIN * ram_available:
        return [Finding("error", "launch.gpus", f"memory: {plural(ranks, 'CPU rank')} need about {size_text(need)} of RAM, "
                        f"over {OVER_MARGIN:.0f}x the {size_text(ram_available)} available",
                        "use fewer ranks (launch.gpus), a smaller micro_batch or max_seq_len, or "
                        f"gradient_checkpointing = true; or pass {OVERSUBSCRIBE_FLAG} to launch anyway")]
    if need > ram_available * USABLE_FRACTION:
        return [Finding("warning", "launch.gpus", f"memory: {plural(ranks, 'CPU rank')} need about "
                        f"{need / GB:.1f} GB of RAM; {ram_available / GB:.1f} GB is available",
                        "use fewer ranks (launch.gpus), a smaller micro_batch or max_seq_len, "
                        "or gradient_checkpointing = true")]
    return [Finding("info", None, f"memory: about {need / GB:.1f} GB of RAM for {plural(ranks, 'CPU rank')}")]


def disk_needed_bytes(recipe: Recipe, model_config: dict, *, cuda: bool) -> int:
    """Peak disk use of a run's checkpoints: save_total_limit + 1 of them exist while the oldest
    is rotated out. Each holds the weights (full) or adapter, plus Adam states of what trains."""
    half = recipe.train.precision in ("bf16", "fp16", "fp8") or (recipe.train.precision == "auto" and cuda)
    weight_bytes, optim_bytes = (2, 12) if half else (4, 8)
    trainable = trainable_parameters(model_config, recipe.method)
    full = is_full(recipe.method.kind)
    saved = trainable if not full else count_parameters(model_config)
    checkpoint = saved * weight_bytes + trainable * optim_bytes
    return (recipe.train.save_total_limit + 1) * checkpoint


def size_text(n: float) -> str:
    """Bytes in the unit that shows them: '3.2 GB', '412 MB', '96 KB', '0 bytes' (never '0.0 GB')."""
    for unit, scale in (("TB", GB * 1000), ("GB", GB), ("MB", GB / 1e3), ("KB", GB / 1e6)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{int(n)} bytes"


def check_disk(recipe: Recipe, model_config: dict, free_bytes: int, *, cuda: bool) -> list[Finding]:
    """Checkpoints against the free space at the runs dir (computed by the caller)."""
    need = disk_needed_bytes(recipe, model_config, cuda=cuda)
    fix = "free disk space, lower train.save_total_limit, or use a runs folder on a larger disk"
    limit = recipe.train.save_total_limit
    if need > free_bytes:
        return [Finding("error", "train.save_total_limit", f"checkpoints need about {size_text(need)} "
                        f"({limit} kept + 1 being written); only {size_text(free_bytes)} is free", fix)]
    if 2 * need > free_bytes:
        return [Finding("warning", "train.save_total_limit", f"checkpoints need about {size_text(need)} "
                        f"of the {size_text(free_bytes)} free (less than 2x margin)", fix)]
    return []


FP8_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) onwards


def fp8_gpu_rules(recipe: Recipe, gpus: list[GpuInfo]) -> list[Finding]:
    """train.precision = 'fp8' on GPUs older than Ada/Hopper (no FP8 tensor cores)."""
    if recipe.train.precision != "fp8":
        return []
    wanted = set(requested_gpus(recipe, gpus))
    old = [g for g in gpus if g.index in wanted and g.capability is not None and tuple(g.capability) < FP8_CAPABILITY]
    if not old:
        return []
    names = ", ".join(f"GPU {g.index} ({g.name}, compute capability {g.capability[0]}.{g.capability[1]})" for g in old)
    return [Finding("error", "train.precision", f"fp8 training needs FP8 tensor cores (compute capability 8.9+: "
                    f"Ada, Hopper, Blackwell); {names} has none", "set train.precision = 'bf16' (or 'auto')")]
