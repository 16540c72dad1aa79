"""A method is one row: every trait of a method kind, in one table.

Pure Python (no pydantic), so core, the UI and the trainer all read it without the recipe schema
(~0.5 s the first time a screen opens). The recipe's method models (core/config/recipe.py) hold a
method's settings; this table holds what the rest of the program asks about a kind: which family
trains it, whether it packs, merges, runs a pipeline, keeps a reference model, and so on. A new
method kind adds its row here; tests/test_method_traits.py fails until every kind of the recipe's
method union has one with every trait filled in.

The kind sets other modules test against are derived from the table below; none is written out
by hand anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

Family = Literal["full", "adapter", "preference", "rl", "distill"]
"""What builds the trainer: full = every weight (Trainer), adapter = peft on a frozen base (Trainer),
preference = TRL's pair trainers (dpo, simpo, cpo, orpo, kto, reward), rl = TRL's online GRPO/RLOO,
distill = the student learns a frozen teacher's distributions (trainer/methods/distill.py)."""

Peft = Literal["none", "lora", "virtual_tokens", "ia3", "bottleneck", "llama_adapter", "from_adapter"]
"""The form of the trained adapter: none (every weight), lora (lora/qlora/dora: low-rank pairs on linears),
virtual_tokens (prefix/prompt/ptuning: learned tokens before the input), ia3 (one scaling vector per
module), bottleneck (down/up projection per block), llama_adapter (gated prompts in the top layers),
from_adapter (preference and RL methods: their [method.adapter] table says, every weight without one)."""

MergeForm = Literal["full", "weighted_adapter", "none"]
"""How `llmtui merge` combines runs of the kind: full = the whole weights (linear, ties, dare),
weighted_adapter = peft's weighted adapters (LoRA's A and B), none = not by kind (a preference or RL
run merges as its weights' kind: final_info's `weights`)."""

RecordKind = Literal["text", "chat", "pairs", "unpaired", "prompts"]

VirtualAt = Literal["none", "input", "past"]
"""Where learned virtual tokens go: none, before the input (prompt, ptuning: the sequence grows by
them), or as each layer's past keys and values (prefix: the input keeps its length)."""


@dataclass(frozen=True)
class MethodTraits:
    family: Family
    peft: Peft
    packs: bool
    """Batches may be packed (train.packing 'auto' packs): examples stay apart in a packed row."""
    mergeable: bool
    """The adapter folds into the base weights (peft's merge_and_unload); virtual tokens and
    llama-adapter's gated prompts do not. Preference and RL: their weights' kind decides."""
    merge_form: MergeForm
    pipeline: bool
    """Trains under launch.strategy = 'pipeline' (every weight of the cut model)."""
    reference: bool
    """Keeps a frozen reference policy (the base with adapters off, or a copy)."""
    unpaired: bool
    """Labelled single answers instead of chosen/rejected pairs."""
    vision: bool
    """Trains a vision-language model on image chats (dpo: on image preference pairs)."""
    extra_copies: int
    """Frozen model copies the memory estimate adds when every weight trains (a reference model;
    grpo/rloo: only with a KL penalty, beta > 0)."""
    sequences: int
    """Sequences per example in a batch (preference: chosen + rejected; KTO: answer + KL answer)."""
    record_kind: RecordKind
    """The canonical record the method trains on (core/data/datasets.py's record_kind; rl: prompts)."""
    quantized: bool = False
    """The frozen base loads in 4 bits (bitsandbytes): CUDA only, ZeRO-3 cannot partition it."""
    checkpointing: bool = True
    """Works with gradient checkpointing (prefix tuning passes learned past key/values, which it does not)."""
    from_config: bool = False
    """Builds the model from its config with fresh weights (pretrain): no weights to load or check."""
    head: Literal["lm", "score"] = "lm"
    """What the trained model outputs: next-token logits, or one score per sequence (reward models)."""
    virtual_at: VirtualAt = "none"
    magnitudes: bool = False
    """DoRA: a magnitude vector per adapted linear beside the low-rank pair (peft's use_dora)."""
    adapts_experts: bool = False
    """Can adapt a mixture-of-experts model's fused expert weights (peft's ParamWrapper: plain LoRA,
    dropout 0)."""


def _full(record_kind: RecordKind, *, pipeline: bool = True, vision: bool = False) -> MethodTraits:
    return MethodTraits("full", "none", packs=True, mergeable=True, merge_form="full", pipeline=pipeline,
                        reference=False, unpaired=False, vision=vision, extra_copies=0, sequences=1,
                        record_kind=record_kind)


def _adapter(peft: Peft, *, packs: bool = True, mergeable: bool = True, merge_form: MergeForm = "none",
             vision: bool = False) -> MethodTraits:
    return MethodTraits("adapter", peft, packs=packs, mergeable=mergeable, merge_form=merge_form, pipeline=False,
                        reference=False, unpaired=False, vision=vision, extra_copies=0, sequences=1,
                        record_kind="chat")


def _preference(*, reference: bool = False, unpaired: bool = False, vision: bool = False) -> MethodTraits:
    return MethodTraits("preference", "from_adapter", packs=False, mergeable=True, merge_form="none", pipeline=False,
                        reference=reference, unpaired=unpaired, vision=vision, extra_copies=int(reference),
                        sequences=2, record_kind="unpaired" if unpaired else "pairs")


def _rl() -> MethodTraits:
    return MethodTraits("rl", "from_adapter", packs=False, mergeable=True, merge_form="none", pipeline=False,
                        reference=False, unpaired=False, vision=False, extra_copies=1, sequences=1,
                        record_kind="prompts")


METHODS: dict[str, MethodTraits] = {
    "pretrain": replace(_full("text"), from_config=True),
    "sft": _full("chat", vision=True),
    "lora": replace(_adapter("lora", merge_form="weighted_adapter", vision=True), adapts_experts=True),
    "qlora": replace(_adapter("lora", merge_form="weighted_adapter", vision=True), quantized=True),
    "dora": replace(_adapter("lora", vision=True), magnitudes=True),
    "prefix": replace(_adapter("virtual_tokens", packs=False, mergeable=False), checkpointing=False,
                      virtual_at="past"),
    "prompt": replace(_adapter("virtual_tokens", packs=False, mergeable=False), virtual_at="input"),
    "ptuning": replace(_adapter("virtual_tokens", packs=False, mergeable=False), virtual_at="input"),
    "ia3": _adapter("ia3"),
    "adapter": _adapter("bottleneck"),
    "llama-adapter": _adapter("llama_adapter", packs=False, mergeable=False),
    "dpo": _preference(reference=True, vision=True),
    "simpo": _preference(),
    "cpo": _preference(),
    "orpo": _preference(),
    "kto": _preference(reference=True, unpaired=True),
    "reward": replace(_preference(), head="score"),
    "grpo": _rl(),
    "rloo": _rl(),
    # the teacher is counted by the estimate's own term (its size, not the student's); rows of teacher
    # logits per example: never packed
    "distill": MethodTraits("distill", "from_adapter", packs=False, mergeable=True, merge_form="none", pipeline=False,
                            reference=False, unpaired=False, vision=False, extra_copies=0, sequences=1,
                            record_kind="chat"),
}
"""One row per method kind, in the order the form and the docs list them."""

TRAITS = tuple(f.name for f in fields(MethodTraits))


def traits(kind: str) -> MethodTraits:
    """The row of a method kind (KeyError names the kind and the known ones)."""
    try:
        return METHODS[kind]
    except KeyError:
        raise KeyError(f"unknown method kind {kind!r}; known: {', '.join(METHODS)}") from None


def kinds(**wanted) -> frozenset[str]:
    """The kinds whose traits equal every given value, e.g. kinds(family="rl")."""
    return frozenset(k for k, t in METHODS.items() if all(getattr(t, name) == value for name, value in wanted.items()))


def _row(kind: str | None) -> MethodTraits | None:
    """A kind's row, None for a kind that is not in the table (an old run's record, a blank)."""
    return METHODS.get(str(kind or ""))


def family(kind: str | None) -> str | None:
    """A kind's family, None for a kind that is not in the table (an old run's record, a blank)."""
    row = _row(kind)
    return row.family if row is not None else None


def is_preference(kind: str | None) -> bool:
    return family(kind) == "preference"


def is_rl(kind: str | None) -> bool:
    return family(kind) == "rl"


def is_trl(kind: str | None) -> bool:
    """Trained by one of TRL's trainers (preference pairs or online RL): never packed, its own weights
    from [method.adapter]."""
    return family(kind) in ("preference", "rl")


def has_adapter_table(kind: str | None) -> bool:
    """Its weights come from a [method.adapter] table (every weight without one): the preference,
    RL and distill methods."""
    return peft_of(kind) == "from_adapter"


def is_full(kind: str | None) -> bool:
    """Every weight trains (pretrain, sft; a preference or RL method's weights without an adapter)."""
    return family(kind) == "full"


def is_lora(kind: str | None) -> bool:
    """lora, qlora, dora: low-rank pairs on linears (peft's LoraConfig)."""
    row = _row(kind)
    return row is not None and row.peft == "lora"


def is_virtual_tokens(kind: str | None) -> bool:
    row = _row(kind)
    return row is not None and row.peft == "virtual_tokens"


def trains_on_text(kind: str | None) -> bool:
    """Plain text in whole blocks (pretrain), not chats, pairs or prompts."""
    row = _row(kind)
    return row is not None and row.record_kind == "text"


def peft_of(kind: str | None) -> str | None:
    """A kind's adapter form (Peft), None for a kind that is not in the table."""
    row = _row(kind)
    return row.peft if row is not None else None


def from_config(kind: str | None) -> bool:
    row = _row(kind)
    return row is not None and row.from_config


def is_quantized(kind: str | None) -> bool:
    row = _row(kind)
    return row is not None and row.quantized


def is_reward_model(kind: str | None) -> bool:
    """Trains a sequence classifier (one score per sequence), not a language model."""
    row = _row(kind)
    return row is not None and row.head == "score"


def is_distill(kind: str | None) -> bool:
    return family(kind) == "distill"


def virtual_at(kind: str | None) -> str:
    """Where the kind's virtual tokens go (VirtualAt); 'none' for a kind that is not in the table."""
    row = _row(kind)
    return row.virtual_at if row is not None else "none"


def has_magnitudes(kind: str | None) -> bool:
    row = _row(kind)
    return row is not None and row.magnitudes


def adapts_experts(kind: str | None) -> bool:
    row = _row(kind)
    return row is not None and row.adapts_experts


def mergeable(kind: str | None) -> bool:
    """False for the adapters that do not fold into the base (virtual tokens, llama-adapter)."""
    row = _row(kind)
    return row is None or row.mergeable


# The sets other modules test against, derived from the table.
PREFERENCE_KINDS = kinds(family="preference")
RL_KINDS = kinds(family="rl")
"""Online RL: completions generated during training and scored by reward functions (TRL's GRPO/RLOO)."""
ADAPTER_KINDS = kinds(family="adapter")
FULL_KINDS = kinds(family="full")
LORA_KINDS = kinds(peft="lora")
ADAPTER_TABLE_KINDS = sorted((k for k in METHODS if k in LORA_KINDS), key=lambda k: METHODS[k].quantized)
"""What a preference or RL method's [method.adapter] table may name (lora, dora, qlora: the 4-bit one last)."""
VLLM_ADAPTER_KINDS = frozenset(k for k, t in METHODS.items()
                               if t.merge_form == "weighted_adapter" or (t.family == "preference" and t.head == "lm"))
"""Runs whose final adapter vLLM serves: LoRA (not DoRA), and the preference methods' (a reward model scores)."""
VIRTUAL_TOKEN_KINDS = kinds(peft="virtual_tokens")
NO_PACKING_KINDS = frozenset(k for k in ADAPTER_KINDS | FULL_KINDS if not METHODS[k].packs)
UNMERGEABLE = kinds(mergeable=False)
REFERENCE_KINDS = kinds(reference=True)
UNPAIRED_KINDS = kinds(unpaired=True)
PIPELINE_KINDS = tuple(k for k, t in METHODS.items() if t.pipeline)
VISION_KINDS = tuple(k for k, t in METHODS.items() if t.vision)
VISION_FULL_KINDS = kinds(family="full", vision=True)
"""Vision methods where every weight of a trained part trains; the rest put adapters on it."""
MERGE_ADAPTER_KINDS = kinds(merge_form="weighted_adapter")
MERGE_FULL_KINDS = kinds(merge_form="full")
