"""Checks before any launch: the recipe against this machine (GPUs, disk, memory, libraries).

Each problem is a Finding with the recipe key it concerns and how to fix it. Errors stop a
launch; warnings are shown and the run may go on. CUDA is detected without importing torch:
NVML (nvidia-ml-py) when it loads, else /proc/driver/nvidia/gpus; LLMTUI_FORCE_CPU=1 acts as CPU.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import psutil

from tuiapp.core.common.errors import UserError
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import METHODS, is_full, is_lora, is_quantized, is_trl, trains_on_text
from tuiapp.core.config import trackers
from tuiapp.core.config.recipe import AUTO_EVAL_SPLIT, Recipe
from tuiapp.core.machine.gpus import GpuInfo, cuda_available, detect_gpus
from tuiapp.core.plan import pipeline_plan
from tuiapp.core.plan.cluster import DEEPSPEED_LAUNCHED, active_hosts, hosts_of, plan_node, uses_hosts
from tuiapp.core.plan.estimate import (
    GB,
    USABLE_FRACTION,
    Estimate,
    count_parameters,
    estimate_recipe,
    targeted_linears,
    trainable_parameters,
)
from tuiapp.core.plan.generation_server import server_gpu_count
from tuiapp.core.prelaunch import optimizer_checks
from tuiapp.core.prelaunch.cluster_checks import scale_rules
from tuiapp.core.run_folder.progress import plural


def bitsandbytes_installed() -> bool:
    return importlib.util.find_spec("bitsandbytes") is not None


def free_disk_bytes(runs_dir: str | Path) -> int:
    """Free bytes on the file system that holds runs_dir (or its nearest existing parent)."""
    path = Path(runs_dir).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


# ---------------------------------------------------------------- rules


def recipe_rules(recipe: Recipe) -> list[Finding]:
    """Cross-field rules that hold on any machine (DeepSpeed and peft constraints)."""
    out: list[Finding] = []
    train, launch, kind = recipe.train, recipe.launch, recipe.method.kind
    if recipe.dataset.eval_split_auto:
        asked = " and ".join(n for n, on in (("train.eval_steps", train.eval_steps), ("train.sample_prompts",
                                                                                    train.sample_prompts)) if on)
        mixture = bool(recipe.dataset.sources)  # each source without an eval_split of its own holds its share out
        share = AUTO_EVAL_SPLIT if mixture else recipe.dataset.eval_split
        where = "each source without an eval_split" if mixture else "the training data"
        setting = "eval_split in the [[dataset.sources]] tables" if mixture else "dataset.eval_split"
        out.append(Finding("info", "dataset.eval_split", f"{share:.0%} of {where} is "
                           f"held out for eval: {asked} {'ask' if ' and ' in asked else 'asks'} for evals, and eval_split 0 "
                           "would skip them",
                           f"set {setting} to another fraction or an eval file, or train.eval_steps = 0 "
                           "and no sample_prompts for no evals"))
    splits = [s.eval_split for s in recipe.dataset.sources] or [recipe.dataset.eval_split]
    if train.early_stopping_patience and (not train.eval_steps or all(s in (0, 0.0, "") for s in splits)):
        out.append(Finding("error", "train.early_stopping_patience", "early stopping watches the eval loss, but "
                           "this run never evaluates before its end", "set train.eval_steps > 0 and dataset.eval_split "
                           "(a fraction or a file), or early_stopping_patience = 0"))
    if is_quantized(kind) and launch.zero_stage == 3:
        out.append(Finding("error", "launch.zero_stage", "ZeRO-3 cannot partition the 4-bit base "
                           "weights of qlora", "set launch.zero_stage = 2 or lower"))
    if not METHODS[kind].checkpointing and train.gradient_checkpointing:
        out.append(Finding("error", "train.gradient_checkpointing", "prefix tuning passes learned past "
                           "key/values, which gradient checkpointing does not support",
                           "set train.gradient_checkpointing = false"))
    if train.packing is True and not is_trl(kind) and not METHODS[kind].packs:
        out.append(Finding("error", "train.packing", f"{kind} adds virtual tokens or past key/values, "
                           "which would attend across packed examples",
                           "set train.packing = false (or 'auto')"))
    if launch.offload_params != "none" and launch.zero_stage != 3:
        out.append(Finding("error", "launch.offload_params",
                           f"parameter offload needs ZeRO-3; zero_stage is {launch.zero_stage}",
                           "set launch.zero_stage = 3, or launch.offload_params = 'none'"))
    if launch.offload_optimizer != "none" and launch.zero_stage == 0:
        out.append(Finding("error", "launch.offload_optimizer",
                           "optimizer offload needs ZeRO stage 1, 2 or 3; zero_stage is 0",
                           "set launch.zero_stage = 2, or launch.offload_optimizer = 'none'"))
    if "nvme" in (launch.offload_optimizer, launch.offload_params):
        if not launch.nvme_path:
            out.append(Finding("error", "launch.nvme_path", "nvme offload needs a folder on NVMe",
                               "set launch.nvme_path = '/path/on/local/nvme', or offload to 'cpu'"))
        elif not Path(launch.nvme_path).expanduser().is_dir():
            out.append(Finding("error", "launch.nvme_path",
                               f"nvme_path '{launch.nvme_path}' is not an existing folder",
                               "create it on a local NVMe drive, or fix the path"))

    out += batching_rules(recipe)
    out += mixture_rules(recipe)
    out += streaming_rules(recipe)
    out += scale_rules(recipe)
    out += pipeline_plan.rules(recipe)
    return out


def mixture_rules(recipe: Recipe) -> list[Finding]:
    """[[dataset.sources]]: what a mixture of sources trains (the Trainer of pretraining, SFT and the
    adapter methods, on text and chats, from tokenized cache entries)."""
    spec, kind = recipe.dataset, recipe.method.kind
    if not spec.sources:
        return []
    one = "or use one dataset (no [[dataset.sources]])"
    out: list[Finding] = []
    if is_trl(kind):
        out.append(Finding("error", "dataset.sources", f"{kind} reads its pairs, feedback or prompts from one "
                           "dataset: mixtures are for pretraining, SFT and the adapter methods", one))
    if spec.streaming:
        out.append(Finding("error", "dataset.streaming", "a mixture interleaves its sources' tokenized cache "
                           "entries, which a stream does not build", f"set dataset.streaming = false, {one}"))
    if recipe.launch.strategy == "pipeline":
        out.append(Finding("error", "launch.strategy", "the pipeline strategy batches one dataset",
                           f"use the deepspeed strategy, {one}"))
    return out


def streaming_rules(recipe: Recipe) -> list[Finding]:
    """dataset.streaming reads and tokenizes the files while training: what a stream cannot do."""
    spec, train, kind = recipe.dataset, recipe.train, recipe.method.kind
    if not spec.streaming or spec.sources:  # a mixture's stream: mixture_rules
        return []
    out: list[Finding] = []
    off = "or dataset.streaming = false"
    if is_trl(kind):
        out.append(Finding("error", "dataset.streaming", f"{kind} reads its pairs or prompts whole: streaming is for "
                           "pretraining, SFT and the adapter methods", "set dataset.streaming = false"))
    if not train.max_steps:
        out.append(Finding("error", "train.max_steps", "a stream has no length, so epochs cannot be counted",
                           f"set train.max_steps (e.g. 1000), {off}"))
    if train.batching == "tokens":
        out.append(Finding("error", "train.batching", "token-budget batches sort the whole dataset by length",
                           f"set train.batching = 'examples', {off}"))
    if train.micro_batch == "auto":
        out.append(Finding("error", "train.micro_batch", "'auto' is probed on the dataset's longest examples, which a "
                           "stream does not know ahead", f"set train.micro_batch to a number (e.g. 8), {off}"))
    if recipe.launch.strategy == "pipeline":
        out.append(Finding("error", "launch.strategy", "the pipeline strategy cuts its batches from a dataset of "
                           "known length", f"use the deepspeed strategy, {off}"))
    fraction = isinstance(spec.eval_split, float) or _is_number(spec.eval_split)
    if fraction and float(spec.eval_split) > 0:
        out.append(Finding("error", "dataset.eval_split", "a stream cannot hold a fraction out",
                           f"set dataset.eval_split to an eval file (e.g. 'data/eval.jsonl') or 0, {off}"))
    elif fraction and (train.eval_steps or train.sample_prompts):
        out.append(Finding("error", "dataset.eval_split", "evals are asked for (train.eval_steps or sample_prompts), "
                           "and a stream holds nothing out for them",
                           f"set dataset.eval_split to an eval file, or train.eval_steps = 0 and no sample_prompts, {off}"))
    return out


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def batching_rules(recipe: Recipe) -> list[Finding]:
    """batching 'tokens' packs examples: only for the methods whose batches can be packed."""
    train, kind = recipe.train, recipe.method.kind
    if train.batching != "tokens":
        return []
    if trains_on_text(kind) or not METHODS[kind].packs:
        return [Finding("error", "train.batching", f"token budgets pack examples into rows; {kind} batches "
                        "cannot be packed (pretrain blocks are full already)", "set train.batching = 'examples'")]
    if train.packing is False:
        return [Finding("error", "train.batching", "batching 'tokens' packs the examples of a micro batch, "
                        "and train.packing is false", "set train.packing = 'auto', or train.batching = 'examples'")]
    if 0 < train.tokens_per_batch < train.max_seq_len:
        return [Finding("error", "train.tokens_per_batch", f"{train.tokens_per_batch} is below max_seq_len "
                        f"({train.max_seq_len}): the longest examples would not fit a micro batch",
                        f"set train.tokens_per_batch >= {train.max_seq_len} (or 0 = micro_batch x max_seq_len)")]
    return []


def machine_rules(recipe: Recipe, *, cuda: bool, bnb_installed: bool | None = None) -> list[Finding]:
    """Rules that depend on this machine: CUDA and installed libraries."""
    out: list[Finding] = []
    precision = recipe.train.precision
    if precision in ("bf16", "fp16") and not cuda:
        out.append(Finding("error", "train.precision",
                           f"{precision} training needs a CUDA GPU and this machine has none",
                           "set train.precision = 'fp32' or 'auto'"))
    out += fp8_rules(recipe, cuda=cuda)
    if is_quantized(recipe.method.kind):
        if not cuda:
            out.append(Finding("error", "method.kind", "qlora needs a CUDA GPU (4-bit bitsandbytes "
                               "kernels) and this machine has none",
                               "use method.kind = 'lora' on CPU, or run on a CUDA machine"))
        if not (bitsandbytes_installed() if bnb_installed is None else bnb_installed):
            out.append(Finding("error", "method.kind", "qlora needs the bitsandbytes package, which "
                               "is not installed", "pip install bitsandbytes (or use method.kind = 'lora')"))
    out += kernel_rules(recipe, cuda=cuda)
    out += optimizer_checks.rules(recipe, cuda=cuda)  # train.optimizer: device, packages, strategy
    out += trackers.findings(recipe.train.report_to)
    return out


FP8_CAPABILITY = (8, 9)  # float8 tensor cores: Ada (8.9) and Hopper (9.0) onwards


def fp8_rules(recipe: Recipe, *, cuda: bool, torchao_installed: bool | None = None) -> list[Finding]:
    """train.precision = 'fp8' (torchao's float8 training): a CUDA GPU, the torchao package. The GPUs'
    compute capability is checked with the GPUs (fp8_gpu_rules)."""
    if recipe.train.precision != "fp8":
        return []
    if not is_full(recipe.method.kind):
        return [Finding("error", "train.precision", f"fp8 training converts the model's own linear layers, "
                        f"which {recipe.method.kind} does not train in full", "use method.kind = 'sft' or "
                        "'pretrain' with fp8, or set train.precision = 'bf16'")]
    if not cuda:
        return [Finding("error", "train.precision", "fp8 training needs a CUDA GPU with FP8 tensor cores "
                        "(compute capability 8.9+: Ada, Hopper, Blackwell) and this machine has none",
                        "set train.precision = 'auto' (fp32 on CPU)")]
    if not (importlib.util.find_spec("torchao") is not None if torchao_installed is None else torchao_installed):
        return [Finding("error", "train.precision", "fp8 training needs the torchao package, which is not "
                        "installed", "pip install 'llmtui[fp8]' (torchao), or set train.precision = 'bf16'")]
    return []


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


def kernel_rules(recipe: Recipe, *, cuda: bool) -> list[Finding]:
    """model.attn_implementation, train.liger_kernel, train.torch_compile on this machine."""
    out: list[Finding] = []
    if recipe.model.attn_implementation == "flash_attention_2":
        if not cuda:
            out.append(Finding("error", "model.attn_implementation", "flash_attention_2 needs a CUDA GPU and "
                               "this machine has none", "set model.attn_implementation = 'auto' or 'sdpa'"))
        elif importlib.util.find_spec("flash_attn") is None:
            out.append(Finding("error", "model.attn_implementation", "flash_attention_2 needs the flash_attn "
                               "package, which is not installed", "pip install flash-attn, or set "
                               "model.attn_implementation = 'auto'"))
    if recipe.train.liger_kernel:
        if not cuda:
            out.append(Finding("error", "train.liger_kernel", "liger-kernel's Triton kernels need a CUDA GPU and "
                               "this machine has none", "set train.liger_kernel = false"))
        elif importlib.util.find_spec("liger_kernel") is None:
            out.append(Finding("error", "train.liger_kernel", "train.liger_kernel needs the liger-kernel "
                               "package, which is not installed", "pip install liger-kernel, or set "
                               "train.liger_kernel = false"))
    if recipe.train.torch_compile and not cuda and not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        out.append(Finding("error", "train.torch_compile", "torch.compile on CPU builds C++ kernels and "
                           "no C compiler (cc, gcc, clang) is on PATH", "install gcc, or set "
                           "train.torch_compile = false"))
    return out


def check_rules(recipe: Recipe, *, cuda: bool, bnb_installed: bool | None = None) -> list[Finding]:
    """recipe_rules + machine_rules."""
    return recipe_rules(recipe) + machine_rules(recipe, cuda=cuda, bnb_installed=bnb_installed)


def check_method(recipe: Recipe, model_config: dict) -> list[Finding]:
    """Method settings that must match the model's layers."""
    method = recipe.method
    targets = getattr(method, "target_modules", None)
    if is_lora(method.kind) and targets != "all-linear":
        if not targeted_linears(model_config, targets):
            return [Finding("error", "method.target_modules",
                            f"target_modules {targets} match no linear layer of this model",
                            "use 'all-linear' or names such as ['q_proj', 'v_proj'] "
                            "(gpt2: 'c_attn'; gpt-neox: 'query_key_value')")]
    return []


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


# ---------------------------------------------------------------- all together


def run_preflight(
    recipe: Recipe,
    runs_dir: str | Path,
    model_config: dict | None,
    *,
    gpus: list[GpuInfo] | None = None,
    cuda: bool | None = None,
    free_bytes: int | None = None,
    ram_available: int | None = None,
    base_dir: Path | None = None,
) -> list[Finding]:
    """Every check; the keyword arguments replace what is read from the machine."""
    if gpus is None:
        gpus = detect_gpus()
    if cuda is None:
        cuda = cuda_available(gpus)
    findings = check_rules(recipe, cuda=cuda)
    if cuda:
        findings += check_gpus(recipe, gpus)
    else:
        findings += check_cpu_ranks(recipe)
    if model_config is None:
        findings.append(Finding("info", "model.name", "no model config: memory and disk not checked"))
        return findings
    try:
        findings += check_method(recipe, model_config)
        findings += pipeline_plan.model_rules(recipe, model_config)
        findings += check_memory(recipe, model_config, cuda=cuda, gpus=gpus, ram_available=ram_available,
                                 base_dir=base_dir)
        if free_bytes is None:
            free_bytes = free_disk_bytes(runs_dir)
        findings += check_disk(recipe, model_config, free_bytes, cuda=cuda)
    except UserError as exc:
        findings.append(Finding("warning", exc.key, f"cannot estimate memory: {exc.message}", exc.fix))
    return findings
