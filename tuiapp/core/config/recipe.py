"""The recipe: one strict pydantic schema for a training run, read from TOML.

Every field has a description and a default, except `method.kind`, which every recipe must
name (an empty file is not a training run); the CLI, `llmtui schema`, the TUI form and the docs
all come from this one place.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import tomli_w
import tomllib
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from tuiapp.core.common.errors import RecipeError, RecipeErrors, did_you_mean
from tuiapp.core.common.methods import (
    ADAPTER_KINDS,
    ADAPTER_TABLE_KINDS,
    METHODS,
    has_adapter_table,
    trains_on_text,
)
from tuiapp.core.config.hosts import parse_host_entries
from tuiapp.core.config.optimizer import OPTIMIZER_KINDS, OptimizerSpec, word_or_table
from tuiapp.core.config.rewards import REWARD_KINDS, REWARD_MODELS, RewardSpec, check_labels
from tuiapp.core.config.tools import TOOL_ERROR_LIMIT, TOOL_OUTPUT_TOKENS, TOOL_TIMEOUT_S, EnvironmentSpec, ToolSpec

BUNDLED_MODEL = "tiny"
CHAT_TEMPLATE_NAMES = ("model", "chatml", "llama3", "qwen", "gemma", "mistral", "phi")  # dataset.template
CHAT_TEMPLATES = list(CHAT_TEMPLATE_NAMES)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NAME_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit, at most 64 characters"
AUTO_EVAL_SPLIT = 0.05  # held out when evals are asked for (eval_steps, sample_prompts) and eval_split is 0
EVAL_MAX_SAMPLES = 500  # train.eval_max_samples: examples (pretrain: blocks) one evaluation reads by default


NUMBER_LIMIT = 2**31 - 1  # the largest number a recipe key takes: counts and sizes the trainer, torch and
#                           DeepSpeed hold in 32-bit integers (steps, batch sizes, seeds), and no float beyond


def _bounded(value):
    """Refuse a number no trainer could take (99999999999999999999 steps, inf epochs) at parse
    time, instead of an overflow inside a rank."""
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            continue
        if isinstance(item, float) and not math.isfinite(item):
            raise PydanticCustomError("finite_number", "{value} is not a finite number", {"value": item})
        if abs(item) > NUMBER_LIMIT:
            raise PydanticCustomError("too_large", "{value} is more than the trainer can take (at most {limit})",
                                      {"value": item, "limit": NUMBER_LIMIT})
    return value


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="after")
    @classmethod
    def _numbers_in_range(cls, value):
        return _bounded(value)


class RopeScalingSpec(Section):
    type: Literal["linear", "dynamic", "yarn"] = Field(
        description="transformers' rope_type: 'linear' (positions divided by factor), 'dynamic' (NTK, grows "
        "with the sequence) or 'yarn'."
    )
    factor: float = Field(gt=1, le=1024, description="Context extension factor (> 1).")
    original_max_position_embeddings: int = Field(
        0, ge=0, description="The length the model was trained at (0 = the config's max_position_embeddings).",
    )


class ModelSpec(Section):
    name: str = Field(
        BUNDLED_MODEL,
        description="Base model: 'tiny' (bundled, offline), a local HF folder, a hub id, "
        "or 'run:NAME' for the final model of the latest succeeded run named NAME.",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Dtype the weights are loaded in; 'auto' follows train.precision."
    )
    trust_remote_code: bool = Field(
        False, description="Allow the model's own Python code to run. Only for models you trust."
    )
    attn_implementation: Literal["auto", "sdpa", "flash_attention_2", "eager", "torch_varlen",
                                 "flex_attention"] = Field(
        "auto", description="Attention kernel. 'auto' = flash_attention_2 when the flash_attn package is "
        "installed and CUDA is there (packed batches then run its variable-length kernel); else, on CUDA "
        "for packed batches, torch_varlen (torch's own FlashAttention varlen kernels, no extra package; "
        "flex_attention with a document mask where a sliding window or softcap rules it out); else sdpa. "
        "flash_attention_2 needs CUDA, flash_attn and bf16/fp16. 'auto' picks eager for an architecture "
        "without sdpa (e.g. Gemma 2); `llmtui model` lists what a model supports.",
    )
    experts_implementation: Literal["auto", "eager", "grouped_mm", "batched_mm"] = Field(
        "auto", description="Mixture-of-experts only: how the experts run. 'auto' = transformers' default for "
        "the architecture (grouped_mm: one grouped matmul over the experts); 'eager' loops over them.",
    )
    router_aux_loss_coef: float | None = Field(
        None, ge=0, le=10, description="Mixture-of-experts only: weight of the router's load-balancing loss added "
        "to the training loss (unset = not added; the model config's coefficient is e.g. 0.001). Per-expert "
        "load is logged either way.",
    )
    # long context (docs/parallelism.md, "Sequence parallelism"): checked in core.prelaunch.long_context
    rope_scaling: RopeScalingSpec | None = Field(
        None, description="RoPE scaling for context extension, as transformers names it: {type = 'linear' | "
        "'dynamic' | 'yarn', factor = F} (unset = the model's own). Needs a RoPE architecture.",
    )
    max_position_embeddings: int = Field(
        0, ge=0, le=16_777_216, description="Override the model config's max_position_embeddings (0 = keep; "
        "with rope_scaling, e.g. the original length x factor).",
    )

    @field_validator("name")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():  # an empty name would read the current folder as the model
            raise PydanticCustomError("empty", "the model name is empty")
        return value


MIX_BY = ("examples", "tokens")
DataFormat = Literal["auto", "text", "alpaca", "sharegpt", "messages", "preference", "unpaired"]  # dataset.format


def source_label(name: str) -> str:
    """The short name a source's metrics go under (tokens/<label>): a demo's kind, a file's stem,
    a hub id's last part."""
    if name.startswith("demo:"):
        return name.split(":", 1)[1] or "demo"
    stem = Path(name.rstrip("/")).name
    return (stem.rsplit(".", 1)[0] if "." in stem else stem) or "source"


class SourceSpec(Section):
    name: str = Field(description="This source's data, as dataset.name takes it: 'demo:facts', a local file or "
                      "folder, or a hub id.")
    label: str = Field("", pattern=r"^$|^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                       description="Short name of the source in the metrics (tokens/<label>) and the run view "
                       "('' = from the name: a demo's kind, a file's stem).")
    format: DataFormat = Field(
        "auto", description="Record layout of this source, as dataset.format.")
    columns: dict[str, str] = Field(default_factory=dict, description="Map of roles to this source's column "
                                    "names, as dataset.columns.")
    split: str = Field("train", description="Split to read from a hub dataset or folder.")
    weight: float = Field(1.0, gt=0, description="This source's share of the mixture, relative to the other "
                          "sources' weights (by examples or by tokens: dataset.mix_by).")
    eval_split: float | str = Field(0.0, description="Held-out fraction (0 to 0.5) of this source, or an eval "
                                    "file; the sources' held-out examples make one eval set.")
    max_samples: int = Field(0, ge=0, description="Use at most this many records of this source (0 = all).")

    @property
    def key(self) -> str:
        return self.label or source_label(self.name)

    @field_validator("name")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise PydanticCustomError("empty", "the source's name is empty")
        return value

    @field_validator("columns")
    @classmethod
    def _known_roles(cls, value: dict[str, str]) -> dict[str, str]:
        return DatasetSpec._known_roles(value)

    @field_validator("eval_split")
    @classmethod
    def _eval_fraction(cls, value: float | str) -> float | str:
        return DatasetSpec._eval_fraction(value)


def _mixture_error(key: str, message: str, fix: str) -> PydanticCustomError:
    """A mixture rule's error: _error_for reports its own key, message and fix."""
    return PydanticCustomError("mixture", "{message}", {"message": message, "key": key, "fix": fix})


class DatasetSpec(Section):
    name: str = Field(
        "demo:facts",
        description="'demo:facts' (instructions), 'demo:chat' (multi-turn), 'demo:prefs' (preference pairs), "
        "'demo:feedback' (labelled answers, KTO), 'demo:text' "
        "(plain text), a local file (.json .jsonl .csv .parquet .txt) or folder, or a hub id.",
    )
    format: DataFormat = Field(
        "auto", description="Record layout; 'auto' detects it from the first records. 'preference' = TRL's "
        "prompt/chosen/rejected, 'unpaired' = prompt/completion/label; sharegpt, messages and alpaca "
        "records may carry chosen/rejected (or a label) too.",
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Map of roles to column names, e.g. {prompt='question', response='answer'}. "
        "Roles: text, prompt, query, response, system, history, messages, tools; for preference "
        "data chosen, rejected, and completion, label (KTO).",
    )
    split: str = Field("train", description="Split to read from a hub dataset or folder.")
    eval_split: float | str = Field(
        0.0,
        description="Held-out fraction (0 to 0.5) of the training data, or a file path for eval.",
    )
    max_samples: int = Field(0, ge=0, description="Use at most this many records (0 = all).")
    streaming: bool = Field(
        False, description="Read and tokenize the data files while training (no cache entry is built first): "
        "the first step in seconds and memory for one batch of documents, whatever the corpus size; resume "
        "skips exactly the batches already trained. Local files are read line by line (demo and hub datasets "
        "whole). Needs train.max_steps; a held-out eval file, not a fraction.",
    )
    template: Literal[CHAT_TEMPLATE_NAMES] = Field(
        "model", description="Chat template conversations are rendered with: 'model' = the tokenizer's own "
        "(a base model without one is refused before launch), or chatml, llama3, qwen (ChatML), gemma, mistral, "
        "phi. The one chosen is saved with the trained model's tokenizer.",
    )
    sources: list[SourceSpec] = Field(
        default_factory=list,
        description="A mixture: [[dataset.sources]] tables, each with its own name, format, columns, weight, "
        "eval_split and max_samples (then leave dataset.name, format, columns, eval_split and max_samples "
        "unset). Training interleaves them by weight, reproducibly (train.seed). Empty = the one dataset above.",
    )
    mix_by: Literal[MIX_BY] = Field(
        "examples", description="What the sources' weights share out: 'examples' (a weight-2 source gives twice "
        "the examples) or 'tokens' (twice the tokens: its examples are drawn by weight / mean tokens per example).",
    )
    _eval_split_auto: bool = PrivateAttr(False)  # eval_split was 0 and the recipe's evals set it

    @property
    def eval_split_auto(self) -> bool:
        return self._eval_split_auto

    @field_validator("name")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():  # an empty name would read the current folder as the dataset
            raise PydanticCustomError("empty", "the dataset name is empty")
        return value

    @field_validator("columns")
    @classmethod
    def _known_roles(cls, value: dict[str, str]) -> dict[str, str]:
        roles = {"text", "prompt", "query", "response", "system", "history", "messages", "tools",
                 "chosen", "rejected", "completion", "label"}
        for role in value:
            if role not in roles:
                hint = did_you_mean(role, roles) or f"use one of {sorted(roles)}"
                raise ValueError(f"unknown column role '{role}'; {hint}")
        return value

    @field_validator("eval_split")
    @classmethod
    def _eval_fraction(cls, value: float | str) -> float | str:
        if isinstance(value, float) and not (0.0 <= value <= 0.5):
            raise ValueError("eval_split as a fraction must be between 0 and 0.5")
        return value

    @model_validator(mode="after")
    def _mixture(self) -> DatasetSpec:
        """With sources, the single dataset's keys stay unset (each source has its own), and
        each source has a label of its own."""
        if not self.sources:
            if self.mix_by != "examples":
                raise _mixture_error("dataset.mix_by", "dataset.mix_by weighs the sources of a mixture, and there "
                                     "are no [[dataset.sources]]", "add [[dataset.sources]] tables, or remove mix_by")
            return self
        single = {"name": "demo:facts", "format": "auto", "columns": {}, "max_samples": 0, "eval_split": 0.0}
        for key, default in single.items():
            if getattr(self, key) != default and not (key == "eval_split" and self.eval_split in (0, "")):
                raise _mixture_error(f"dataset.{key}", f"dataset.{key} is set together with [[dataset.sources]]",
                                     f"move {key} into each [[dataset.sources]] table (every source has its own), "
                                     "or remove the sources")
        seen: dict[str, int] = {}
        for index, source in enumerate(self.sources):
            if source.key in seen:
                raise _mixture_error(f"dataset.sources.{index}.label", f"sources {seen[source.key]} and {index} "
                                     f"are both labelled '{source.key}'", "set label = \"...\" on one of them "
                                     "(a label names the source's tokens/<label> metric)")
            seen[source.key] = index
        return self

    @property
    def label(self) -> str:
        """The data in a few words: the dataset's name, or a mixture's sources and weights."""
        if not self.sources:
            return self.name
        by = " by tokens" if self.mix_by == "tokens" else ""
        return "mix(" + ", ".join(f"{s.key}:{s.weight:g}" for s in self.sources) + f"){by}"

    def source_specs(self) -> list[DatasetSpec]:
        """Each source of a mixture as a dataset of its own (the shared split, template and streaming
        kept); [] for one dataset."""
        return [DatasetSpec(name=s.name, format=s.format, columns=dict(s.columns), split=s.split,
                            eval_split=s.eval_split, max_samples=s.max_samples, template=self.template,
                            streaming=self.streaming) for s in self.sources]


class _LoraParams(Section):
    rank: int = Field(8, ge=1, le=1024, description="Rank r of the update BA.")
    alpha: float = Field(16.0, gt=0, description="Scale; the update is multiplied by alpha/rank.")
    dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA input.")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Linear layers to adapt, e.g. ['q_proj','v_proj'], or 'all-linear'."
    )


class PretrainMethod(Section):
    kind: Literal["pretrain"] = Field("pretrain", description="Causal LM from random init.")
    hidden_size: int = Field(0, ge=0, description="Override the model config's hidden size (0 = keep).")
    num_layers: int = Field(0, ge=0, description="Override the number of layers (0 = keep).")


class SftMethod(Section):
    kind: Literal["sft"] = Field("sft", description="Full fine-tune of every weight.")


class LoraMethod(_LoraParams):
    kind: Literal["lora"] = Field("lora", description="Low-rank adapters W + BA, B zero-init.")


class QloraMethod(_LoraParams):
    kind: Literal["qlora"] = Field("qlora", description="LoRA over a 4-bit base (CUDA only).")
    quant_type: Literal["nf4", "fp4"] = Field("nf4", description="4-bit data type.")
    double_quant: bool = Field(True, description="Quantize the quantization constants too.")


class DoraMethod(_LoraParams):
    kind: Literal["dora"] = Field("dora", description="Weight-decomposed LoRA (magnitude + direction).")


class PrefixMethod(Section):
    kind: Literal["prefix"] = Field("prefix", description="Learned past key/values for each layer.")
    virtual_tokens: int = Field(16, ge=1, le=512, description="Prefix length.")
    projection: bool = Field(False, description="Reparameterize the prefix through an MLP.")
    encoder_hidden_size: int = Field(128, ge=1, description="Hidden size of that MLP.")


class PromptMethod(Section):
    kind: Literal["prompt"] = Field("prompt", description="Learned soft prompt embeddings.")
    virtual_tokens: int = Field(16, ge=1, le=512, description="Soft prompt length.")
    init_text: str = Field("", description="Initialise the prompt from this text ('' = random).")


class PtuningMethod(Section):
    kind: Literal["ptuning"] = Field("ptuning", description="Soft prompt through a prompt encoder.")
    virtual_tokens: int = Field(16, ge=1, le=512, description="Soft prompt length.")
    encoder_type: Literal["MLP", "LSTM"] = Field("MLP", description="Prompt encoder.")
    encoder_hidden_size: int = Field(128, ge=1, description="Prompt encoder hidden size.")


class Ia3Method(Section):
    kind: Literal["ia3"] = Field("ia3", description="Learned rescaling of keys, values and FFN.")
    target_modules: list[str] | Literal["auto"] = Field(
        "auto", description="Modules to rescale; 'auto' uses peft's defaults for the architecture."
    )


class AdapterMethod(Section):
    kind: Literal["adapter"] = Field(
        "adapter", description="Bottleneck adapter d→m→d after each block's MLP (Houlsby et al.)."
    )
    bottleneck_size: int = Field(64, ge=1, description="Bottleneck width m.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout inside the adapter.")


class LlamaAdapterMethod(Section):
    kind: Literal["llama-adapter"] = Field(
        "llama-adapter", description="Zero-init gated adaption prompts in the top layers."
    )
    adapter_len: int = Field(10, ge=1, description="Adaption prompt length.")
    adapter_layers: int = Field(2, ge=1, description="Number of top layers with adaption prompts.")


# ---- preference tuning (TRL trainers): a [method] table, plus an optional [method.adapter] sub-table


AdapterChoice = Annotated[Union[LoraMethod, DoraMethod, QloraMethod], Field(discriminator="kind")]
ADAPTER_HELP = ("Train an adapter instead of every weight: a [method.adapter] table with kind = 'lora', 'dora' "
                "or 'qlora' and that method's keys (rank, alpha, ...). Leave it out to train every weight.")


class DpoMethod(Section):
    kind: Literal["dpo"] = Field(
        "dpo", description="Direct Preference Optimization on chosen/rejected pairs, against a frozen reference."
    )
    beta: float = Field(0.1, gt=0, le=100, description="KL strength: higher keeps the model closer to the reference.")
    loss: Literal["sigmoid", "ipo", "hinge", "robust"] = Field(
        "sigmoid", description="'sigmoid' (DPO), 'ipo' (IPO), 'hinge' (SLiC) or 'robust' (noise-robust DPO).",
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="Assumed fraction of flipped preferences (sigmoid: cDPO; robust)."
    )
    adapter: AdapterChoice | None = Field(None, description=ADAPTER_HELP)


class SimpoMethod(Section):
    kind: Literal["simpo"] = Field(
        "simpo", description="SimPO: length-normalised log-probability margin, no reference model."
    )
    beta: float = Field(2.0, gt=0, le=100, description="Reward scale of the average log-probability.")
    gamma: float = Field(0.5, ge=0, description="Target reward margin (as TRL's simpo_gamma).")
    sft_weight: float = Field(0.0, ge=0, description="Weight of an NLL loss on the chosen answers (0 = pure SimPO).")
    adapter: AdapterChoice | None = Field(None, description=ADAPTER_HELP)


class CpoMethod(Section):
    kind: Literal["cpo"] = Field(
        "cpo", description="Contrastive Preference Optimization: pair loss + NLL on chosen, no reference model."
    )
    beta: float = Field(0.1, gt=0, le=100, description="Temperature of the preference loss.")
    loss: Literal["sigmoid", "hinge", "ipo"] = Field("sigmoid", description="Preference loss.")
    sft_weight: float = Field(1.0, ge=0, description="Weight of the NLL loss on the chosen answers (cpo_alpha).")
    adapter: AdapterChoice | None = Field(None, description=ADAPTER_HELP)


class OrpoMethod(Section):
    kind: Literal["orpo"] = Field(
        "orpo", description="ORPO: NLL on chosen + odds-ratio penalty on rejected, no reference model."
    )
    beta: float = Field(0.1, gt=0, le=100, description="Weight λ of the odds-ratio term next to the NLL loss.")
    adapter: AdapterChoice | None = Field(None, description=ADAPTER_HELP)


class KtoMethod(Section):
    kind: Literal["kto"] = Field(
        "kto", description="KTO on unpaired feedback (answers labelled good or bad), against a frozen reference."
    )
    beta: float = Field(0.1, gt=0, le=100, description="KL strength: higher keeps the model closer to the reference.")
    desirable_weight: float = Field(1.0, gt=0, description="Weight of the loss on answers labelled true.")
    undesirable_weight: float = Field(1.0, gt=0, description="Weight of the loss on answers labelled false.")
    adapter: AdapterChoice | None = Field(None, description=ADAPTER_HELP)


class RewardMethod(Section):
    kind: Literal["reward"] = Field(
        "reward", description="Reward model: the base with a scalar value head, trained so chosen scores above rejected."
    )
    center_rewards: float = Field(
        0.0, ge=0, description="Coefficient of a penalty pulling rewards to mean zero (0 = off)."
    )
    adapter: AdapterChoice | None = Field(None, description=ADAPTER_HELP)


class DistillMethod(Section):  # knowledge distillation: tuiapp.trainer.methods.distill, checks in core.prelaunch.distill_checks
    kind: Literal["distill"] = Field(
        "distill", description="Knowledge distillation: the model (the student) learns the token distributions "
        "of a frozen teacher on the dataset's answers.",
    )
    teacher: str = Field("tiny-teacher", description="The frozen teacher: a local HF folder, a hub id, 'run:NAME' "
                         "(the final model of the latest succeeded run named NAME), the /v1 URL of an OpenAI-compatible "
                         "server giving prompt_logprobs (`llmtui serve`, vLLM; mode 'offline'), or a "
                         "bundled name ('tiny', 'tiny-teacher': a wider random Llama with the tiny tokenizer); it "
                         "must use the student's tokenizer.")
    mode: Literal["online", "offline"] = Field(
        "offline", description="'offline' = the teacher's top_k logits computed once per example before "
        "training (cached), forward KL on them; 'online' = the teacher runs every step, generalized JSD (GKD) on "
        "the full vocabulary, a lmbda share of the batches answered by the student itself.",
    )
    top_k: int = Field(32, ge=1, le=4096, description="mode 'offline': teacher logits kept per position.")
    temperature: float = Field(1.0, gt=0, le=20, description="Softmax temperature of teacher and student.")
    alpha: float = Field(0.5, gt=0, le=1, description="The loss is alpha x the distance to the teacher (KL "
                         "offline, JSD online) + (1 - alpha) x the cross-entropy on the dataset's answers; "
                         "1 = the teacher only.")
    lmbda: float = Field(0.5, ge=0, le=1, description="mode 'online': share of batches whose answers the "
                         "student generates (on-policy); 0 = the dataset's answers only.")
    beta: float = Field(0.5, ge=0, le=1, description="mode 'online': generalized JSD interpolation (0 = forward "
                        "KL, 1 = reverse KL).")
    max_new_tokens: int = Field(64, ge=1, le=4096, description="mode 'online': tokens the student generates "
                                "per on-policy answer.")
    adapter: AdapterChoice | None = Field(None, description=ADAPTER_HELP)


PREFERENCE_MODELS = (DpoMethod, SimpoMethod, CpoMethod, OrpoMethod, KtoMethod, RewardMethod)


# ---- online RL (TRL's GRPOTrainer / RLOOTrainer): completions sampled while training, scored by rewards


class _OnlineRl(Section):
    rewards: list[RewardSpec] = Field(
        default_factory=list, description="Reward functions, each a [[method.rewards]] table with a kind ("
        + ", ".join(REWARD_KINDS) + ") and a weight; their weighted sum is the completion's reward.",
    )
    num_generations: int = Field(8, ge=2, le=1024, description="Completions sampled per prompt (the group whose "
                                 "rewards are compared); micro_batch x ranks x grad_accum must be a multiple of it.")
    max_completion_length: int = Field(256, ge=1, le=131072, description="Most tokens generated per completion.")
    temperature: float = Field(1.0, gt=0, le=5, description="Sampling temperature of the completions.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the completions (1 = off).")
    epsilon: float = Field(0.2, gt=0, lt=1, description="Clipping range of the policy ratio (PPO-style), lower side.")
    epsilon_high: float = Field(0.0, ge=0, le=10, description="Upper clipping range (DAPO recommends 0.28); "
                                "0 = the same as epsilon.")
    num_iterations: int = Field(1, ge=1, le=64, description="Optimisation passes over each batch of completions (mu).")
    mask_truncated_completions: bool = Field(False, description="Leave completions cut at max_completion_length "
                                             "out of the loss (DAPO).")
    generation_backend: Literal["transformers", "vllm"] = Field(
        "transformers", description="'transformers' = model.generate in each rank (any machine); 'vllm' = vLLM "
        "(CUDA and the vllm package), as method.vllm_mode says.")
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate", description="generation_backend 'vllm': 'colocate' = an engine inside each rank, sharing its "
        "GPU; 'server' = a vLLM server the run starts and supervises on GPUs of its own (vllm_server_gpus of "
        "them, after the training's), its log in logs/vllm-server.log.")
    vllm_server_gpus: int = Field(1, ge=1, le=64, description="vllm_mode 'server': GPUs the server takes "
                                  "(its tensor parallel size), besides launch.gpus; launch.gpus = 'all' leaves "
                                  "them out.")
    vllm_server_timeout_s: float = Field(600.0, gt=0, le=7200, description="vllm_mode 'server': how long the "
                                         "server may take to load the model and answer before the run fails.")
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, lt=1, description="generation_backend 'vllm': the "
                                               "share of each GPU's memory vLLM takes (weights + KV cache); "
                                               "a server on its own GPUs takes 0.9 unless this is set.")
    log_completions: bool = Field(True, description="Append every completion with its rewards to the run "
                                  "folder's completions.jsonl.")
    adapter: AdapterChoice | None = Field(None, description=ADAPTER_HELP)

    @field_validator("rewards")
    @classmethod
    def _rewards(cls, value: list) -> list:
        return check_labels(value)


class GrpoMethod(_OnlineRl):
    kind: Literal["grpo"] = Field(
        "grpo", description="GRPO: completions sampled per prompt, each advantage its reward against its group's.",
    )
    beta: float = Field(0.0, ge=0, le=10, description="KL penalty against the frozen start (0 = none, no "
                        "reference model kept; DeepSeek-R1 used 0.001).")
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo"] = Field(
        "dapo", description="Loss aggregation: 'grpo' (per-sequence mean: length bias), 'dr_grpo' (a constant), "
        "'dapo' (tokens of the whole batch), 'bnpo' (tokens of the local batch), 'cispo' (clipped importance "
        "weights), 'sapo' (soft gate instead of clipping).",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="Advantages divided by the reward std of the 'group', of the 'batch', or 'none' "
        "(Dr. GRPO).",
    )
    # ---- agentic GRPO (tuiapp.core.config.tools): tools the model calls, an environment per rollout
    tools: list[ToolSpec] = Field(default_factory=list, description="[[method.tools]]: Python functions the model "
                                  "may call (function = 'FILE.py:NAME'), each result a tool turn masked out of the loss.")
    environment: EnvironmentSpec | None = Field(None, description="[method.environment]: one instance per rollout "
                                                "whose public methods are tools: builtin = 'calculator' or "
                                                "'kv_search' (with file), or class = 'FILE.py:NAME'.")
    max_turns: int = Field(4, ge=1, le=64, description="Tool-calling turns per rollout at most (TRL's "
                           "max_tool_calling_iterations).")
    tool_timeout_s: float = Field(TOOL_TIMEOUT_S, gt=0, le=600, description="Seconds one tool call may take; past "
                                  "it the call ends with a recorded error.")
    tool_output_tokens: int = Field(TOOL_OUTPUT_TOKENS, ge=1, le=32768, description="Tokens of a tool's result the "
                                    "model reads at most (the rest is cut, marked '…').")
    tool_error_limit: int = Field(TOOL_ERROR_LIMIT, ge=1, le=100000, description="Tool calls in a row that raise, "
                                  "time out or return garbage before the run fails naming the tool and its file:line "
                                  "(a call that works starts the count again; a call with arguments the tool does not "
                                  "take is the model's mistake and never counts).")
    async_generation: bool = Field(False, description="Generation overlapped with training (TRL's experimental "
                                   "AsyncGRPOTrainer); refused before launch where the setup does not support it.")


class RlooMethod(_OnlineRl):
    kind: Literal["rloo"] = Field(
        "rloo", description="RLOO: each completion's advantage is its reward minus the mean of the others' "
        "(leave one out).",
    )
    beta: float = Field(0.05, ge=0, le=10, description="KL penalty folded into the reward, against the frozen "
                        "start (0 = none, no reference model kept).")
    normalize_advantages: bool = Field(False, description="Scale the advantages of each batch to mean 0, std 1.")


RL_MODELS = (GrpoMethod, RlooMethod)
ADAPTER_CHOICES = ADAPTER_TABLE_KINDS  # kinds a [method.adapter] table may name


Method = Annotated[
    Union[
        PretrainMethod,
        SftMethod,
        LoraMethod,
        QloraMethod,
        DoraMethod,
        PrefixMethod,
        PromptMethod,
        PtuningMethod,
        Ia3Method,
        AdapterMethod,
        LlamaAdapterMethod,
        DpoMethod,
        SimpoMethod,
        CpoMethod,
        OrpoMethod,
        KtoMethod,
        RewardMethod,
        GrpoMethod,
        RlooMethod,
        DistillMethod,
    ],
    Field(discriminator="kind"),
]
PROFILE_AFTER = 3  # train.profile_steps: the profiled steps come after these (compiling, autotuning done)
METHOD_KINDS = list(METHODS)  # core/common/methods.py: one row of traits per kind


class TrainSpec(Section):
    epochs: float = Field(1.0, gt=0, description="Passes over the data (ignored when max_steps > 0).")
    max_steps: int = Field(0, ge=0, description="Stop after this many optimizer steps (0 = use epochs).")
    micro_batch: int | Literal["auto"] = Field(
        4, description="Sequences per rank per forward pass, or 'auto': the run first probes a few steps at "
        "1, 2, 4, ... up to max_micro_batch and keeps the largest that fits the device's memory less "
        "memory_headroom (`llmtui probe RECIPE` shows the table).",
    )
    max_micro_batch: int = Field(64, ge=1, le=4096, description="micro_batch 'auto': the largest size probed.")
    memory_headroom: float = Field(
        0.1, ge=0, lt=0.9, description="micro_batch 'auto': fraction of the device's memory left free."
    )
    grad_accum: int = Field(1, ge=1, description="Micro batches accumulated per optimizer step.")
    learning_rate: float = Field(2e-4, gt=0, lt=1, description="Peak learning rate.")
    scheduler: Literal["cosine", "linear", "constant"] = Field("cosine", description="LR schedule.")
    optimizer: OptimizerSpec = Field(
        "adamw", validate_default=True, json_schema_extra=word_or_table, description="Optimizer: 'adamw' (default), 'adamw_8bit', 'muon', "
        "'adafactor', 'schedule_free_adamw', 'galore', 'apollo' or 'lion'; or a [train.optimizer] table with "
        "kind and its keys (betas, eps, momentum, ns_steps, lr_scale, rank, ...).",
    )
    warmup_ratio: float = Field(0.03, ge=0, le=0.5, description="Fraction of steps for linear warmup.")
    weight_decay: float = Field(0.0, ge=0, lt=1, description="Decoupled weight decay (every optimizer that takes one).")
    max_grad_norm: float = Field(1.0, ge=0, description="Gradient clipping norm (0 = off).")
    seed: int = Field(42, ge=0, description="Seed for init, shuffling and dropout.")
    max_seq_len: int = Field(512, ge=8, le=1_048_576, description="Tokens per sequence; longer is cut.")
    packing: bool | Literal["auto"] = Field(
        "auto",
        description="Padding-free batches: examples flattened into one sequence, attention kept "
        "apart. 'auto' = on for every method that supports it (not prefix/prompt/ptuning/llama-adapter).",
    )
    gradient_checkpointing: bool = Field(False, description="Recompute activations to save memory.")
    sequence_parallel: int = Field(
        1, ge=1, le=1024, description="Ranks that split every sequence between them (DeepSpeed Ulysses): each "
        "holds 1/N of its tokens; ranks / N groups train data-parallel (1 = off). See docs/parallelism.md.",
    )
    tiled_mlp: bool = Field(
        False, description="Run each MLP over slices of the sequence (DeepSpeed's TiledMLP): its intermediate "
        "activations for one slice at a time. For long sequences.",
    )
    tiled_loss: bool = Field(
        False, description="Make the LM head's logits and the loss over slices of the trained tokens, never the "
        "whole logits tensor (each slice made again in the backward). For long sequences and large vocabularies.",
    )
    activation_offload: bool = Field(
        False, description="Keep the activations saved for backward in CPU memory (torch's save_on_cpu), "
        "copied back for the backward. Needs CUDA (on CPU they are there already).",
    )
    batching: Literal["examples", "tokens"] = Field(
        "examples", description="'examples' = micro_batch examples per micro batch; 'tokens' = examples "
        "added to a micro batch until tokens_per_batch is reached (packed in rows of at most max_seq_len, "
        "attention kept inside each example), so each step does the same amount of work.",
    )
    tokens_per_batch: int = Field(
        0, ge=0, description="batching 'tokens': the token budget of a micro batch per rank "
        "(0 = micro_batch x max_seq_len).",
    )
    profile_steps: int = Field(
        0, ge=0, le=20, description="Record this many steps with torch.profiler, after the first "
        f"{PROFILE_AFTER} (compiling and autotuning done): runs/<id>/profile/ holds the ops by time (`llmtui show RUN "
        "--profile`) and a Chrome trace for Perfetto. Rank 0 only; 0 = off.",
    )
    liger_kernel: bool = Field(
        False, description="Liger's fused Triton kernels (RMSNorm, RoPE, SwiGLU, cross-entropy): less "
        "activation memory, faster steps. CUDA only; needs the liger-kernel package.",
    )
    torch_compile: bool = Field(
        False, description="Compile the model with torch.compile (inductor; on CPU it needs a C compiler). "
        "The first steps are slower while it compiles.",
    )
    precision: Literal["auto", "bf16", "fp16", "fp32", "fp8"] = Field(
        "auto", description="'auto' = bf16 on CUDA that supports it, else fp16 on CUDA, fp32 on CPU. "
        "'fp8' = bf16 with the linear layers in float8 (torchao's float8 training; GPUs of compute "
        "capability 8.9+: Ada, Hopper; the fp8 extra)."
    )
    logging_steps: int = Field(1, ge=1, description="Write a metrics line every N steps.")
    eval_steps: int = Field(0, ge=0, description="Evaluate every N steps and after the last one (0 = no "
                            "evaluation, but for one at the end when sample_prompts asks for answers).")
    eval_on_start: bool = Field(False, description="Evaluate once before the first step as well (needs eval_steps): "
                                "the base's figures on the held-out data, what the later evals are read against "
                                "(grpo/rloo: the held-out task reward before RL). Not again on resume.")
    eval_max_samples: int = Field(EVAL_MAX_SAMPLES, ge=0, description="Examples an evaluation reads at most: a "
                                  "fixed random subset of the held-out data, the same at every eval (0 = all).")
    save_steps: int = Field(0, ge=0, description="Checkpoint every N steps (0 = only at the end).")
    save_total_limit: int = Field(2, ge=1, description="Checkpoints kept; older ones are deleted.")
    sample_prompts: list[str] = Field(
        default_factory=list, description="Prompts answered by the model at each eval."
    )
    sample_max_new_tokens: int = Field(32, ge=1, le=4096, description="Tokens generated per sample.")
    early_stopping_patience: int = Field(
        0, ge=0, description="Stop when the eval loss has not improved for this many evals (0 = off; needs "
        "eval_steps and an eval split). The run ends as succeeded, with its final model.",
    )
    early_stopping_threshold: float = Field(
        0.0, ge=0, description="An eval loss must drop by more than this to count as an improvement.",
    )
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list, description="Trackers that also get the metrics (rank 0): tensorboard (event "
        "files in the run folder's tensorboard/), wandb (offline unless WANDB_MODE says otherwise), mlflow (a "
        "file store in the run folder's mlruns/ unless MLFLOW_TRACKING_URI is set). Each needs its package: "
        "pip install 'llmtui[tensorboard]' (or [wandb], [mlflow]).",
    )

    @field_validator("learning_rate", "epochs", "warmup_ratio", "weight_decay", "max_grad_norm")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("optimizer", mode="before")
    @classmethod
    def _optimizer_kind(cls, value):
        given = value.get("kind", "adamw") if isinstance(value, dict) else value
        if isinstance(given, str) and given not in OPTIMIZER_KINDS:
            hint = did_you_mean(given, OPTIMIZER_KINDS) or "use one of: " + ", ".join(OPTIMIZER_KINDS)
            raise PydanticCustomError("optimizer_kind", "unknown optimizer '{given}'; {hint}",
                                      {"given": given, "hint": hint})
        return value

    @field_validator("micro_batch")
    @classmethod
    def _micro_batch(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("micro_batch must be a count of at least 1, or 'auto'")
        return value


class LaunchSpec(Section):
    gpus: Literal["all"] | int | list[int] = Field(
        "all",
        description="'all', a count, or a list of GPU ids. Without CUDA: the number of CPU ranks "
        "('all' = 1).",
    )
    zero_stage: Literal[0, 1, 2, 3] = Field(0, description="DeepSpeed ZeRO stage.")
    offload_optimizer: Literal["none", "cpu", "nvme"] = Field("none", description="Optimizer state offload.")
    offload_params: Literal["none", "cpu", "nvme"] = Field(
        "none", description="Parameter offload (ZeRO-3 only)."
    )
    nvme_path: str = Field("", description="Folder on fast local NVMe for 'nvme' offload.")
    master_port: int = Field(
        0, ge=0, le=65535,
        description="Rendezvous port (0 = pick a free one; 29500 when the run spans several nodes).",
    )
    # scale-out (multi-node, strategies): rules in tuiapp.core.plan.cluster, docs in docs/scale-out.md
    strategy: Literal["deepspeed", "fsdp", "ddp", "pipeline"] = Field(
        "deepspeed",
        description="'deepspeed' (ZeRO, deepspeed launcher), 'fsdp' (PyTorch FSDP2 via torchrun), "
        "'ddp' (plain data parallel via torchrun) or 'pipeline' (the model cut into pipeline_stages by "
        "decoder layers, torch.distributed.pipelining, deepspeed launcher). See docs/parallelism.md.",
    )
    pipeline_stages: int = Field(
        2, ge=1, le=256,
        description="strategy 'pipeline' only: stages p the decoder layers are cut into; the ranks must be a "
        "multiple of p (ranks / p pipeline replicas train data-parallel).",
    )
    microbatches: int = Field(
        4, ge=1, le=4096,
        description="strategy 'pipeline' only: micro-batches m each step's batch (train.micro_batch x "
        "grad_accum sequences) is split into; the idle bubble is (p-1)/(m+p-1), so m >= p.",
    )
    pipeline_schedule: Literal["1f1b", "gpipe"] = Field(
        "1f1b",
        description="strategy 'pipeline' only: '1f1b' (one forward, one backward: at most p micro-batches of "
        "activations held) or 'gpipe' (all forwards, then all backwards: m held).",
    )
    fsdp_cpu_offload: bool = Field(
        False, description="strategy 'fsdp' only: keep parameters and gradients on CPU between uses."
    )
    hosts: list[str] | str = Field(
        default_factory=list,
        description="Multi-node: MPI-style 'host slots=N' entries, e.g. ['node1 slots=8', "
        "'node2 slots=8'], or the path of such a hostfile ([] = this machine only).",
    )
    include: str = Field(
        "", description="DeepSpeed --include filter over hosts: NODE[:SLOT,...] joined by '@'."
    )
    exclude: str = Field("", description="DeepSpeed --exclude filter, same syntax; not with include.")
    nodes: int = Field(
        0, ge=0, description="Number of nodes: the first N hosts (0 = every host, or 1 without hosts)."
    )
    gpus_per_node: int = Field(
        0, ge=0, description="Ranks per node in multi-node runs (0 = from 'gpus' or the hosts' slots)."
    )
    launcher: Literal["pdsh", "openmpi", "mvapich", "mpich", "impi", "slurm"] = Field(
        "pdsh", description="How DeepSpeed starts ranks on the other hosts (its --launcher)."
    )
    join_timeout_s: int = Field(
        600, ge=10, description="Multi-node: seconds node 0 waits for every node to join before failing."
    )
    startup_timeout_s: int = Field(
        900, ge=5,
        description="Seconds a start-up phase (importing, building ops, joining ranks, tokenizing, loading "
        "the model, first step) may go without progress before the run is flagged as hung (`llmtui doctor`).",
    )

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value):
        if isinstance(value, list) and value:
            parse_host_entries(value)  # raises ValueError naming the bad entry and the fix
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value):
        if isinstance(value, int) and value < 1:
            raise ValueError("gpus must be 'all', a count of at least 1, or a list of ids")
        if isinstance(value, list):
            if not value or any(v < 0 for v in value) or len(set(value)) != len(value):
                raise ValueError("gpus as a list must hold distinct ids >= 0")
        return value


class SweepSpec(Section):
    grid: dict[str, list[bool | int | float | str]] = Field(
        default_factory=dict,
        description="Recipe keys and the values to try, e.g. {'train.learning_rate' = [1e-4, 3e-4], "
        "'method.rank' = [8, 16]}: every combination (or `random` of them) is one run. `llmtui sweep`.",
    )
    random: int = Field(0, ge=0, description="Try this many combinations drawn at random (0 = every one).")
    seed: int = Field(0, ge=0, description="Seed of the random draw.")
    slots: int = Field(0, ge=0, description="Runs of the sweep at once on a machine without CUDA (0 = "
                       "LLMTUI_QUEUE_SLOTS or 1); with CUDA the queue fits runs to free GPUs.")
    metric: Literal["eval_loss", "loss"] = Field(
        "eval_loss", description="What ranks the sweep's runs (best = lowest); `loss` when there is no eval."
    )
    halving_step: int = Field(
        0, ge=0, description="Successive halving: a run reaching this step in the worse half of the sweep's "
        "runs so far (by train loss there) is stopped (0 = off).",
    )


class NotifySpec(Section):
    command: str = Field(
        "", description="A command run (no shell) when the run ends, fails or hangs, e.g. "
        "\"curl -d @- ntfy.sh/mytopic\"; it gets LLMTUI_EVENT, LLMTUI_RUN_ID, LLMTUI_STATUS, LLMTUI_REASON "
        "in its environment and a one-line summary on stdin.",
    )
    on: list[Literal["succeeded", "failed", "stopped", "hang", "sweep"]] = Field(
        default_factory=lambda: ["succeeded", "failed", "hang", "sweep"],
        description="Events that run the command (sweep = the last run of a sweep ended).",
    )


class GenerateSpec(Section):
    system: str = Field("", description="System prompt of `llmtui chat` and the TUI chat (empty = none).")
    temperature: float = Field(0.0, ge=0, le=5, description="Sampling temperature (0 = greedy decoding).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling: keep the smallest set of tokens "
                         "whose probabilities add up to top_p (with temperature > 0).")
    max_new_tokens: int = Field(128, ge=1, le=32768, description="Most tokens generated per answer.")
    repetition_penalty: float = Field(1.0, gt=0, le=5, description="Penalty for repeated tokens (1 = none).")


class VisionSpec(Section):
    train_language_model: bool = Field(
        True, description="Vision-language models: the language model trains (a full fine-tune: every weight; "
        "LoRA/DoRA: adapters on its linear layers and output head). false = frozen, no adapters.",
    )
    train_projector: bool | Literal["auto"] = Field(
        "auto", description="Vision-language models: the projector (multi-modal connector) trains, every "
        "weight of it (under LoRA as peft's modules_to_save). 'auto' = with a full fine-tune, frozen under adapters.",
    )
    train_vision_tower: bool = Field(
        False, description="Vision-language models: the vision tower (image encoder) trains too (a full "
        "fine-tune: every weight; LoRA/DoRA: adapters on its linear layers). Frozen by default.",
    )
    projector_lr: float = Field(
        0.0, ge=0, lt=1, description="Peak learning rate of the projector (0 = train.learning_rate).",
    )
    vision_tower_lr: float = Field(
        0.0, ge=0, lt=1, description="Peak learning rate of the vision tower (0 = train.learning_rate); "
        "often 5-10x lower than the language model's.",
    )
    max_pixels: int = Field(
        0, ge=0, description="Largest image, in pixels (width x height), the processor resizes images down to "
        "(Qwen2-VL style dynamic resolution: fewer pixels = fewer image tokens per example). 0 = the "
        "processor's own limit. Refused for processors that resize every image to one fixed size.",
    )


class BenchmarkSpec(Section):
    task: str = Field(..., min_length=1, description="An lm-evaluation-harness task: a name from its registry "
                      "(its data must already be in the local datasets cache: nothing is downloaded), the path of "
                      "a task YAML of yours over local files, or demo:facts-mc (multiple choice over the demo facts, "
                      "made locally by llmtui).")
    limit: int = Field(0, ge=0, description="Documents scored per evaluation (0 = all).")
    num_fewshot: int = Field(0, ge=0, le=64, description="Examples shown before each question (few-shot).")
    chat_template: bool = Field(False, description="Format each question with the model's chat template (a "
                                "chat model, or demo:facts-mc on a model tuned on the demo facts).")


class EvalSpec(Section):
    benchmarks: list[BenchmarkSpec] = Field(
        default_factory=list, description="lm-evaluation-harness tasks scored on the run's own model: "
        "[[eval.benchmarks]] tables. Their scores are metrics rows' bench/<task>/<metric>.")
    benchmark_at: Literal["evals", "end"] = Field(
        "evals", description="When the benchmarks run: at every evaluation (train.eval_steps and after the "
        "last step), or only after the last step.")


class Recipe(Section):
    name: str = Field("run", pattern=NAME_PATTERN, description="Run name: letters, digits, . _ -")
    description: str = Field("", description="Free text shown in history.")
    model: ModelSpec = Field(default_factory=ModelSpec, description="Base model.")
    dataset: DatasetSpec = Field(default_factory=DatasetSpec, description="Training data.")
    method: Method = Field(
        description="Training method (required): a [method] table whose kind is one of "
        + ", ".join(METHOD_KINDS) + ".",
    )
    train: TrainSpec = Field(default_factory=TrainSpec, description="Optimisation settings.")
    launch: LaunchSpec = Field(default_factory=LaunchSpec, description="Processes and ZeRO.")
    sweep: SweepSpec = Field(default_factory=SweepSpec, description="A grid of runs for `llmtui sweep` "
                             "(ignored by `llmtui run`).")
    notify: NotifySpec = Field(default_factory=NotifySpec, description="Tell someone when the run ends.")
    generate: GenerateSpec = Field(default_factory=GenerateSpec, description="Generation settings of the "
                                   "trained model: `llmtui chat`, `llmtui eval` and the TUI chat.")
    vision: VisionSpec = Field(default_factory=VisionSpec, description="Vision-language models on image data: "
                               "what trains (language model, projector, vision tower), their learning rates, "
                               "the image size limit.")
    eval: EvalSpec = Field(default_factory=EvalSpec, description="Benchmarks (lm-evaluation-harness) scored "
                           "while the run trains.")

    @model_validator(mode="after")
    def _hold_out_for_evals(self) -> Recipe:
        """Evals asked for (eval_steps or sample_prompts) need held-out data: with eval_split 0
        the trainer would skip them, so AUTO_EVAL_SPLIT of the training data is held out."""
        asked = self.train.eval_steps > 0 or bool(self.train.sample_prompts)
        if self.dataset.streaming:
            return self  # a stream holds nothing out: preflight asks for an eval file instead
        if asked and self.dataset.sources:  # each source holds its share out
            for source in self.dataset.sources:
                if isinstance(source.eval_split, float) and source.eval_split == 0.0:
                    source.eval_split = AUTO_EVAL_SPLIT
                    self.dataset._eval_split_auto = True
            return self
        if asked and isinstance(self.dataset.eval_split, float) and self.dataset.eval_split == 0.0:
            self.dataset.eval_split = AUTO_EVAL_SPLIT
            self.dataset._eval_split_auto = True
        return self

    def to_toml(self) -> str:
        # None only stands for an absent optional table ([method.adapter]); TOML has no null
        return tomli_w.dumps(self.model_dump(mode="json", exclude_none=True))


# ---------------------------------------------------------------- reading


def key_line(text: str, path: tuple) -> int | None:
    """Best-effort line number of a dotted key path inside TOML text."""
    lines = text.splitlines()
    names = [str(p) for p in path]  # an index follows an array of tables' name: [[dataset.sources]] n
    if not [p for p in path if not isinstance(p, int)]:
        return None
    table: list[str] = []
    best = None
    arrays: dict[str, int] = {}  # [[a.b]] tables seen so far, by name
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        header = re.match(r"^\[\[\s*([^\]]+?)\s*\]\]$", line) or re.match(r"^\[\s*([^\]]+?)\s*\]$", line)
        if header:
            table = [part.strip().strip('"') for part in header.group(1).split(".")]
            if line.startswith("[["):
                arrays[header.group(1)] = arrays.get(header.group(1), -1) + 1
                table.append(str(arrays[header.group(1)]))
            if table == names:
                best = best or number
            continue
        assign = re.match(r"^([A-Za-z0-9_\-.\"' ]+?)\s*=", line)
        if assign:
            key = [part.strip().strip("\"'") for part in assign.group(1).split(".")]
            full = table + key
            if full == names[: len(full)] and len(full) >= 1:
                if full == names:
                    return number
                best = number
    return best


def _error_for(item: dict, text: str, file: str) -> RecipeError:
    loc = list(item["loc"])
    # drop the discriminator tag pydantic inserts for the method union
    if len(loc) >= 2 and loc[0] == "method" and loc[1] in METHOD_KINDS:
        loc.pop(1)
    if len(loc) >= 4 and loc[:2] == ["method", "rewards"] and loc[3] in REWARD_KINDS:
        loc.pop(3)  # and the one of each [[method.rewards]] table
    if len(loc) >= 3 and loc[:2] == ["method", "adapter"] and loc[2] in ADAPTER_CHOICES:
        loc.pop(2)  # and the one of the [method.adapter] union
    loc = [p for p in loc if not _is_type_tag(p)]
    key = ".".join(str(p) for p in loc)
    kind = item["type"]
    line = key_line(text, tuple(loc))
    fix = None
    message = item["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")  # pydantic's wording
    if loc[:2] in (["method", "adapter"], ["method", "rewards"]) and kind in ("union_tag_invalid", "union_tag_not_found"):
        message, fix, key, line = _inner_union_error(item, loc, text, line)
    elif kind == "mixture":
        context = item.get("ctx", {})
        message, key, fix = context["message"], context["key"], context["fix"]
        parts = tuple(int(p) if p.isdigit() else p for p in key.split("."))
        line = key_line(text, parts) or key_line(text, parts[:-1]) or line
    elif kind == "extra_forbidden":
        message, fix = _unknown_key_error(item, loc)
    elif kind == "union_tag_invalid" or (kind == "literal_error" and key == "method.kind"):
        given = str(item.get("input", ""))
        if isinstance(item.get("input"), dict):
            given = str(item["input"].get("kind", ""))
        message = f"unknown method kind '{given}'"
        fix = did_you_mean(given, METHOD_KINDS) or f"use one of: {', '.join(METHOD_KINDS)}"
        key = "method.kind"
        line = key_line(text, ("method", "kind"))
    elif kind == "union_tag_not_found" or (kind == "missing" and key == "method"):
        message = "missing: every recipe must name its training method"
        fix = (f"add kind = one of: {', '.join(METHOD_KINDS)}" if kind == "union_tag_not_found" else
               f"add a [method] table with kind = one of: {', '.join(METHOD_KINDS)} (e.g. kind = \"lora\")")
        key = "method.kind"
        line = key_line(text, ("method",))
    elif kind == "literal_error":
        fix = "use " + item.get("ctx", {}).get("expected", "one of the allowed values")
    elif kind == "string_pattern_mismatch" and item.get("ctx", {}).get("pattern") == NAME_PATTERN:
        given = str(item.get("input", ""))
        message = f"'{given}' is not a valid name" if given else "the name is empty"
        fix = f"use {NAME_RULE}"
    elif kind in ("missing",):
        fix = "add this key"
    elif kind in ("too_large", "finite_number"):
        description = _description_of(loc)
        fix = (f"use a number of at most {NUMBER_LIMIT} (in size)" if kind == "too_large" else "use a finite "
               "number") + (f"; {description}" if description else "")
    else:
        description = _description_of(loc)
        if description:
            fix = description
    return RecipeError(message=message, file=file, line=line, key=key or None, fix=fix)


def _unknown_key_error(item: dict, loc: list) -> tuple[str, str]:
    """An unknown key: the near known one, or the keys its table takes."""
    field = str(loc[-1])
    parent = _model_at(loc[:-1], item)
    choices = list(parent.model_fields) if parent else []
    hint = did_you_mean(field, choices)
    fix = hint or (f"remove it; known keys: {', '.join(choices)}" if choices else "remove it")
    if not hint and "adapter" in choices and field in QloraMethod.model_fields and field != "kind":
        fix = (f"{field} is an adapter's setting: move it under [method.adapter] (kind = 'lora'), or remove "
               "it to train every weight")  # e.g. rank = 8 left in [method] when lora became dpo
    return f"unknown key '{field}'", fix


def _inner_union_error(item: dict, loc: list, text: str, line: int | None) -> tuple[str, str, str, int | None]:
    """An unknown or missing kind of a [method.adapter] table or a [[method.rewards]] entry."""
    given = item["input"].get("kind", "") if isinstance(item.get("input"), dict) else ""
    if loc[1] == "adapter":
        message = f"unknown adapter kind '{given}'" if given else "missing: the adapter's kind"
        fix = (did_you_mean(str(given), ADAPTER_CHOICES) if given else None) or (
            f"set kind = one of: {', '.join(ADAPTER_CHOICES)} (or remove [method.adapter] to train every weight)")
        line = key_line(text, ("method", "adapter", "kind")) or key_line(text, ("method", "adapter"))
        return message, fix, "method.adapter.kind", line
    message = f"unknown reward kind '{given}'" if given else "missing: the reward's kind"
    fix = (did_you_mean(str(given), REWARD_KINDS) if given else None) or f"set kind = one of: {', '.join(REWARD_KINDS)}"
    return message, fix, ".".join(str(p) for p in loc[:3]) + ".kind", line


def _blame_override(error: RecipeError, overrides: list[str]) -> RecipeError:
    """An error on a key a --set gave (or inside it, or around it): the --set is named, not the
    file's line, which held the value the --set replaced or nothing at all."""
    for override in reversed(overrides):  # the last --set of a key wins
        key = ".".join(_override_parts(override.partition("=")[0]))
        if error.key and (error.key == key or error.key.startswith(key + ".") or key.startswith(error.key + ".")):
            return dataclasses.replace(error, line=None, message=f"{error.message} (from --set {override})")
    return error


TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list"}


def _is_type_tag(part) -> bool:
    """Union members pydantic adds to an error location (e.g. "literal['all']", "list[int]")."""
    if not isinstance(part, str):
        return False
    return part in TYPE_TAGS or "[" in part or part.startswith(("function-", "literal", "union"))


def _merge_same_key(errors: list[RecipeError]) -> list[RecipeError]:
    """One error per key: a union's alternatives become one message."""
    merged: dict[str | None, RecipeError] = {}
    for error in errors:
        first = merged.get(error.key)
        if first is None:
            merged[error.key] = error
        elif error.message not in first.message:
            first.message = f"{first.message}; or {error.message[0].lower()}{error.message[1:]}"
            first.fix = _description_of((error.key or "").split(".")) or first.fix
    return list(merged.values())


def _model_at(loc: list, item: dict):
    model: Any = Recipe
    for part in loc:
        if model is None:
            return None
        if part == "method":
            if loc[1:2] == ["rewards"] and len(loc) == 3:  # a [[method.rewards]] table: the model of its kind
                tags = [p for p in item["loc"][4:5] if p in REWARD_MODELS]
                return REWARD_MODELS[tags[0]] if tags else None
            if loc[1:] == ["adapter"]:
                tags = [p for p in item["loc"][3:4] if p in ADAPTER_CHOICES]
                return METHOD_MODELS[tags[0]] if tags else LoraMethod
            return METHOD_MODELS.get(_method_kind_of(item), LoraMethod) if len(loc) == 1 else None
        if isinstance(part, int):  # an item of a list of tables ([[dataset.sources]])
            continue
        field = model.model_fields.get(str(part)) if hasattr(model, "model_fields") else None
        if field is None:
            return None
        model = _item_model(field.annotation)
    return model


def _item_model(annotation):
    """A field's model: its type, or a list's item type."""
    if get_origin(annotation) is list:
        annotation = get_args(annotation)[0]
    return annotation if isinstance(annotation, type) else None


def _method_kind_of(item: dict) -> str:
    loc = item["loc"]
    if len(loc) >= 2 and loc[0] == "method" and loc[1] in METHOD_KINDS:
        return loc[1]
    return "lora"


def _description_of(loc: list) -> str | None:
    model: Any = Recipe
    for index, part in enumerate(loc):
        if part == "method" and index + 2 < len(loc) and loc[index + 1] == "adapter":
            info = QloraMethod.model_fields.get(str(loc[index + 2]))
            return f"expected: {info.description}" if info and info.description else None
        if part == "method" and index + 1 < len(loc):
            for candidate in METHOD_MODELS.values():
                if str(loc[index + 1]) in candidate.model_fields:
                    info = candidate.model_fields[str(loc[index + 1])]
                    return f"expected: {info.description}"
            return None
        if isinstance(part, int):
            continue
        fields = getattr(model, "model_fields", {})
        info = fields.get(str(part))
        if info is None:
            return None
        if index == len(loc) - 1:
            return f"expected: {info.description}" if info.description else None
        model = _item_model(info.annotation) or info.annotation
    return None


METHOD_MODELS = {
    cls.model_fields["kind"].default: cls
    for cls in (
        PretrainMethod, SftMethod, LoraMethod, QloraMethod, DoraMethod, PrefixMethod,
        PromptMethod, PtuningMethod, Ia3Method, AdapterMethod, LlamaAdapterMethod, *PREFERENCE_MODELS,
        *RL_MODELS, DistillMethod,
    )
}


def parse_recipe(text: str, file: str = "<recipe>") -> Recipe:
    """Parse and validate recipe TOML text. Raises RecipeError with file/line/key/fix."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise RecipeError(
            message=f"not valid TOML: {exc}",
            file=file,
            line=int(match.group(1)) if match else None,
            fix="check quotes, brackets and '=' on that line",
        ) from None
    return recipe_from_dict(data, text=text, file=file)


def recipe_from_dict(data: dict, text: str = "", file: str = "<recipe>", overrides: list[str] | None = None) -> Recipe:
    """Validate; each error names its file line, or the --set (`overrides`) that gave the bad value."""
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        unique = _merge_same_key([_blame_override(_error_for(item, text, file), overrides or [])
                                  for item in exc.errors()])
        if len(unique) == 1:
            raise unique[0] from None
        raise RecipeErrors(unique) from None


def read_recipe_text(path: str | Path) -> str:
    """A recipe file's text, or a clear error (missing, a folder, too big, not UTF-8)."""
    path = Path(path)
    file = str(path)
    if not path.exists():
        raise RecipeError(message="file not found", file=file, fix="check the path, or list recipes/")
    if path.is_dir():
        raise RecipeError(message="is a folder, not a recipe file", file=file, fix="pass a .toml file")
    raw = path.read_bytes()
    if len(raw) > 1_000_000:
        raise RecipeError(message="file is over 1 MB; not a recipe", file=file, fix="pass a recipe .toml")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise RecipeError(
            message="not UTF-8 text", file=file, line=line, fix="save the file as UTF-8"
        ) from None


def read_recipe_data(path: str | Path, overrides: list[str] | None = None) -> tuple[dict, str]:
    """A recipe file's TOML as a dict with `key.path=value` overrides applied, and its text
    (for line numbers in errors); not validated yet."""
    text = read_recipe_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        parse_recipe(text, str(path))  # raises the TOML error with its file and line
        raise
    for override in overrides or []:
        apply_override(data, override)
    return data, text


def require_model(data: dict, text: str, file: str) -> None:
    """A recipe file must name its base model: without a [model] table (or its name) the schema's
    default would silently train the bundled test model. Recipes built in code keep the default."""
    model = data.get("model")
    if isinstance(model, dict) and "name" in model:
        return
    missing = "its name" if isinstance(model, dict) else "a [model] table"
    raise RecipeError(
        message=f"missing: {missing} naming the base model to train",
        file=file, key="model.name",
        line=key_line(text, ("model",)) if isinstance(model, dict) else None,
        fix='add\n  [model]\n  name = "tiny"\n(the bundled test model), or a local HF model folder, a hub id '
            "such as 'Qwen/Qwen2.5-0.5B', or 'run:NAME' for an earlier run's final model; "
            "or pass --set model.name=...",
    )


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read a recipe file, apply `key.path=value` overrides, validate."""
    data, text = read_recipe_data(path, overrides)
    recipe = parse_recipe(text, str(path)) if not overrides else \
        recipe_from_dict(data, text=text, file=str(path), overrides=overrides)
    require_model(data, text, str(path))
    return recipe


def apply_override(data: dict, override: str) -> None:
    """Apply one `a.b.c=value` override in place; the value is parsed as TOML when it can be."""
    if "=" not in override:
        raise RecipeError(
            message=f"bad --set '{override}'", key=None, fix="write it as key.path=value, e.g. train.max_steps=10"
        )
    key, _, value = override.partition("=")
    parts = _override_parts(key)
    if not parts:
        raise RecipeError(message=f"bad --set '{override}'", fix="write it as key.path=value")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    node = data
    for index, part in enumerate(parts[:-1]):
        if isinstance(node, list):  # an array of tables: dataset.sources.0.weight
            node = _list_item(node, part, key)
            continue
        child = node.setdefault(part, {})
        if not isinstance(child, (dict, list)) or (isinstance(child, list) and not parts[index + 1].isdigit()):
            what = "a list: name an item by its index, e.g. dataset.sources.0.weight" if isinstance(child, list) \
                else "not a table"
            raise RecipeError(message=f"--set {key}: '{part}' is {what}", key=key, fix="check the key path")
        node = child
    if isinstance(node, list):
        raise RecipeError(message=f"--set {key}: the last part names a list item, not a key", key=key,
                          fix="name a key of the item, e.g. dataset.sources.0.weight")
    node[parts[-1]] = parsed


def _override_parts(key: str) -> list[str]:
    """`a.b.c` of a `--set a.b.c=value`, as its parts."""
    return [p.strip() for p in key.strip().split(".") if p.strip()]


def _list_item(items: list, part: str, key: str) -> dict:
    """The table at index `part` of an array of tables, for `--set` and sweep keys."""
    if not part.isdigit() or int(part) >= len(items) or not isinstance(items[int(part)], dict):
        raise RecipeError(message=f"--set {key}: no item {part} (the list has {len(items)})", key=key,
                          fix=f"use an index from 0 to {len(items) - 1}" if items else "add the tables first")
    return items[int(part)]


def json_schema() -> dict:
    """JSON Schema of a recipe file: `method` and its `kind` are required (in Python the method
    models default their kind, so that LoraMethod() works; a file must name it)."""
    schema = Recipe.model_json_schema()
    for ref in schema["properties"]["method"]["discriminator"]["mapping"].values():
        definition = schema["$defs"][ref.rsplit("/", 1)[-1]]
        definition["required"] = ["kind", *[k for k in definition.get("required", []) if k != "kind"]]
    return schema


def packing_enabled(recipe: Recipe) -> bool:
    """Whether batches are packed; 'auto' packs where the method keeps examples apart.
    Preference pairs are never packed (each batch holds chosen and rejected side by side)."""
    if recipe.train.packing == "auto" or has_adapter_table(recipe.method.kind):  # pairs, prompts, teacher rows
        return METHODS[recipe.method.kind].packs
    return bool(recipe.train.packing)


def tokens_per_batch(recipe: Recipe) -> int:
    """The token budget of a micro batch under batching 'tokens'."""
    train = recipe.train
    return train.tokens_per_batch or (train.micro_batch if isinstance(train.micro_batch, int) else 1) \
        * train.max_seq_len


def batching_label(recipe_dict: dict | None) -> str:
    """'examples' or 'tokens (N per micro batch)' from a run's recorded recipe (run.json's recipe)."""
    train = (recipe_dict or {}).get("train") or {}
    if train.get("batching") != "tokens":
        return "examples"
    budget = train.get("tokens_per_batch") or (train.get("micro_batch") if isinstance(train.get("micro_batch"), int)
                                               else 1) * (train.get("max_seq_len") or 0)
    return f"tokens ({budget} per micro batch)"


FILL_HINT_BELOW = 0.6  # a packed run's steps under this share of their token room: batching 'tokens' pays
# (the H200's 1 B SFT held 45 % on the median step; filled, it trained 1.5x the tokens/s: bench/GPU_RESULTS.md)


def batch_fill_hint(recipe_dict: dict | None, step_tokens: list[int], world: int) -> str | None:
    """Said of a finished or running packed run that batches examples: how full its median step was, when
    under FILL_HINT_BELOW, and the setting that fills it; None otherwise."""
    recipe_dict = recipe_dict or {}
    train, kind = recipe_dict.get("train") or {}, (recipe_dict.get("method") or {}).get("kind")
    micro, seq, accum = train.get("micro_batch"), train.get("max_seq_len"), train.get("grad_accum") or 1
    packs = kind in METHODS and METHODS[kind].packs and not trains_on_text(kind) and train.get("packing") is not False
    if (train.get("batching", "examples") != "examples" or not packs or not isinstance(micro, int)
            or not isinstance(seq, int) or not step_tokens or world < 1 or (train.get("sequence_parallel") or 1) > 1):
        return None
    room = micro * seq * accum * world
    fill = sorted(step_tokens)[len(step_tokens) // 2] / room
    if fill >= FILL_HINT_BELOW:
        return None
    return (f"steps held {fill:.0%} of their room ({micro} x {seq} tokens a micro batch; the median step):\n"
            'train.batching = "tokens" fills each micro batch (1.5x the tokens/s on an H200)')


def uses_adapter(recipe: Recipe) -> bool:
    return recipe.method.kind in ADAPTER_KINDS or getattr(recipe.method, "adapter", None) is not None


def weights_method(method):
    """The method model that says which weights train: a preference method's adapter, every
    weight (an `sft` model) for a preference method without one, else the method itself."""
    if not has_adapter_table(method.kind):
        return method
    return method.adapter if method.adapter is not None else SftMethod()
