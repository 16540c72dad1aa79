"""What a base model is, and what each method does on it, decided before launch.

The profile (tuiapp.trainer.models.profile, in its own process: core never imports torch) is read from
the model's config alone and cached by the config's bytes. `plan_model` turns a profile and a
recipe into the decisions the trainer applies (attention kernel, adapter targets) and the
findings preflight prints: a method the architecture cannot take is an error naming what works,
a default chosen for it is said. The trainer calls `plan_model` on the same profile, so the run
does what preflight said.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tuiapp.core.common import trainer_tools
from tuiapp.core.common.built_folder import cache_root
from tuiapp.core.common.errors import RecipeError
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import adapts_experts, is_lora, is_reward_model, peft_of, trains_on_text, virtual_at
from tuiapp.core.config.recipe import CHAT_TEMPLATES, Recipe, packing_enabled
from tuiapp.core.run_folder import events as ev

PROFILE_VERSION = "4"  # 3: expert counts under every family's name; 4: attention_facts (head dim, sliding window, softcap)
PROFILE_TIMEOUT_S = 180.0
CONFIG_FILE = "config.json"
# config sizes that must be positive integers when present
TORCH_VARLEN = "torch_varlen"  # torch's FlashAttention varlen kernels on packed rows (trainer/models/torch_varlen.py)
VARLEN_MAX_HEAD_DIM = 256
SIZE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
             "num_key_value_heads", "n_embd", "n_layer", "n_head", "max_position_embeddings", "n_positions",
             "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "head_dim")


@dataclass(frozen=True)
class ModelProfile:
    """A model's profile (the JSON of tuiapp.trainer.models.profile), with typed access to what is decided on."""

    data: dict = field(repr=False)

    @property
    def model_type(self) -> str:
        return self.data["model_type"]

    @property
    def architecture(self) -> str:
        return self.data["architecture"]

    @property
    def label(self) -> str:
        return f"{self.architecture} ({self.model_type})"

    @property
    def total_parameters(self) -> int:
        return int(self.data["parameters"]["total"])

    @property
    def active_parameters(self) -> int:
        return int(self.data["parameters"]["active"])

    @property
    def roles(self) -> dict[str, list[str]]:
        return self.data.get("roles") or {}

    @property
    def moe(self) -> dict | None:
        return self.data.get("moe")

    @property
    def attention(self) -> list[str]:
        return list(self.data.get("attention") or ["eager"])

    @property
    def attention_facts(self) -> dict:
        """head_dim, sliding_window, softcap: what decides whether a varlen kernel runs the model as it means."""
        return dict(self.data.get("attention_facts") or {})

    @property
    def tokenizer(self) -> dict:
        return self.data.get("tokenizer") or {}

    @property
    def linear_names(self) -> set[str]:
        """Leaf names of the linear layers an adapter may target (not lm_head, not fused experts)."""
        return {n for role in ("attention", "mlp", "router") for n in self.roles.get(role, [])}

    @property
    def expert_parameters(self) -> list[str]:
        return list(self.roles.get("experts", []))


@dataclass
class ModelPlan:
    """What the trainer does on this model for this recipe, and what preflight says about it."""

    attention: str
    findings: list[Finding] = field(default_factory=list)
    lora_targets: list[str] | str = "all-linear"
    ia3_targets: list[str] | None = None
    ia3_feedforward: list[str] | None = None
    experts_implementation: str | None = None  # a mixture of experts: how its experts run
    kernels: dict = field(default_factory=dict)  # what runs, in words: attention, loss (the trainer fills it)

    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "error"]

    def to_event(self) -> dict:
        return {"event": ev.MODEL_PLAN, "attention": self.attention, "lora_targets": self.lora_targets,
                "ia3_targets": self.ia3_targets, "ia3_feedforward": self.ia3_feedforward,
                "experts_implementation": self.experts_implementation, "kernels": self.kernels,
                "notes": [f.message for f in self.findings if f.level != "error"]}


# ---------------------------------------------------------------- reading a profile


def config_problems(folder: Path) -> list[Finding]:
    """config.json read and sanity-checked: valid JSON, an object, positive sizes."""
    path = folder / CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return [Finding("error", "model.name", f"{path} cannot be read ({exc.strerror})", "check the model folder")]
    except ValueError as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if hasattr(exc, "lineno") else ""
        return [Finding("error", "model.name", f"{path} is not valid JSON{where}: {getattr(exc, 'msg', exc)}",
                        "the file is truncated or damaged: download or save the model again")]
    if not isinstance(config, dict):
        return [Finding("error", "model.name", f"{path} holds no JSON object", "download or save the model again")]
    out = []
    for key in SIZE_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            out.append(Finding("error", "model.name", f"{path}: {key} = {value!r} is not a positive whole number",
                               f"fix {key} in config.json (or download the model again)"))
    if "model_type" not in config:
        out.append(Finding("error", "model.name", f"{path} has no model_type, so transformers cannot tell "
                           "the architecture", "download or save the model again (save_pretrained writes it)"))
    return out


def _cache_root() -> Path:
    return cache_root() / "profiles"


def _cache_key(folder: Path, trust_remote_code: bool) -> str:
    digest = hashlib.sha256(f"{PROFILE_VERSION}|{folder.resolve()}|{trust_remote_code}".encode())
    for name in (CONFIG_FILE, "tokenizer_config.json", "tokenizer.json", "chat_template.jinja"):
        try:
            digest.update(name.encode() + (folder / name).read_bytes())
        except OSError:
            digest.update(name.encode() + b"-")
    return digest.hexdigest()[:24]


class ProfileError(Exception):
    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.message, self.fix = message, fix


def cached_profile(folder: Path, *, trust_remote_code: bool = False) -> ModelProfile | None:
    """The profile read_profile made before, from the cache alone (never a subprocess); None if none."""
    try:
        data = json.loads((_cache_root() / f"{_cache_key(folder, trust_remote_code)}.json").read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return None if "error" in data else ModelProfile(data)


def read_profile(folder: Path, *, trust_remote_code: bool = False) -> ModelProfile:
    """The profile of a model folder (config.json and tokenizer), from the cache or a subprocess."""
    cached = _cache_root() / f"{_cache_key(folder, trust_remote_code)}.json"
    try:
        data = json.loads(cached.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = _run_profile(folder, trust_remote_code)
        if data.get("transient"):
            raise ProfileError(data["error"]) from None
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, cached)
    if "error" in data:
        raise ProfileError(data["error"])
    return ModelProfile(data)


def run_profile_of(name: str | Path, trust_remote_code: bool = False) -> dict:
    """The profile trainer tool on `name` (a folder, or 'tiny', which it builds) in its own process,
    uncached: its JSON, or {'error': why}."""
    return _run_profile(name, trust_remote_code)


def _run_profile(folder: str | Path, trust_remote_code: bool) -> dict:
    """The profile trainer tool in its own process: its JSON, or {'error': why}."""
    argv = trainer_tools.argv("profile", [str(folder)])
    if trust_remote_code:
        argv.append("--trust-remote-code")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROFILE_TIMEOUT_S, env=env,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"error": f"reading the model's config took over {PROFILE_TIMEOUT_S:.0f}s", "transient": True}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"the model's config could not be read: {tail[0]}"}


# ---------------------------------------------------------------- decisions


def varlen_misfit(profile: ModelProfile) -> str | None:
    """Why torch's varlen kernel cannot run this model as it means (None: it can)."""
    facts = profile.attention_facts
    head_dim = facts.get("head_dim")
    if head_dim and (head_dim > VARLEN_MAX_HEAD_DIM or head_dim % 8):
        return f"its head dim {head_dim} (the varlen kernel takes multiples of 8 up to {VARLEN_MAX_HEAD_DIM})"
    if facts.get("softcap"):
        return "its attention logit softcapping"
    if facts.get("sliding_window"):
        return f"its sliding window of {facts['sliding_window']} tokens"
    return None


def choose_attention(profile: ModelProfile, requested: str, *, cuda: bool, flash_installed: bool,
                     precision: str, packed: bool = False, varlen_kernel: bool | None = None
                     ) -> tuple[str, list[Finding]]:
    """model.attn_implementation resolved against what the architecture supports.

    'auto' on a CUDA GPU in half precision: flash_attention_2 when flash_attn is installed; else, for
    packed batches, torch's own varlen kernels (TORCH_VARLEN; `varlen_kernel`: they run on this GPU,
    None = on any CUDA GPU) on a model that passes packed boundaries to its attention, or
    flex_attention with a document mask where the varlen kernel cannot run the model (sliding window,
    softcap, head dim); else sdpa, else eager."""
    supported = profile.attention
    key = "model.attn_implementation"
    if requested == TORCH_VARLEN and "flash_attention_2" in supported:  # it takes what flash-attn takes
        return requested, []
    if requested != "auto":
        if requested not in supported:
            best, _ = choose_attention(profile, "auto", cuda=cuda, flash_installed=flash_installed,
                                       precision=precision, packed=packed, varlen_kernel=varlen_kernel)
            return requested, [Finding("error", key, f"{profile.label} does not support {requested} attention "
                                       f"(it supports {', '.join(supported)})",
                                       f"set model.attn_implementation = 'auto' (chooses {best} here)")]
        return requested, []
    half = precision in ("bf16", "fp16", "auto", "fp8") and cuda
    if cuda and flash_installed and half and "flash_attention_2" in supported:
        return "flash_attention_2", []
    varlen_kernel = cuda if varlen_kernel is None else varlen_kernel
    if half and packed and varlen_kernel and "flash_attention_2" in supported:  # it passes cu_seq_lens on
        misfit = varlen_misfit(profile)
        if misfit is None:
            return TORCH_VARLEN, [Finding("info", key, "packed batches run torch's FlashAttention varlen kernels "
                                          f"({TORCH_VARLEN}; flash_attention_2 when flash-attn is installed)")]
        if "flex_attention" in supported:
            return "flex_attention", [Finding("info", key, f"packed batches run flex_attention with a document "
                                              f"mask: torch's varlen kernel cannot take {misfit}")]
    if "sdpa" in supported:
        return "sdpa", []
    return "eager", [Finding("info", key, f"{profile.label} does not support sdpa attention: 'auto' runs eager "
                             "attention (flash_attention_2 on a CUDA GPU with flash_attn installed)")]


def attention_kernel(attention: str, *, cuda: bool, packed: bool) -> str:
    """In words, the kernel an attention implementation runs packed or unpacked batches with."""
    if attention == TORCH_VARLEN:
        return ("torch varlen_attn (FlashAttention varlen kernels) on packed rows" if cuda
                else "sdpa per packed example (torch varlen_attn needs CUDA)")
    if attention.startswith("flash_attention"):
        return f"flash-attn {attention[-1]} varlen kernels" + (" on packed rows" if packed else "")
    if attention == "flex_attention":
        return "flex_attention" + (" with a document mask over packed rows" if packed else "")
    if attention == "sdpa" and packed:
        return "sdpa per packed example" if not cuda else "sdpa with a block-diagonal mask over packed rows"
    return attention


def _adapter_targets(profile: ModelProfile, method, key: str) -> tuple[list[str] | str, list[Finding]]:
    """LoRA targets on this model: names checked against its linears; experts only without dropout."""
    targets = method.target_modules
    experts = profile.expert_parameters
    if targets == "all-linear":
        # peft wraps fused expert weights in a ParamWrapper, which refuses dropout and DoRA
        # peft also moves linears named like the experts' v4 projections onto them: those stay out too
        renamed = set(_expert_names(profile))
        dense = sorted(n for n in profile.roles.get("attention", []) + profile.roles.get("mlp", []) if n not in renamed)
        left = sorted(set(profile.roles.get("mlp", [])) & renamed)
        also = f" (not {', '.join(left)}: peft would move those names onto the fused experts)" if left else ""
        if experts and method.dropout > 0:
            return dense, [Finding("info", f"{key}.target_modules", f"{profile.label} keeps its experts' weights "
                                   f"in fused tensors, which peft adapts only with dropout 0: LoRA goes on the "
                                   f"attention{' and dense MLP' if set(profile.roles.get('mlp', [])) - renamed else ''} "
                                   f"linears ({', '.join(dense)}){also}", f"set {key}.dropout = 0 to adapt the experts too")]
        if experts and not adapts_experts(method.kind):
            return dense, [Finding("info", f"{key}.target_modules", f"{method.kind} cannot adapt the fused expert "
                                   f"weights of {profile.label}: it goes on {', '.join(dense)}{also}",
                                   "use kind = 'lora' to adapt the experts too")]
        return "all-linear", []
    known = profile.linear_names
    unknown = [t for t in targets if t not in known and not any(t.endswith(e.split(".")[-1]) for e in experts)]
    if unknown:
        return targets, [Finding("error", f"{key}.target_modules", f"{', '.join(unknown)} match no linear layer of "
                                 f"{profile.label} (its linears: {', '.join(sorted(known))})",
                                 f"set {key}.target_modules to some of those, or 'all-linear'")]
    onto_experts = [t for t in targets if t in _expert_names(profile) or any(t == e.split(".")[-1] for e in experts)]
    if experts and onto_experts and (method.dropout > 0 or not adapts_experts(method.kind)):
        why = "dropout" if method.dropout > 0 else method.kind
        return targets, [Finding("error", f"{key}.target_modules", f"{', '.join(onto_experts)} on {profile.label} "
                                 f"adapt its fused expert weights, which peft cannot do with {why}",
                                 f"set {key}.dropout = 0 and kind = 'lora', or leave {', '.join(onto_experts)} out")]
    return targets, []


def _expert_names(profile: ModelProfile) -> list[str]:
    return list((profile.data.get("peft") or {}).get("expert_names") or []) if profile.expert_parameters else []


def prefix_findings(profile: ModelProfile, recipe: Recipe) -> list[Finding]:
    """Prefix tuning hands each layer a learned past of one key/value shape, sized as peft reads the
    config: attention whose keys and values come from a latent (MLA), or with other key/value heads
    than peft counts (Falcon's multi-query, named its own way), cannot take it."""
    if virtual_at(recipe.method.kind) != "past":
        return []
    kv = profile.data.get("kv") or {}
    fix = "use method.kind = 'prompt' or 'ptuning' (virtual tokens at the input), or 'lora'"
    if kv.get("latent"):
        return [Finding("error", "method.kind", f"{profile.label} computes its keys and values from a compressed "
                        "latent (multi-head latent attention), which has no per-head past for prefix tuning to "
                        "extend", fix)]
    counted = (profile.data.get("peft") or {}).get("prefix_kv_heads")
    if counted and kv.get("kv_heads") and counted != kv["kv_heads"]:
        layout = "multi-query attention (one key/value head)" if kv["kv_heads"] == 1 else \
            f"{kv['kv_heads']} key/value heads"
        return [Finding("error", "method.kind", f"{profile.label} has {layout}, and peft's prefix tuning would "
                        f"give each layer a past of {counted} heads", fix)]
    return []


def _ia3_targets(profile: ModelProfile, method) -> tuple[list[str] | None, list[str] | None, list[Finding]]:
    key = "method.target_modules"
    known = profile.linear_names
    if method.target_modules != "auto":
        unknown = [t for t in method.target_modules if t not in known]
        if unknown:
            return None, None, [Finding("error", key, f"{', '.join(unknown)} match no linear layer of {profile.label} "
                                        f"(its linears: {', '.join(sorted(known))})",
                                        "set method.target_modules to some of those, or 'auto'")]
        targets = list(method.target_modules)
        mlp = set(profile.roles.get("mlp", []))
        return targets, [t for t in targets if t in mlp], []
    peft = profile.data.get("peft") or {}
    defaults = peft.get("ia3_targets")
    if defaults and all(t.split(".")[-1] in known for t in defaults):
        return None, None, []  # peft's own defaults fit this model
    attention = profile.roles.get("attention", [])
    keys_values = [n for n in attention if n in ("k_proj", "v_proj", "qkv_proj", "query_key_value", "c_attn",
                                                   "key", "value", "Wqkv", "W_pack")]
    mlp = profile.roles.get("mlp", [])
    down = [n for n in mlp if n in ("down_proj", "fc2", "dense_4h_to_h", "w2", "c_proj")][:1]
    if not keys_values:
        return None, None, [Finding("error", "method.kind", f"ia3 finds no key/value projections in {profile.label} "
                                    "to rescale", "set method.target_modules to the model's linears "
                                    "(`llmtui model` lists them), or use method.kind = 'lora'")]
    targets = keys_values + down
    why = "peft has no ia3 defaults for it" if not defaults else "peft's defaults name layers it does not have"
    return targets, down, [Finding("info", key, f"ia3 on {profile.label} rescales {', '.join(targets)} ({why}; "
                                   "chosen from the model's attention and MLP layers)",
                                   "set method.target_modules to choose others")]


def method_findings(profile: ModelProfile, recipe: Recipe) -> tuple[list[Finding], dict]:
    """Errors for a method the architecture cannot take; the adapter targets it gets."""
    method, kind = recipe.method, recipe.method.kind
    out: list[Finding] = []
    chosen: dict = {}
    if peft_of(kind) == "llama_adapter" and not (profile.data.get("peft") or {}).get("llama_adapter"):
        types = ", ".join((profile.data.get("peft") or {}).get("llama_adapter_types") or ["llama", "mistral"])
        out.append(Finding("error", "method.kind", f"llama-adapter (peft's adaption prompt) supports only these "
                           f"model types: {types}; {profile.label} is not one",
                           "use method.kind = 'lora' (or 'ia3', 'prefix') on this model"))
    if is_reward_model(kind) and not profile.data.get("sequence_classification"):
        out.append(Finding("error", "method.kind", f"transformers has no sequence-classification head for "
                           f"{profile.label}, which a reward model needs", "use a base model whose architecture "
                           "has one (Llama, Qwen, Mistral, Gemma, Phi ...), or another method"))
    if peft_of(kind) == "ia3":
        targets, feedforward, found = _ia3_targets(profile, method)
        chosen.update(ia3_targets=targets, ia3_feedforward=feedforward)
        out += found
    adapter = method if is_lora(kind) else getattr(method, "adapter", None)
    if adapter is not None:
        key = "method" if is_lora(kind) else "method.adapter"
        targets, found = _adapter_targets(profile, adapter, key)
        chosen["lora_targets"] = targets
        out += found
    return out, chosen


# Architectures whose positions are a learned table of context_length rows: a longer sequence has no row
# to look up (IndexError in the rank), unlike rotary or ALiBi positions.
LEARNED_POSITIONS = frozenset({"gpt2", "gpt_bigcode", "gpt_neo", "opt", "biogpt"})


def context_findings(profile: ModelProfile, recipe: Recipe) -> list[Finding]:
    """train.max_seq_len beyond a learned position table is an error before launch."""
    context = profile.data.get("context_length")
    if profile.model_type not in LEARNED_POSITIONS or not context or recipe.train.max_seq_len <= int(context):
        return []
    return [Finding("error", "train.max_seq_len", f"train.max_seq_len = {recipe.train.max_seq_len} is longer than "
                    f"{profile.label}'s {context} learned positions", f"set train.max_seq_len = {context} or less")]


def template_findings(profile: ModelProfile, recipe: Recipe) -> list[Finding]:
    """A chat method on a tokenizer without a chat template needs dataset.template; pad tokens said."""
    tok = profile.tokenizer
    out: list[Finding] = []
    if not tok or "error" in tok:
        return out
    chat = not trains_on_text(recipe.method.kind)
    if chat and recipe.dataset.template == "model" and not tok.get("chat_template"):
        out.append(Finding("error", "dataset.template", f"the tokenizer of {profile.label} has no chat template, "
                           f"which {recipe.method.kind} needs to render conversations",
                           "set dataset.template to one of " + ", ".join(t for t in CHAT_TEMPLATES if t != "model")
                           + " (the format the model should learn)"))
    if tok.get("pad_token") is None:
        out.append(Finding("info", None, f"the tokenizer has no pad token: its EOS ({tok.get('eos_token')}) "
                           "pads batches; padding is masked out of the loss and each answer's own EOS stays trained"))
    elif tok.get("pad_is_eos"):
        out.append(Finding("info", None, "the tokenizer's pad token is its EOS: padding is masked out of the "
                           "loss by position, so each answer's own EOS stays trained"))
    return out


def plan_model(profile: ModelProfile, recipe: Recipe, *, cuda: bool, flash_installed: bool,
               precision: str | None = None, varlen_kernel: bool | None = None) -> ModelPlan:
    """Every decision about this model for this recipe, with the findings preflight prints."""
    packed = packing_enabled(recipe) and not trains_on_text(recipe.method.kind)  # pretrain: whole blocks, no boundaries
    attention, found = choose_attention(profile, recipe.model.attn_implementation, cuda=cuda,
                                        flash_installed=flash_installed,
                                        precision=precision or recipe.train.precision, packed=packed,
                                        varlen_kernel=varlen_kernel)
    methods, chosen = method_findings(profile, recipe)
    plan = ModelPlan(attention=attention, findings=found + methods + prefix_findings(profile, recipe)
                     + template_findings(profile, recipe) + context_findings(profile, recipe), **chosen)
    plan.kernels = {"attention": attention_kernel(attention, cuda=cuda, packed=packed)}
    if recipe.model.router_aux_loss_coef is not None and not profile.moe:
        plan.findings.append(Finding("error", "model.router_aux_loss_coef", f"{profile.label} is not a mixture of "
                                     "experts: it has no router", "remove model.router_aux_loss_coef"))
    if recipe.model.experts_implementation != "auto" and not profile.moe:
        plan.findings.append(Finding("error", "model.experts_implementation", f"{profile.label} is not a mixture "
                                     "of experts", "set model.experts_implementation = 'auto'"))
    if profile.moe:
        requested = recipe.model.experts_implementation
        plan.experts_implementation = profile.moe.get("experts_implementation") if requested == "auto" else requested
    if profile.moe and recipe.model.router_aux_loss_coef:
        plan.findings.append(Finding("info", "model.router_aux_loss_coef", "the router's load-balancing loss is "
                                     f"added with coefficient {recipe.model.router_aux_loss_coef}; per-expert load "
                                     "is logged as metrics"))
    return plan


def raise_for_errors(plan: ModelPlan) -> None:
    """In the rank: a plan with errors stops the run with the first (preflight refuses these)."""
    for finding in plan.errors():
        raise RecipeError(message=finding.message, key=finding.key, fix=finding.fix or "")
