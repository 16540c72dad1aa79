"""Long-context settings before launch: sequence parallelism (train.sequence_parallel), tiled MLP,
activation offload and RoPE scaling. Pure: the rules, the padded length, the per-rank sequence.

The trainer side is tuiapp/trainer/models/long_context.py; docs/parallelism.md, "Sequence parallelism".
"""

from __future__ import annotations

from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import METHODS, is_distill, is_trl, trains_on_text
from tuiapp.core.config.recipe import Recipe, packing_enabled

SP_KEY = "train.sequence_parallel"
NO_SP = "or set train.sequence_parallel = 1"
ROPE_FREE_TYPES = {"gpt2", "bloom", "opt", "gpt_bigcode", "mpt", "falcon_alibi"}


def explicit_ranks(recipe: Recipe) -> int | None:
    """Ranks a recipe asks for on its own (as pipeline_plan.explicit_ranks, which imports the estimate)."""
    launch = recipe.launch
    if launch.hosts:
        return None
    per_node = launch.gpus_per_node or (len(launch.gpus) if isinstance(launch.gpus, list)
                                        else launch.gpus if isinstance(launch.gpus, int) else None)
    return None if per_node is None else per_node * max(1, launch.nodes)


def degree(recipe: Recipe) -> int:
    return int(getattr(recipe.train, "sequence_parallel", 1) or 1)


def sp_padded_length(recipe: Recipe) -> int:
    """The tokens of every batch row on CPU ranks (gloo gathers equal shapes only): the micro batch's one
    flattened row when packed, else max_seq_len; rounded up to a multiple of the degree."""
    n = degree(recipe)
    micro = recipe.train.micro_batch if isinstance(recipe.train.micro_batch, int) else 1
    length = recipe.train.max_seq_len * (micro if packing_enabled(recipe) and not trains_on_text(recipe.method.kind)
                                         else 1)
    return length + (-length % n)


def per_rank_tokens(recipe: Recipe) -> int:
    """Tokens of one row each rank of a sequence-parallel group holds (the whole row at degree 1)."""
    n = degree(recipe)
    length = recipe.train.max_seq_len + (-recipe.train.max_seq_len % n)
    return length // n


def data_parallel_degree(ranks: int, n: int) -> int:
    return max(1, ranks // max(1, n))


def rules(recipe: Recipe, world: int | None = None, cuda: bool = False) -> list[Finding]:
    """What cannot run under train.sequence_parallel (nothing at 1), tiled MLP and activation offload;
    `world` = the ranks when known."""
    found = _sequence_parallel_rules(recipe, world) if degree(recipe) > 1 else []
    return found + _tiling_rules(recipe, cuda)


def _sequence_parallel_rules(recipe: Recipe, world: int | None) -> list[Finding]:
    out: list[Finding] = []
    train, kind, n = recipe.train, recipe.method.kind, degree(recipe)
    strategy = getattr(recipe.launch, "strategy", "deepspeed")
    if METHODS[kind].peft in ("virtual_tokens", "llama_adapter"):
        out.append(Finding("error", SP_KEY, f"method '{kind}' adds virtual tokens to every sequence, which a "
                           "sequence split between ranks cannot carry (each rank holds 1/N of the tokens)",
                           f"use method.kind = 'lora', 'dora', 'ia3' or 'adapter', {NO_SP}"))
    if is_trl(kind):
        out.append(Finding("error", SP_KEY, f"method '{kind}' scores whole sequences (TRL's log-probabilities "
                           "of chosen/rejected answers or completions); DeepSpeed's Ulysses splits only causal-LM "
                           "token losses", f"train it with {NO_SP[3:]}, or use an SFT-style method (sft, lora)"))
    if strategy != "deepspeed":
        out.append(Finding("error", SP_KEY, f"sequence parallelism runs on DeepSpeed's engine, not strategy "
                           f"'{strategy}'", f"set launch.strategy = 'deepspeed', {NO_SP}"))
    ranks = world if world is not None else explicit_ranks(recipe)
    if ranks is not None and (ranks < n or ranks % n):
        out.append(Finding("error", SP_KEY, f"{ranks} rank(s) do not form groups of {n}: the ranks must be a "
                           f"multiple of the degree (ranks / {n} groups train data-parallel)",
                           f"set launch.gpus to a multiple of {n}, or a degree that divides {ranks}"))
    if recipe.dataset.sources:
        out.append(Finding("error", SP_KEY, "a dataset mixture's per-source token counts cannot be split with "
                           "the sequence", f"use one dataset, {NO_SP}"))
    if train.batching == "tokens":
        out.append(Finding("error", SP_KEY, "token-budget batches change shape every step; a sequence-parallel "
                           "group needs the same shape on each of its ranks",
                           f"set train.batching = 'examples', {NO_SP}"))
    if train.micro_batch == "auto":
        out.append(Finding("error", "train.micro_batch", "micro_batch 'auto' probes one rank alone; a "
                           "sequence-parallel rank runs only with its group", "set train.micro_batch to a number"))
    if recipe.model.attn_implementation == "eager":
        out.append(Finding("error", "model.attn_implementation", "Ulysses attention cannot run eager attention "
                           "(it needs the whole-sequence mask, which the split discards)",
                           "set model.attn_implementation = 'auto', 'sdpa' or 'flash_attention_2'"))
    if train.max_seq_len % n:
        out.append(Finding("info", SP_KEY, f"train.max_seq_len = {train.max_seq_len} is not a multiple of {n}: "
                           f"each sequence is padded to one (padding takes no loss)", ""))
    out.append(Finding("info", SP_KEY, f"sequence parallel degree {n}: each rank holds "
                       f"{per_rank_tokens(recipe):,} of every {train.max_seq_len:,}-token sequence; on CPU ranks "
                       f"every batch is padded to {sp_padded_length(recipe):,} tokens (gloo gathers equal shapes)",
                       ""))
    return out


def _tiling_rules(recipe: Recipe, cuda: bool) -> list[Finding]:
    out: list[Finding] = []
    train, launch, kind = recipe.train, recipe.launch, recipe.method.kind
    strategy = getattr(launch, "strategy", "deepspeed")
    if train.tiled_mlp and strategy == "pipeline":
        out.append(Finding("error", "train.tiled_mlp", "the pipeline runs its stages without DeepSpeed's tiled compute",
                           "set train.tiled_mlp = false, or launch.strategy = 'deepspeed'"))
    for key in ("tiled_mlp", "activation_offload"):
        if getattr(train, key) and is_trl(kind):
            out.append(Finding("error", f"train.{key}", f"train.{key} is applied to the Trainer of pretraining, SFT "
                               f"and the adapter methods, not to TRL's trainer of '{kind}'",
                               f"set train.{key} = false"))
    engine_free = strategy == "deepspeed" and launch.zero_stage == 0 and not cuda and explicit_ranks(recipe) == 1
    if train.tiled_mlp and (strategy in ("ddp", "fsdp") or engine_free):
        where = "one CPU rank at ZeRO-0 trains without DeepSpeed's engine" if engine_free else \
            f"strategy '{strategy}' wraps the model in PyTorch's data parallel"
        out.append(Finding("error", "train.tiled_mlp", f"{where}, whose gradient hooks fire once per slice of a "
                           "tiled MLP (it recomputes each slice in the backward)",
                           "set train.tiled_mlp = false, or train on DeepSpeed's engine (launch.strategy = 'deepspeed' "
                           "with 2+ ranks or launch.zero_stage >= 1)"))
    out += _tiled_loss_rules(recipe, strategy)
    if train.activation_offload and strategy == "pipeline":
        out.append(Finding("error", "train.activation_offload", "the pipeline keeps its in-flight activations on "
                           "the device", "set train.activation_offload = false, or launch.strategy = 'deepspeed'"))
    return out


def _tiled_loss_rules(recipe: Recipe, strategy: str) -> list[Finding]:
    train, kind = recipe.train, recipe.method.kind
    if not train.tiled_loss:
        return []
    why = None
    if is_trl(kind) or is_distill(kind):
        why = f"'{kind}' computes its own loss from the model's logits (TRL's trainer or the teacher's KL)"
    elif strategy == "pipeline":
        why = "the pipeline's last stage computes the loss on its own"
    elif train.liger_kernel:
        why = "train.liger_kernel's fused linear cross-entropy already never holds the logits"
    elif recipe.model.router_aux_loss_coef:
        why = "model.router_aux_loss_coef adds the router's load-balancing loss inside the model's own forward"
    if why is None:
        return []
    return [Finding("error", "train.tiled_loss", f"train.tiled_loss cannot apply: {why}", "set train.tiled_loss = false")]


def config_rules(recipe: Recipe, config: dict | None, cuda: bool = False) -> list[Finding]:
    """The rules that need the model config: heads divisible by the degree, RoPE scaling on a RoPE model,
    max_position_embeddings against max_seq_len, tiled MLP on experts, activation offload without CUDA."""
    out: list[Finding] = []
    n = degree(recipe)
    text = (config or {}).get("text_config") or config or {}
    if n > 1 and config and "vision_config" in config:
        out.append(Finding("error", SP_KEY, "a vision-language model's image tokens cannot be split with the "
                           "sequence (its vision tower runs whole on each rank's images)", f"{NO_SP[3:]}"))
    if n > 1 and text:
        heads = text.get("num_attention_heads") or text.get("n_head")
        kv = text.get("num_key_value_heads") or heads
        if heads and heads % n:
            out.append(Finding("error", SP_KEY, f"the model's {heads} attention heads do not divide by {n} (Ulysses "
                               f"gives each rank heads / {n} of them)",
                               f"set train.sequence_parallel to a divisor of {heads}"))
        if kv and heads and not (kv % n == 0 or n % kv == 0):
            out.append(Finding("error", SP_KEY, f"the model's {kv} key/value heads neither divide by {n} nor divide "
                               f"{n} (Ulysses splits or replicates them)",
                               f"set train.sequence_parallel to a divisor or multiple of {kv}"))
    if recipe.train.tiled_mlp and (text.get("num_experts") or text.get("num_local_experts")):
        out.append(Finding("warning", "train.tiled_mlp", "a mixture of experts: only its dense MLPs are tiled, the "
                           "expert layers run whole", ""))
    if recipe.train.tiled_loss and text.get("output_router_logits"):
        out.append(Finding("error", "train.tiled_loss", "this mixture of experts adds its router's auxiliary loss in "
                           "its own forward (output_router_logits), which the tiled loss goes around",
                           "set train.tiled_loss = false"))
    if recipe.train.tiled_loss and config and "vision_config" in config:
        out.append(Finding("error", "train.tiled_loss", "a vision-language model merges its image features inside "
                           "its own forward, which the tiled loss goes around", "set train.tiled_loss = false"))
    if recipe.train.activation_offload and not cuda:
        out.append(Finding("warning", "train.activation_offload", "without CUDA the activations are in CPU memory "
                           "already: activation_offload does nothing here", "set train.activation_offload = false"))
    out += rope_rules(recipe, text)
    return out


def rope_rules(recipe: Recipe, text: dict) -> list[Finding]:
    spec = recipe.model
    out: list[Finding] = []
    model_type = str(text.get("model_type", ""))
    has_rope = bool(text.get("rope_parameters") or text.get("rope_theta") or text.get("rope_scaling")) \
        or model_type not in ROPE_FREE_TYPES and "max_position_embeddings" in text
    if spec.rope_scaling is not None and text and not has_rope:
        out.append(Finding("error", "model.rope_scaling", f"model type '{model_type or '?'}' has no rotary "
                           "position embeddings to scale", "remove model.rope_scaling"))
        return out
    positions = spec.max_position_embeddings or text.get("max_position_embeddings") or text.get("n_positions")
    if spec.rope_scaling is not None and not spec.max_position_embeddings and positions \
            and spec.rope_scaling.type in ("linear", "yarn"):
        positions = int(positions * spec.rope_scaling.factor)
    if positions and recipe.train.max_seq_len > positions:
        fix = ("set model.max_position_embeddings (with model.rope_scaling to extend a RoPE model), or a smaller "
               "train.max_seq_len")
        out.append(Finding("warning", "train.max_seq_len", f"train.max_seq_len = {recipe.train.max_seq_len:,} is "
                           f"past the model's {positions:,} positions", fix))
    return out


# ---- memory (tuiapp.core.plan.estimate) -----------------------------------------------------------------

TILED_MLP_SAVED = 17  # of the 34·s·b·h bytes a layer keeps (16-bit), the MLP's own but its input


SLICE_LOGITS = 1 << 26  # logits per slice of the tiled loss (256 MB in fp32)
SLICE_BYTES_PER_LOGIT = 12  # fp32 logits, their log-softmax and gradient while a slice is made again


def loss_slice_tokens(vocab: int) -> int:
    """Trained positions per slice of train.tiled_loss: a power of two with about SLICE_LOGITS logits."""
    tokens = 64
    while tokens * 2 * max(1, vocab) <= SLICE_LOGITS and tokens < 8192:
        tokens *= 2
    return tokens


def activations(recipe: Recipe, activation_bytes, cuda: bool = True, **kwargs) -> int:
    """`estimate.activation_bytes` of one rank under the long-context settings: a sequence-parallel rank
    holds 1/N of the sequence (attention's all-to-all gives it the whole sequence for 1/N of the heads:
    the same size); tiled MLP keeps only each MLP's input (its intermediate activations live for one slice);
    activation offload (CUDA) keeps the layers' saved tensors in host memory, one layer's working set on
    the device."""
    n = degree(recipe)
    if n > 1:
        seq = kwargs["seq_len"]
        kwargs["seq_len"] = (seq + (-seq % n)) // n
    total = activation_bytes(**kwargs)
    sbh = kwargs["seq_len"] * kwargs["micro_batch"] * kwargs["hidden"] * kwargs.get("bytes_per_value", 2) / 2
    layers = 1 if kwargs.get("checkpointing") else kwargs["layers"]
    if recipe.train.tiled_mlp:
        total -= int(TILED_MLP_SAVED * sbh * layers)
    if recipe.train.tiled_loss and not recipe.train.liger_kernel:  # the caller counted no logits: one slice's
        vocab = kwargs["vocab"]
        total += min(kwargs["seq_len"] * kwargs["micro_batch"], loss_slice_tokens(vocab)) * vocab * SLICE_BYTES_PER_LOGIT
    if recipe.train.activation_offload and cuda:
        logits = activation_bytes(**{**kwargs, "layers": 0, "checkpointing": False})
        per_layer = (total - logits) / max(1, layers)
        total = int(logits + per_layer)
    return max(0, int(total))


def longest_sequences(fits_at, world: int, heads: int | None, limit: int = 1 << 22) -> list[tuple[int, int]]:
    """(degree, the longest max_seq_len that fits) for the degrees 1, 2, 4, ... the ranks allow (heads
    divisible): `fits_at(degree, seq_len) -> bool`. Sequences in steps of 256 tokens; 0 = not even 256."""
    out = []
    n = 1
    while n <= max(1, world):
        if world % n == 0 and (not heads or heads % n == 0):
            low, high = 0, limit // 256
            while low < high:
                mid = (low + high + 1) // 2
                if fits_at(n, mid * 256):
                    low = mid
                else:
                    high = mid - 1
            out.append((n, low * 256))
        n *= 2
    return out
