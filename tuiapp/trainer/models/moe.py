"""Mixture-of-experts metrics: how evenly the routers spread tokens over the experts.

Forward hooks on each router module count the experts it picks (its top-k indices); each logged
row gets, over the tokens routed since the last row and every MoE layer:
  moe/load_max, moe/load_min   the busiest and idlest expert's share of the routed tokens, relative
                               to an even spread (1.0 = every expert equally busy)
  moe/load_cv                  coefficient of variation of the experts' shares (0 = even)
  moe/load                     each expert's relative share (a list, expert 0 first)
and, when model.router_aux_loss_coef adds the load-balancing loss, moe/aux_loss (its last value).
"""

from __future__ import annotations

import torch
from transformers import TrainerCallback


def name_experts(config, moe: dict | None) -> None:
    """The profile's normalised expert counts also under the names libraries read directly (TRL's
    load-balancing loss reads `config.num_experts`; PhiMoE and Mixtral call it num_local_experts,
    DeepSeek n_routed_experts). Only names the config lacks are added; nothing else changes."""
    if not moe:
        return
    for name, value in (("num_experts", moe["experts"]), ("num_experts_per_tok", moe["active_experts"])):
        try:
            getattr(config, name)
        except AttributeError:
            setattr(config, name, value)


def routers(model) -> list[torch.nn.Module]:
    """The router modules of a mixture-of-experts model (transformers' *TopKRouter / *Router)."""
    return [m for m in model.modules() if type(m).__name__.endswith("Router") and hasattr(m, "weight")]


class ExpertLoad(TrainerCallback):
    def __init__(self, model, num_experts: int):
        self.num_experts = num_experts
        self.counts = torch.zeros(num_experts, dtype=torch.float64)
        self.aux_loss: float | None = None
        self.handles = [r.register_forward_hook(self._count) for r in routers(model)]
        self.handles.append(model.register_forward_hook(self._note_aux_loss))

    def _count(self, module, inputs, output) -> None:
        if not module.training or not isinstance(output, tuple):
            return
        indices = output[-1]
        if not torch.is_tensor(indices) or indices.dtype not in (torch.int64, torch.int32):
            return
        self.counts += torch.bincount(indices.detach().flatten().to("cpu", torch.int64),
                                      minlength=self.num_experts)[: self.num_experts].to(torch.float64)

    def _note_aux_loss(self, module, inputs, outputs) -> None:
        aux = outputs.get("aux_loss") if isinstance(outputs, dict) else getattr(outputs, "aux_loss", None)
        if module.training and torch.is_tensor(aux):
            self.aux_loss = float(aux.detach().float().mean())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:
            return
        total = float(self.counts.sum())
        if total > 0:
            shares = self.counts / total * self.num_experts
            logs["moe/load_max"] = round(float(shares.max()), 4)
            logs["moe/load_min"] = round(float(shares.min()), 4)
            logs["moe/load_cv"] = round(float(shares.std(unbiased=False) / shares.mean()), 4)
            logs["moe/load"] = [round(float(s), 3) for s in shares]
        if self.aux_loss is not None:
            logs["moe/aux_loss"] = round(self.aux_loss, 6)
        self.counts.zero_()

    def on_train_end(self, args, state, control, **kwargs):
        for handle in self.handles:
            handle.remove()
