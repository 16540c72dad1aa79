"""`train.optimizer` inside a rank: each kind as the Trainer gets it.

Kinds transformers knows by an `optim` name (adamw, adamw_8bit, adafactor, schedule_free_adamw,
galore, apollo) go through TrainingArguments (`training_kwargs`); muon and lion are handed to the
Trainer as `optimizer_cls_and_kwargs` (`install`). Under DeepSpeed's engine, Muon is DeepSpeed's
ZeRO-aware Muon (the config's `optimizer` section; every parameter tagged `use_muon`): ZeRO hands
an optimizer flat partitions, which torch's Muon could not orthogonalize.
What cannot run is refused before launch (tuiapp.core.prelaunch.optimizer_checks).
"""

from __future__ import annotations

import math

import torch

from tuiapp.core.config.optimizer import OptimizerSpec
from tuiapp.core.config.recipe import Recipe

OPTIM_NAMES = {  # transformers' `optim` name of each kind it builds itself
    "adamw_8bit": "adamw_bnb_8bit",
    "adafactor": "adafactor",
    "schedule_free_adamw": "schedule_free_adamw",
    "galore": "galore_adamw",
    "apollo": "apollo_adamw",
}


def spec_of(recipe: Recipe) -> OptimizerSpec:
    return recipe.train.optimizer


def training_kwargs(recipe: Recipe) -> dict:
    """TrainingArguments keywords of the recipe's optimizer."""
    spec = spec_of(recipe)
    kwargs: dict = {"adam_beta1": spec.betas[0], "adam_beta2": spec.betas[1], "adam_epsilon": spec.eps}
    if spec.kind in OPTIM_NAMES:
        kwargs["optim"] = OPTIM_NAMES[spec.kind]
    else:  # adamw; muon and lion replace it in install()
        # fused on CUDA and on the CPU (torch's fused CPU kernel, transformers' default: no host read of the
        # step count per parameter); DeepSpeed's optimizer offload steps the states itself
        fused = recipe.launch.offload_optimizer == "none"
        kwargs["optim"] = "adamw_torch_fused" if fused else "adamw_torch"
    if spec.kind in ("galore", "apollo"):
        kwargs["optim_target_modules"] = list(spec.target_modules)
        kwargs["optim_args"] = f"rank={spec.rank},update_proj_gap={spec.update_proj_gap},scale={spec.scale}"
    return kwargs


def deepspeed_section(recipe: Recipe) -> dict | None:
    """The DeepSpeed config's `optimizer` section: DeepSpeed's Muon, or None (the Trainer's own)."""
    spec = spec_of(recipe)
    if spec.kind != "muon":
        return None
    return {"type": "muon", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto",
                                      "momentum": spec.momentum}}


def deepspeed_config(recipe: Recipe, config: dict) -> dict:
    """The run's DeepSpeed config with the optimizer's part: for muon, DeepSpeed's Muon as its
    `optimizer` section, and under ZeRO-3 no reduce-scatter of the gradients (DeepSpeed's stage 3
    refuses Muon with it: Muon orthogonalizes each whole gradient, not a scattered piece)."""
    section = deepspeed_section(recipe)
    if section is None:
        return config
    config = {**config, "optimizer": section}
    zero = dict(config.get("zero_optimization") or {})
    if zero.get("stage") == 3:
        zero["reduce_scatter"] = False
        config["zero_optimization"] = zero
    return config


# ---------------------------------------------------------------- muon


def muon_names(model) -> set[str]:
    """Parameters Muon steps: the 2-D weights inside the blocks. Embeddings, the output head
    (tied or not), norms and biases go to AdamW, as Muon's authors prescribe."""
    skip: set[int] = set()
    for get in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, get, lambda: None)()
        if module is not None and getattr(module, "weight", None) is not None:
            skip.add(id(module.weight))
    return {name for name, p in model.named_parameters()
            if p.requires_grad and p.ndim == 2 and id(p) not in skip and "embed" not in name and "lm_head" not in name}


def tag_muon(model) -> int:
    """Tag every parameter with `use_muon` (what DeepSpeed's Muon reads); the count tagged True."""
    chosen = muon_names(model)
    for name, p in model.named_parameters():
        p.use_muon = name in chosen
    return len(chosen)


class MuonWithAdamW(torch.optim.Optimizer):
    """torch's Muon on the groups marked `use_muon`, torch's AdamW on the others, as one optimizer
    (one set of param groups for the LR schedule, one state dict for checkpoints). Each step runs
    AdamW's and Muon's own step code over their own groups."""

    def __init__(self, groups: list[dict], *, lr: float, betas, eps: float, momentum: float, ns_steps: int,
                 lr_scale: float):
        probe = torch.zeros(2, 2)
        adam = torch.optim.AdamW([probe], lr=lr, betas=tuple(betas), eps=eps, foreach=False).defaults
        muon = torch.optim.Muon([probe], lr=lr * lr_scale, momentum=momentum, ns_steps=ns_steps,
                                adjust_lr_fn="match_rms_adamw").defaults
        param_groups = []
        for group in groups:
            use_muon = group.pop("use_muon")
            base = dict(muon if use_muon else adam)
            base.update(group)
            if use_muon:
                base["lr"] = lr * lr_scale
            base["use_muon"] = use_muon
            param_groups.append(base)
        super().__init__(param_groups, {**muon, **adam})

    def _init_group(self, group, *args):  # what AdamW's and Muon's step code call on self
        owner = torch.optim.Muon if group["use_muon"] else torch.optim.AdamW
        return owner._init_group(self, group, *args)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        groups = self.param_groups
        try:
            self.param_groups = [g for g in groups if not g["use_muon"]]
            if self.param_groups:
                torch.optim.AdamW.step(self)
        finally:
            self.param_groups = groups
        for group in groups:
            if group["use_muon"]:
                self._muon_step(group)
        return loss

    def _muon_step(self, group: dict) -> None:
        """torch's single-tensor Muon step (momentum, Nesterov, Newton-Schulz, decoupled decay,
        the update scaled to AdamW's RMS), with Newton-Schulz in fp32 off CUDA: torch runs it in
        bf16, which a CPU without bf16 units computes ~100x slower than fp32."""
        lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            buf.lerp_(p.grad, 1 - momentum)
            update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
            update = orthogonalize(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
            rows, cols = p.shape[:2]
            p.mul_(1 - lr * decay)
            p.add_(update.to(p.dtype), alpha=-lr * 0.2 * math.sqrt(max(rows, cols)))  # match_rms_adamw


def orthogonalize(grad: torch.Tensor, coefficients, steps: int, eps: float) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration (as torch.optim.Muon), bf16 on CUDA, fp32 elsewhere."""
    a, b, c = coefficients
    x = grad.to(torch.bfloat16 if grad.is_cuda else torch.float32, copy=True)
    tall = grad.size(0) > grad.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class MuonFactory:
    """What the Trainer calls with the model (transformers' optimizer factories): the model tells
    which weights are Muon's."""

    def __call__(self, model, *, lr, weight_decay, decay_names, **kwargs):
        chosen = muon_names(model)
        groups: dict[tuple[bool, bool], list] = {}
        for name, p in model.named_parameters():
            if p.requires_grad:
                groups.setdefault((name in chosen, name in decay_names), []).append(p)
        param_groups = [{"params": params, "use_muon": muon, "weight_decay": weight_decay if decay else 0.0}
                        for (muon, decay), params in groups.items()]
        return MuonWithAdamW(param_groups, lr=lr, **kwargs)


def install(trainer, recipe: Recipe) -> None:
    """Hand the Trainer the optimizer transformers has no `optim` name for (muon, lion)."""
    spec, args = spec_of(recipe), trainer.args
    if spec.kind == "muon":
        if getattr(trainer, "is_deepspeed_enabled", False):
            tag_muon(trainer.model)
            _deepspeed_muon_lr(trainer, spec)
            return
        decay = set(trainer.get_decay_parameter_names(trainer.model))
        trainer.optimizer_cls_and_kwargs = (MuonFactory, dict(
            lr=args.learning_rate, weight_decay=args.weight_decay, decay_names=decay, betas=spec.betas,
            eps=spec.eps, momentum=spec.momentum, ns_steps=spec.ns_steps, lr_scale=spec.lr_scale))
    elif spec.kind == "lion":
        from lion_pytorch import Lion

        trainer.optimizer_cls_and_kwargs = (Lion, dict(lr=args.learning_rate, betas=tuple(spec.betas),
                                                       weight_decay=args.weight_decay))


def _deepspeed_muon_lr(trainer, spec: OptimizerSpec) -> None:
    """DeepSpeed's Muon scales updates by sqrt(max(1, rows/cols)) (Muon's original rule), not to
    AdamW's RMS: its `muon_lr` is the AdamW-tuned rate times 0.2 * sqrt(hidden size), the factor
    torch's match_rms_adamw gives a square hidden matrix."""
    config = getattr(trainer.args, "hf_deepspeed_config", None)
    section = config.config.get("optimizer") if config is not None else None
    if not section:
        return
    hidden = int(getattr(trainer.model.config, "hidden_size", 0) or 1)
    section["params"]["muon_lr"] = trainer.args.learning_rate * spec.lr_scale * 0.2 * math.sqrt(hidden)


def _chain(optimizer) -> list:
    """An optimizer and the ones it wraps, outermost first (accelerate's wrapper, DeepSpeed's ZeRO
    optimizer: each holds the next as `.optimizer`); the last owns the state."""
    chain = []
    while optimizer is not None and all(optimizer is not seen for seen in chain) \
            and hasattr(optimizer, "param_groups"):
        chain.append(optimizer)
        optimizer = getattr(optimizer, "optimizer", None)
    return chain


def describe(optimizer) -> dict:
    """What steps the weights, for the run's first_step event: the class that owns the state (its
    module and name), the wrappers around it, outermost first, and this rank's state bytes."""
    chain = _chain(optimizer)
    if not chain:
        return {}
    inner = chain[-1]
    return {"optimizer": f"{type(inner).__module__}.{type(inner).__qualname__}",
            "optimizer_wrappers": [type(o).__name__ for o in chain[:-1]],
            "optimizer_state_bytes": state_bytes(inner)}


def logged_lr(optimizer, scheduler, lr: float) -> float:
    """The rate of the first group Muon does not step (AdamW's), when groups are marked `use_muon`;
    else `lr` (the Trainer's: the first group's)."""
    groups = getattr(optimizer, "param_groups", None) or []
    if not any(group.get("use_muon") for group in groups):
        return lr
    try:
        rates = scheduler.get_last_lr()
    except (AttributeError, AssertionError):  # no scheduler yet, or it has not stepped
        rates = [group["lr"] for group in groups]
    for group, rate in zip(groups, rates, strict=False):
        if not group.get("use_muon"):
            return float(rate.item() if torch.is_tensor(rate) else rate)
    return lr


def state_bytes(optimizer) -> int:
    """Bytes of every tensor in an optimizer's state (what the estimate predicts), under its wrappers:
    each parameter's state tensors, and those an object in it holds (GaLore's projector keeps its
    projection matrix so), a tensor two parameters share counted once (bitsandbytes hands every
    parameter the same quantization map)."""
    inner = (_chain(optimizer) or [optimizer])[-1]
    seen: set[tuple[int, int]] = set()
    total = 0

    def count(value) -> None:
        nonlocal total
        key = (value.data_ptr(), value.numel() * value.element_size())
        if key not in seen:
            seen.add(key)
            total += value.numel() * value.element_size()

    for state in getattr(inner, "state", {}).values():
        for value in state.values():
            if torch.is_tensor(value):
                count(value)
            elif hasattr(value, "__dict__"):  # a projector object
                for held in vars(value).values():
                    if torch.is_tensor(held):
                        count(held)
    return total
