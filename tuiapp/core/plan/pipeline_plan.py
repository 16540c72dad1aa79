"""Pipeline parallelism as data: how a decoder is cut into stages, the idle bubble, each stage's
memory, and the rules of `launch.strategy = "pipeline"`.

Pure (no torch): the estimate, preflight and `llmtui run --dry-run` show it before a launch, and
the trainer cuts the model with the same `split_layers`, so what is shown is what runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass

from tuiapp.core.common.errors import UserError
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import METHODS
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.plan.estimate import (
    GB,
    USABLE_FRACTION,
    Estimate,
    MemoryBreakdown,
    activation_bytes,
    model_shape,
    model_state_bytes,
)

# decoder-only models whose HF class is embed_tokens -> layers -> norm -> lm_head with rotary positions
PIPELINE_FAMILIES = ("llama",)


@dataclass(frozen=True)
class Stage:
    index: int
    first_layer: int
    last_layer: int  # exclusive
    params: int  # weights this stage holds (the first adds the embeddings, the last the norm and head)

    @property
    def layers(self) -> int:
        return self.last_layer - self.first_layer


def component_params(config: dict) -> tuple[int, int, int, int]:
    """(embeddings, one decoder layer, final norm, head) parameter counts. A tied head is counted:
    the last stage holds its own copy of the embedding matrix, kept equal by summing its gradient
    with the first stage's."""
    shape = model_shape(config)
    embed = shape.vocab * shape.hidden
    return embed, shape.block_params, shape.final_norm_params, shape.vocab * shape.hidden


def split_layers(config: dict, stages: int) -> list[Stage]:
    """Contiguous layer ranges, one per stage (each at least one layer), chosen to make the largest
    stage (by parameters) as small as it can be."""
    layers = model_shape(config).layers
    if stages < 1 or stages > layers:
        raise UserError(message=f"cannot cut {layers} decoder layers into {stages} pipeline stages",
                        key="launch.pipeline_stages", fix=f"set launch.pipeline_stages between 1 and {layers}")
    embed, block, norm, head = component_params(config)

    def cost(k: int, a: int, b: int) -> int:
        return (b - a) * block + (embed if k == 0 else 0) + (norm + head if k == stages - 1 else 0)

    # best[k][j]: the smallest possible largest stage when stages 0..k-1 hold layers 0..j-1
    inf = float("inf")
    best = [[inf] * (layers + 1) for _ in range(stages + 1)]
    cut = [[0] * (layers + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for j in range(k, layers - (stages - k) + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], cost(k - 1, i, j))
                if value < best[k][j]:
                    best[k][j], cut[k][j] = value, i
    bounds, j = [], layers
    for k in range(stages, 0, -1):
        bounds.append((cut[k][j], j))
        j = cut[k][j]
    bounds.reverse()
    return [Stage(k, a, b, cost(k, a, b)) for k, (a, b) in enumerate(bounds)]


def bubble_fraction(stages: int, microbatches: int) -> float:
    """GPipe's idle share of a step: (p - 1) / (m + p - 1); 1F1B has the same bubble."""
    return (stages - 1) / (microbatches + stages - 1) if stages > 0 and microbatches > 0 else 0.0


def in_flight(schedule: str, stage: int, stages: int, microbatches: int) -> int:
    """Micro-batches whose activations a stage holds at its peak: all m for GPipe (every forward
    before any backward), p - k for stage k under 1F1B."""
    if schedule == "gpipe":
        return microbatches
    return min(stages - stage, microbatches)


def step_rows(recipe: Recipe) -> int:
    """Sequences per replica per step: train.micro_batch x grad_accum (a micro_batch 'auto' counts as 1)."""
    micro = recipe.train.micro_batch
    return (micro if isinstance(micro, int) else 1) * recipe.train.grad_accum


def microbatch_size(recipe: Recipe) -> int:
    return max(1, step_rows(recipe) // max(1, recipe.launch.microbatches))


def stage_memory(recipe: Recipe, config: dict, precision: str) -> list[dict]:
    """Bytes per stage: weights + grads + Adam of its parameters, and activations of its in-flight
    micro-batches (logits only on the last stage)."""
    launch, train = recipe.launch, recipe.train
    shape = model_shape(config)
    stages = split_layers(config, launch.pipeline_stages)
    out = []
    for stage in stages:
        states = model_state_bytes(stage.params, stage.params, 0, 1, precision=precision)
        one = activation_bytes(
            seq_len=train.max_seq_len, micro_batch=microbatch_size(recipe), hidden=shape.hidden, heads=shape.heads,
            layers=stage.layers, vocab=shape.vocab if stage.index == len(stages) - 1 else 0,
            checkpointing=train.gradient_checkpointing, bytes_per_value=4 if precision == "fp32" else 2,
        )
        held = in_flight(launch.pipeline_schedule, stage.index, len(stages), launch.microbatches)
        out.append({**asdict(stage), "layers": stage.layers, "params_bytes": states.params,
                    "grads_bytes": states.grads, "optimizer_bytes": states.optimizer, "in_flight": held,
                    "activations_bytes": one * held, "total_bytes": states.model_states + one * held})
    return out


def plan(recipe: Recipe, config: dict, precision: str, world: int) -> dict:
    """What `llmtui estimate` / `run --dry-run` show about a pipeline run."""
    launch = recipe.launch
    p, m = launch.pipeline_stages, launch.microbatches
    return {
        "stages": p,
        "replicas": max(1, world // p),
        "microbatches": m,
        "microbatch_size": microbatch_size(recipe),
        "schedule": launch.pipeline_schedule,
        "bubble": bubble_fraction(p, m),
        "per_stage": stage_memory(recipe, config, precision),
    }


def with_stages(est: Estimate, recipe: Recipe, config: dict) -> Estimate:
    """The estimate of a pipeline run: per GPU is its largest stage, and the plan rides along."""
    info = plan(recipe, config, est.precision, est.world_size or est.n_gpus * est.nodes)
    worst = max(info["per_stage"], key=lambda s: s["total_bytes"])
    memory = MemoryBreakdown(params=worst["params_bytes"], grads=worst["grads_bytes"],
                             optimizer=worst["optimizer_bytes"], activations=worst["activations_bytes"])
    fits, warning = est.fits, est.warning
    if est.gpu_memory_bytes:
        capacity = est.gpu_memory_bytes * USABLE_FRACTION
        fits = memory.total <= capacity
        warning = None if fits else (
            f"stage {worst['index']} needs {memory.total / GB:.1f} GB, the GPU has {est.gpu_memory_bytes / GB:.1f} "
            f"GB (about {capacity / GB:.1f} GB usable): try more launch.pipeline_stages, "
            "train.gradient_checkpointing = true or a smaller train.micro_batch")
    return dataclasses.replace(est, memory=memory, fits=fits, warning=warning, suggestions=[], pipeline=info)


def explicit_ranks(recipe: Recipe) -> int | None:
    """Ranks a recipe asks for on its own (a count or list of GPUs / CPU ranks, times nodes), or None
    when the machine decides ('all' with GPUs, hosts)."""
    launch = recipe.launch
    if launch.hosts:
        return None
    per_node = launch.gpus_per_node or (len(launch.gpus) if isinstance(launch.gpus, list)
                                        else launch.gpus if isinstance(launch.gpus, int) else None)
    if per_node is None:
        return None
    return per_node * max(1, launch.nodes)


def rules(recipe: Recipe, world: int | None = None) -> list[Finding]:
    """The rules of strategy 'pipeline' that need no model (none for other strategies); `world` =
    the ranks when known (else the count the recipe asks for, if it names one)."""
    launch, train = recipe.launch, recipe.train
    if launch.strategy != "pipeline":
        return []
    out: list[Finding] = []
    kind = recipe.method.kind
    if not METHODS[kind].pipeline:
        out.append(Finding("error", "method.kind", f"strategy 'pipeline' trains every weight of the cut model "
                           f"(pretrain or sft); '{kind}' is not supported there: adapters and preference losses "
                           "need the whole model in one place",
                           "use method.kind = 'pretrain' or 'sft', or launch.strategy = 'deepspeed'"))
    if launch.zero_stage:
        out.append(Finding("error", "launch.zero_stage", f"ZeRO-{launch.zero_stage} does not combine with the "
                           "pipeline: each stage already holds only its layers, and the pipeline runs on "
                           "torch.distributed.pipelining, not DeepSpeed's engine (ZeRO-2/3 would also reduce "
                           "or gather shards at every micro-batch)",
                           "set launch.zero_stage = 0 (or use launch.strategy = 'deepspeed' for ZeRO)"))
    out += _shape_rules(recipe, world)
    for key in ("liger_kernel", "torch_compile"):
        if getattr(train, key, False):
            out.append(Finding("warning", f"train.{key}", f"strategy 'pipeline' runs its own loop over the cut "
                               f"model; train.{key} is ignored there", f"set train.{key} = false"))
    if train.precision == "fp16":
        out.append(Finding("error", "train.precision", "fp16 needs a loss scaler, which the pipeline's loop does "
                           "not run", "set train.precision = 'bf16' (or 'auto' / 'fp32')"))
    if train.early_stopping_patience:
        out.append(Finding("error", "train.early_stopping_patience", "early stopping is not available with "
                           "strategy 'pipeline'", "set train.early_stopping_patience = 0"))
    if train.report_to:
        out.append(Finding("warning", "train.report_to", "strategy 'pipeline' writes metrics.jsonl only; the "
                           "trackers get nothing", "remove train.report_to, or export the metrics afterwards"))
    return out


def _shape_rules(recipe: Recipe, world: int | None) -> list[Finding]:
    """Stages, micro-batches and ranks that fit together."""
    out: list[Finding] = []
    launch, train = recipe.launch, recipe.train
    p, m = launch.pipeline_stages, launch.microbatches
    if m < p:
        out.append(Finding("error", "launch.microbatches", f"{m} micro-batches cannot keep {p} stages busy: "
                           f"the bubble would be {bubble_fraction(p, m):.0%} (1F1B needs m >= p)",
                           f"set launch.microbatches to at least {p} (4 x {p} = {4 * p} keeps the bubble near "
                           f"{bubble_fraction(p, 4 * p):.0%})"))
    batch = step_rows(recipe)
    if not isinstance(train.micro_batch, int):
        out.append(Finding("error", "train.micro_batch", "strategy 'pipeline' needs a fixed micro_batch: each "
                           "stage's buffers keep one shape, and probing sizes needs the whole model in one place",
                           f"set train.micro_batch to a multiple of launch.microbatches ({m})"))
    elif batch % m:
        divisors = [d for d in range(1, batch + 1) if batch % d == 0 and d >= p] or [batch]
        out.append(Finding("error", "launch.microbatches", f"each step's batch of {batch} sequences "
                           f"(train.micro_batch x grad_accum) does not split into {m} equal micro-batches",
                           f"set launch.microbatches to one of {divisors}, or train.micro_batch to a multiple "
                           f"of {m}"))
    if p == 1:
        out.append(Finding("warning", "launch.pipeline_stages", "one stage is no pipeline: every rank holds the "
                           "whole model", "set launch.pipeline_stages >= 2, or use launch.strategy = 'ddp'"))
    ranks = world or explicit_ranks(recipe)
    if ranks and ranks % p:
        out.append(Finding("error", "launch.pipeline_stages", f"{ranks} ranks cannot form whole pipelines of {p} "
                           "stages (ranks = stages x replicas)",
                           f"set launch.gpus to a multiple of {p}, or launch.pipeline_stages to a divisor of "
                           f"{ranks}"))
    if getattr(train, "batching", "examples") == "tokens":
        out.append(Finding("error", "train.batching", "strategy 'pipeline' splits each step into micro-batches of "
                           "equal rows (each stage's buffers keep one shape); token-budget batches vary",
                           "set train.batching = 'examples'"))
    return out


def model_rules(recipe: Recipe, config: dict) -> list[Finding]:
    """The rules of strategy 'pipeline' about the model: a family it can cut, enough layers, an even split."""
    if recipe.launch.strategy != "pipeline":
        return []
    p = recipe.launch.pipeline_stages
    try:
        shape = model_shape(config)
    except (UserError, KeyError, TypeError, ValueError):
        return []
    if shape.family not in PIPELINE_FAMILIES or shape.experts > 1:
        return [Finding("error", "model.name", f"strategy 'pipeline' cuts Llama-family decoders (llama, mistral, "
                        f"qwen2/3: embed_tokens, layers, norm, lm_head); this model is '{shape.family}'"
                        + (" with experts" if shape.experts > 1 else ""),
                        "use launch.strategy = 'deepspeed' (ZeRO-3) or 'fsdp' for this model")]
    if p > shape.layers:
        return [Finding("error", "launch.pipeline_stages", f"{p} stages for {shape.layers} decoder layers: every "
                        "stage needs at least one layer", f"set launch.pipeline_stages to at most {shape.layers}")]
    stages = split_layers(config, p)
    sizes = [s.params for s in stages]
    launch = recipe.launch
    out = [Finding("info", "launch.pipeline_stages", f"pipeline: {p} stages, layers " + " | ".join(
        f"{s.first_layer}-{s.last_layer - 1} ({s.params:,} params)" for s in stages) + f"; {launch.microbatches} "
        f"micro-batches, {launch.pipeline_schedule}, bubble {bubble_fraction(p, launch.microbatches):.0%}")]
    if max(sizes) > 1.5 * min(sizes):
        out.append(Finding("warning", "launch.pipeline_stages", f"{shape.layers} layers over {p} stages are uneven "
                           f"(largest stage {max(sizes):,} params, smallest {min(sizes):,}): the largest sets the "
                           "pace", _evener(config, shape.layers, p)))
    return out


def _evener(config: dict, layers: int, p: int) -> str:
    def spread(q: int) -> float:
        sizes = [s.params for s in split_layers(config, q)]
        return max(sizes) / min(sizes)

    candidates = [q for q in range(2, min(layers, 16) + 1) if q != p and spread(q) <= 1.5]
    if not candidates:
        return "use fewer stages, or a model with more layers per stage"
    best = min(candidates, key=lambda q: abs(q - p))
    return f"try launch.pipeline_stages = {best}"
