"""The one door for the checks before a launch. `llmtui check`, `run`, `probe` and `estimate`, the
TUI form, and the launch service (and through it the queue and sweeps) call only this module.

Two phases, each a declared list of rule functions of one signature, `rule(ctx) -> list[Finding]`:

- RECIPE_RULES, the recipe alone: cross-field rules, the method's, RL's, the agent's, the probe's
  and long context's rules, the dataset, the model's files and its architecture. They look at no
  GPU, disk, host or port: `llmtui check`, the form, a SLURM submit and a node joining a run.
- MACHINE_RULES, the recipe on this machine: CUDA and libraries, GPUs or CPU ranks, the model's
  layers, memory and disk, hosts and ports, and the dry step (one real step on a shrunken copy).

A new check: write `def my_rule(ctx: Context) -> list[Finding]` (in the module named after what it
checks, or here when it only calls one) and add it to one list. `ctx` holds the resolved recipe,
what is read from the machine (read once, on first use) and `ctx.findings`, what the rules before
it found. A rule that reads the model's config.json is decorated with @needs_model_config.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuiapp.core.common.errors import UserError
from tuiapp.core.common.findings import Finding, format_findings, has_errors
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.machine.gpus import GpuInfo, cuda_available, detect_gpus
from tuiapp.core.plan import estimate, long_context, pipeline_plan, probe
from tuiapp.core.prelaunch import (
    agent,
    architecture,
    benchmark_checks,
    cluster_checks,
    data_checks,
    distill_checks,
    dry_step,
    machine_rules,
    model_check,
    preference,
    recipe_rules,
    resources,
    rl,
    vision_checks,
)
from tuiapp.core.store.runs import RunStore

__all__ = ["ClusterAsk", "Context", "MACHINE_RULES", "RECIPE_RULES", "Rule", "all_findings", "dry_step_state", "estimate_report",
           "format_findings", "has_errors", "join_findings", "machine_findings", "recipe_findings", "resolve_recipe"]

_UNREAD = object()


@dataclass(frozen=True)
class ClusterAsk:
    """What the launch asks of hosts and ports: node_rank 0 checks its rendezvous port, a joining
    node K its master address; None (hosts mode, or a --master-port) the hosts and the port."""

    node_rank: int | None = None
    master_port: int | None = None
    master_addr: str | None = None


@dataclass
class Context:
    """What every rule gets. Fields left as given are read from the machine on first use, so a
    test may pass any of them."""

    recipe: Recipe  # resolved: run:NAME is that run's final folder
    base_dir: Path
    store: RunStore | None = None
    ref: str = ""  # model.name as written (run:NAME), for the model's label
    cluster: ClusterAsk | None = None  # None: no hosts-and-ports check
    gpus: list[GpuInfo] | None = None
    cuda: bool | None = None
    free_bytes: int | None = None  # at the runs folder
    ram_available: int | None = None  # None: psutil's
    model_config: dict | None | object = _UNREAD
    findings: list[Finding] = field(default_factory=list)  # what the rules before found
    model_files_ok: bool = True  # the model's folder, cache entry or hub repo was found whole
    config_done: bool = False  # a rule said the model's config cannot be used: the others stay quiet

    def __post_init__(self) -> None:
        self.ref = self.ref or self.recipe.model.name

    def gpus_here(self) -> list[GpuInfo]:
        if self.gpus is None:
            self.gpus = detect_gpus()
        return self.gpus

    def cuda_here(self) -> bool:
        if self.cuda is None:
            self.cuda = cuda_available(self.gpus_here())
        return self.cuda

    def config(self) -> dict | None:
        """The model's config.json, or None (not readable, or 'tiny' without one)."""
        if self.model_config is _UNREAD:
            try:
                self.model_config = estimate.load_model_config(self.recipe.model.name, self.base_dir)
            except UserError:
                self.model_config = None
        return self.model_config  # type: ignore[return-value]

    def free_disk(self) -> int:
        if self.free_bytes is None:
            root = self.store.root if self.store is not None else self.base_dir
            self.free_bytes = resources.free_disk_bytes(root)
        return self.free_bytes


Rule = Callable[[Context], list[Finding]]


# ---------------------------------------------------------------- phase 1: the recipe alone


def cross_field(ctx: Context) -> list[Finding]:
    """DeepSpeed, peft, batching, mixture, streaming, scale-out and pipeline rules."""
    return recipe_rules.recipe_rules(ctx.recipe)


def preference_rules(ctx: Context) -> list[Finding]:
    return preference.rules(ctx.recipe)


def rl_rules(ctx: Context) -> list[Finding]:
    return rl.rules(ctx.recipe)


def agent_rules(ctx: Context) -> list[Finding]:
    """Agentic GRPO, images and async generation."""
    return agent.rules(ctx.recipe)


def distill_rules(ctx: Context) -> list[Finding]:
    """method 'distill': the teacher, its tokenizer against the student's, what distillation cannot run with."""
    return distill_checks.findings(ctx.recipe, ctx.base_dir)


def probe_rules(ctx: Context) -> list[Finding]:
    return probe.rules(ctx.recipe)


def long_context_rules(ctx: Context) -> list[Finding]:
    """train.sequence_parallel, tiled MLP, activation offload."""
    return long_context.rules(ctx.recipe, cuda=ctx.cuda_here())


def dataset(ctx: Context) -> list[Finding]:
    return data_checks.dataset_findings(ctx.recipe, ctx.base_dir)


def unused_images(ctx: Context) -> list[Finding]:
    return vision_checks.unused_findings(ctx.recipe, ctx.base_dir)


def benchmarks(ctx: Context) -> list[Finding]:
    return benchmark_checks.findings(ctx.recipe, ctx.base_dir)


def model_files(ctx: Context) -> list[Finding]:
    """The base model: a folder, the HF cache or the hub; whole, with readable weights."""
    name = ctx.recipe.model.name
    label = f"{ctx.ref} ({name})" if ctx.ref != name else None
    found = model_check.model_findings(ctx.recipe, ctx.base_dir, label=label)
    ctx.model_files_ok = not has_errors(found)
    return found


def model_architecture(ctx: Context) -> list[Finding]:
    """The model's config and profile against the method (only when its files were found whole)."""
    if not ctx.model_files_ok:
        return []
    return architecture.model_profile_findings(ctx.recipe, ctx.base_dir)


CHECKING_LINE = "checking: recipe, data, model, this machine, the dry step"
"""What a front end shows, with its clock, while a launch's checks run (the CLI's phase line, the form's verdict)."""

RECIPE_RULES: list[Rule] = [
    cross_field,
    preference_rules,
    rl_rules,
    agent_rules,
    distill_rules,
    probe_rules,
    long_context_rules,
    dataset,
    unused_images,
    benchmarks,
    model_files,
    model_architecture,
]


# ---------------------------------------------------------------- phase 2: the machine


def needs_model_config(rule: Callable[[Context, dict], list[Finding]]) -> Rule:
    """A rule of the model's config: the first one without a config says so once ('memory and disk
    not checked'); a config the estimate cannot read is a warning, and the later ones stay quiet."""

    @functools.wraps(rule)
    def checked(ctx: Context) -> list[Finding]:
        if ctx.config_done:
            return []
        config = ctx.config()
        if config is None:
            ctx.config_done = True
            return [Finding("info", "model.name", "no model config: memory and disk not checked")]
        try:
            return rule(ctx, config)
        except UserError as exc:
            ctx.config_done = True
            return [Finding("warning", exc.key, f"cannot estimate memory: {exc.message}", exc.fix)]

    return checked


def libraries(ctx: Context) -> list[Finding]:
    """CUDA or not, and the packages the settings need (bitsandbytes, torchao, flash_attn, ...)."""
    return machine_rules.machine_rules(ctx.recipe, cuda=ctx.cuda_here())


def devices(ctx: Context) -> list[Finding]:
    """The GPUs asked for exist and are free; without CUDA, no more CPU ranks than cores."""
    if ctx.cuda_here():
        return resources.check_gpus(ctx.recipe, ctx.gpus_here())
    return resources.check_cpu_ranks(ctx.recipe)


@needs_model_config
def model_layers(ctx: Context, config: dict) -> list[Finding]:
    """method.target_modules match some linear layer of the model."""
    return recipe_rules.check_method(ctx.recipe, config)


@needs_model_config
def pipeline_stages(ctx: Context, config: dict) -> list[Finding]:
    return pipeline_plan.model_rules(ctx.recipe, config)


@needs_model_config
def memory(ctx: Context, config: dict) -> list[Finding]:
    """The memory estimate against the GPUs' free memory, or RAM for CPU ranks."""
    return resources.check_memory(ctx.recipe, config, cuda=ctx.cuda_here(), gpus=ctx.gpus_here(),
                                  ram_available=ctx.ram_available, base_dir=ctx.base_dir)


@needs_model_config
def disk(ctx: Context, config: dict) -> list[Finding]:
    """The checkpoints against the free disk at the runs folder."""
    return resources.check_disk(ctx.recipe, config, ctx.free_disk(), cuda=ctx.cuda_here())


def preference_adapter(ctx: Context) -> list[Finding]:
    """[method.adapter]'s own method (qlora needs CUDA and bitsandbytes; target modules)."""
    return preference.adapter_findings(ctx.recipe, ctx.config(), cuda=ctx.cuda_here())


def long_context_config(ctx: Context) -> list[Finding]:
    """Attention heads and RoPE against the long-context settings."""
    return long_context.config_rules(ctx.recipe, ctx.config(), ctx.cuda_here())


def dry_run_step(ctx: Context) -> list[Finding]:
    """One real step on a shrunken copy of the model (cached), when nothing before found an error."""
    if has_errors(ctx.findings):
        return []
    return dry_step.dry_findings(ctx.recipe, ctx.base_dir, _model_label(ctx.recipe, ctx.base_dir))


def _model_label(recipe: Recipe, base_dir: Path) -> str:
    """The model as findings name it: its architecture's label, else model.name."""
    profile = architecture.profile_of(recipe, base_dir)
    return profile.label if profile is not None else recipe.model.name


def hosts_and_ports(ctx: Context) -> list[Finding]:
    """Hosts resolve, the launcher is installed, the rendezvous port is free (when the launch asks:
    hosts, nodes, or a --master-port)."""
    ask = ctx.cluster
    if ask is None:
        return []
    return cluster_checks.launch_findings(ctx.recipe, node_rank=ask.node_rank, master_port=ask.master_port,
                                          master_addr=ask.master_addr, base_dir=ctx.base_dir)


MACHINE_RULES: list[Rule] = [
    libraries,
    devices,
    model_layers,
    pipeline_stages,
    memory,
    disk,
    preference_adapter,
    long_context_config,
    dry_run_step,
    hosts_and_ports,
]


# ---------------------------------------------------------------- the door


def resolve_recipe(recipe: Recipe, store: RunStore) -> tuple[Recipe, str]:
    """Resolve 'run:NAME' into the earlier run's final folder; returns (recipe, original name)."""
    ref = recipe.model.name
    path = store.resolve_model(ref)
    recipe = rl.resolve_reward_models(recipe, store)  # grpo/rloo: `run:NAME` reward models
    recipe = distill_checks.resolve_teacher(recipe, store)  # distill: a `run:NAME` teacher
    if path == ref:
        return recipe, ref
    resolved = recipe.model_copy(deep=True)
    resolved.model.name = path
    return resolved, ref


def _context(recipe: Recipe, store: RunStore, base_dir: Path, **given) -> Context | Finding:
    try:
        resolved, ref = resolve_recipe(recipe, store)
    except UserError as exc:
        return Finding("error", exc.key or "model.name", exc.message, exc.fix or "")
    return Context(resolved, Path(base_dir), store=store, ref=ref, **given)


def _run(rules: list[Rule], ctx: Context) -> list[Finding]:
    for rule in rules:
        ctx.findings += rule(ctx)
    return ctx.findings


def recipe_findings(recipe: Recipe, store: RunStore, base_dir: Path) -> list[Finding]:
    """Phase 1: the recipe alone (RECIPE_RULES, in order); no GPU, disk, memory or port is looked at."""
    ctx = _context(recipe, store, base_dir)
    if isinstance(ctx, Finding):
        return [ctx]
    return _run(RECIPE_RULES, ctx)


def machine_findings(recipe: Recipe, store: RunStore, base_dir: Path, **given) -> list[Finding]:
    """Phase 2 alone: the recipe on this machine (MACHINE_RULES, in order). `given` fills Context's
    fields (gpus, cuda, free_bytes, ram_available, model_config, cluster) instead of the machine.
    Its dry step sees only this phase's findings; a launch uses all_findings."""
    ctx = _context(recipe, store, base_dir, **given)
    if isinstance(ctx, Finding):
        return [ctx]
    return _run(MACHINE_RULES, ctx)


def dry_step_state(recipe: Recipe, store: RunStore, base_dir: Path, *, run: bool) -> tuple[str, list[Finding]]:
    """The dry step of a recipe whose recipe phase passed (the form: its cached verdict as it is
    checked, a fresh one on demand): (state, findings). state: 'off' (LLMTUI_DRY_STEP=0), 'n/a'
    (the model is not here, or is an adapter), or dry_step.state_of the verdict; run=False only
    reads the cache."""
    if not dry_step.enabled():
        return "off", []
    try:
        resolved, _ = resolve_recipe(recipe, store)
    except UserError:
        return "n/a", []
    if run:
        answer = dry_step.verdict(resolved, base_dir)
        applies = answer is not None
    else:
        path, answer = dry_step.cached(resolved, base_dir)
        applies = path is not None
    if not applies:
        return "n/a", []
    return dry_step.state_of(answer), dry_step.findings_of(answer, resolved, _model_label(resolved, base_dir))


def all_findings(recipe: Recipe, store: RunStore, base_dir: Path, *, cluster: ClusterAsk | None = None,
                 oversubscribe: bool = False, **given) -> list[Finding]:
    """Every check before a launch: the recipe phase, then the machine phase (its dry step only
    when neither found an error). A finding said twice is kept once, where it was first said.
    `oversubscribe` (`llmtui run --oversubscribe`) turns the machine-size errors into warnings.
    A `run:NAME` model that does not resolve is one error finding (the service resolves first)."""
    ctx = _context(recipe, store, base_dir, cluster=cluster, **given)
    if isinstance(ctx, Finding):
        return [ctx]
    store.root.mkdir(parents=True, exist_ok=True)
    _run(RECIPE_RULES, ctx)
    _run(MACHINE_RULES, ctx)
    findings = list({(f.level, f.key, f.message): f for f in ctx.findings}.values())
    return resources.oversubscribe(findings) if oversubscribe else findings


def join_findings(recipe: Recipe, store: RunStore, base_dir: Path, *, node_rank: int,
                  master_addr: str | None) -> list[Finding]:
    """A node joining a run: the recipe phase, and of the machine phase only its hosts and ports
    (node 0 checked the rest when it planned the run)."""
    ctx = _context(recipe, store, base_dir, cluster=ClusterAsk(node_rank=node_rank, master_addr=master_addr))
    if isinstance(ctx, Finding):
        return [ctx]
    _run(RECIPE_RULES, ctx)
    return _run([hosts_and_ports], ctx)


def estimate_report(recipe: Recipe, store: RunStore, base_dir: Path, nodes: int | None = None,
                    gpus: int | None = None) -> dict:
    """The memory estimate of `llmtui estimate` and the TUI form, for the recipe's nodes x GPUs
    per node (launch.nodes, gpus_per_node, hosts); `nodes` / `gpus` override them."""
    recipe, _ = resolve_recipe(recipe, store)
    architecture.profile_of(recipe, base_dir)  # the exact parameter counts the estimate reads, made once per model
    config = estimate.load_model_config(recipe.model.name, base_dir)
    result = resources.memory_estimate(recipe, config, base_dir=base_dir, nodes=nodes, per_node=gpus)
    text, data = estimate.format_estimate(result), result.to_json()
    past = probe.past_ratios(store.root)  # the estimate's error on runs that probed and measured
    if past:
        text += "\n" + probe.error_line(store.root)
        data["past_measured_over_predicted"] = {"median": statistics.median(past), "runs": len(past)}
    return {"text": text, "json": data}
