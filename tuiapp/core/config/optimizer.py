"""`train.optimizer`: which optimizer steps the weights, its keys, and its state's bytes.

A recipe writes `optimizer = "muon"` (the kind alone) or a `[train.optimizer]` table with a kind
and that optimizer's keys. The state bytes here are what the estimate and the probe count; the
trainer side (building each optimizer) is `tuiapp.trainer.loop.optimizers`, the refusals before
launch `tuiapp.core.prelaunch.optimizer_checks`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

OPTIMIZER_KINDS = ("adamw", "adamw_8bit", "muon", "adafactor", "schedule_free_adamw", "galore", "apollo", "lion")
OptimizerKind = Literal[OPTIMIZER_KINDS]

# Each kind's traits in one place: what it needs, and its state per parameter (fp32 unless said).
TRAITS: dict[str, dict] = {
    "adamw": {"state": "8 B: momentum + variance (fp32)"},
    "adamw_8bit": {"state": "2 B: momentum + variance in 8 bits (blockwise, bitsandbytes)", "cuda": True,
                   "package": ("bitsandbytes", "llmtui[qlora]")},
    "muon": {"state": "4 B momentum for 2-D hidden weights (Muon); 8 B AdamW for embeddings, norms, biases, head"},
    "adafactor": {"state": "factored second moment: rows + columns of each matrix (4 B per row and column); "
                  "4 B for vectors"},
    "schedule_free_adamw": {"state": "8 B: z + variance (fp32)", "package": ("schedulefree", "llmtui[optimizers]")},
    "galore": {"state": "AdamW on rank-r projections of the targeted matrices + the projection; 8 B elsewhere",
               "cuda": True, "package": ("galore_torch", "llmtui[galore]"), "projected": True},
    "apollo": {"state": "AdamW on rank-r random projections of the targeted matrices; 8 B elsewhere",
               "cuda": True, "package": ("apollo_torch", "llmtui[apollo]"), "projected": True},
    "lion": {"state": "4 B: momentum (fp32)", "package": ("lion_pytorch", "llmtui[optimizers]")},
}


class OptimizerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)  # as the recipe's sections
    BY_KIND: ClassVar[bool] = True  # written as its kind alone: the form offers the kinds

    kind: OptimizerKind = Field(
        "adamw", description="'adamw' (fused), 'adamw_8bit' (bitsandbytes, CUDA), 'muon' (Muon on the "
        "2-D hidden weights, AdamW on embeddings, norms, biases and the head; DeepSpeed's ZeRO Muon under the "
        "DeepSpeed engine), 'adafactor', 'schedule_free_adamw' (schedulefree), 'galore' / 'apollo' (low-rank "
        "projected states, CUDA, launch.strategy 'ddp'), 'lion' (lion-pytorch). `optimizer = \"muon\"` is "
        "short for a table with only the kind.",
    )
    betas: list[float] = Field([0.9, 0.999], min_length=2, max_length=2,
                               description="AdamW-style (beta1, beta2): adamw, adamw_8bit, schedule_free_adamw, "
                               "galore, apollo, muon's AdamW part; lion takes its own (e.g. [0.9, 0.99]).")
    eps: float = Field(1e-8, gt=0, lt=1, description="Denominator epsilon of the Adam-style optimizers.")
    momentum: float = Field(0.95, ge=0, lt=1, description="muon: momentum of the Muon part (Nesterov).")
    ns_steps: int = Field(5, ge=1, le=20, description="muon: Newton-Schulz iterations that orthogonalize "
                          "each update.")
    lr_scale: float = Field(1.0, gt=0, le=1000, description="muon: the Muon part's learning rate is "
                            "train.learning_rate x lr_scale (its updates are scaled to AdamW's RMS, so 1 suits "
                            "a learning rate tuned for AdamW).")
    rank: int = Field(128, ge=1, le=65536, description="galore, apollo: rank of the projected states.")
    update_proj_gap: int = Field(200, ge=1, description="galore, apollo: steps between new projections.")
    scale: float = Field(0.25, gt=0, le=100, description="galore, apollo: scale of the projected update.")
    target_modules: list[str] = Field(["attn", "mlp"], min_length=1,
                                      description="galore, apollo: module names (substrings) whose matrices "
                                      "are projected; the others get AdamW.")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value):
        return {"kind": value} if isinstance(value, str) else value

    @model_serializer(mode="wrap")
    def _compact(self, handler):
        """Written back as the kind alone when no other key is set (the recipe stays readable)."""
        data = handler(self)
        defaults = type(self)(kind=self.kind)
        if all(getattr(self, name) == getattr(defaults, name) for name in type(self).model_fields):
            return self.kind
        return data


def word_or_table(schema: dict) -> None:
    """JSON Schema of train.optimizer: a kind's word, or the table."""
    ref = schema.pop("$ref", None)
    schema["anyOf"] = [{"type": "string", "enum": list(OPTIMIZER_KINDS)}] + ([{"$ref": ref}] if ref else [])


# ---------------------------------------------------------------- state bytes

Role = Literal["embedding", "head", "hidden", "other"]  # hidden = a 2-D weight inside the blocks
FP32 = 4
BNB_BLOCK = 256  # bitsandbytes' blockwise quantization: one fp32 absmax per 256 values
BNB_MIN_8BIT = 4096  # bitsandbytes keeps tensors with fewer values in 32 bits


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def state_bytes(spec: OptimizerSpec | str, params: Iterable[tuple[tuple[int, ...], Role, str]],
                flattened: bool = False) -> int:
    """Bytes of optimizer state for trainable parameters given as (shape, role, name).

    `flattened`: DeepSpeed's ZeRO (stage >= 1) hands the optimizer flat 1-D partitions, so
    Adafactor cannot factor them (4 B each). Muon under ZeRO (DeepSpeed's) still keeps momentum
    only for the Muon half."""
    spec = OptimizerSpec(kind=spec) if isinstance(spec, str) else spec
    kind, total = spec.kind, 0
    for shape, role, name in params:
        n = numel(shape)
        if kind in ("adamw", "schedule_free_adamw"):
            total += 2 * FP32 * n
        elif kind == "lion":
            total += FP32 * n
        elif kind == "adamw_8bit":  # the Trainer keeps the embeddings' (nn.Embedding's) states in 32 bits
            eight_bit = n >= BNB_MIN_8BIT and role != "embedding"
            total += 2 * (n + FP32 * -(-n // BNB_BLOCK)) if eight_bit else 2 * FP32 * n
        elif kind == "muon":
            total += FP32 * n if (role == "hidden" and len(shape) == 2) else 2 * FP32 * n
        elif kind == "adafactor":
            total += FP32 * (shape[0] + shape[1]) if len(shape) == 2 and not flattened else FP32 * n
        elif kind in ("galore", "apollo"):
            targeted = len(shape) == 2 and role == "hidden" and any(t in name for t in spec.target_modules)
            if targeted:
                small, large = sorted(shape)
                r = min(spec.rank, small)
                # Adam moments of the r x large projection; GaLore also keeps the small x r projector
                total += 2 * FP32 * r * large + (FP32 * small * r if kind == "galore" else 0)
            else:
                total += 2 * FP32 * n
    return int(total)


def per_parameter(spec: OptimizerSpec | str, params: list[tuple[tuple[int, ...], Role, str]]) -> float:
    """Mean state bytes per trainable parameter (for the estimate's text)."""
    count = sum(numel(s) for s, _, _ in params)
    return state_bytes(spec, params) / count if count else 0.0
