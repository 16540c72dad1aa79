"""Bottleneck adapters (Houlsby et al. 2019): d -> m -> d with a residual, after each block's MLP.

peft has no such method, so this is the one hand-written method. The up projection starts at
zero, so the adapted model starts exactly as the base model.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

CONFIG_NAME = "bottleneck_config.json"
WEIGHTS_NAME = "bottleneck_adapter.pt"
KEY = "bottleneck_adapter"


class BottleneckAdapter(nn.Module):
    def __init__(self, hidden_size: int, bottleneck_size: int, dropout: float = 0.0):
        super().__init__()
        self.down = nn.Linear(hidden_size, bottleneck_size)
        self.up = nn.Linear(bottleneck_size, hidden_size)
        self.act = nn.GELU()
        self.dropout = nn.Dropout(dropout)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.up(self.dropout(self.act(self.down(hidden))))


class AdaptedMLP(nn.Module):
    """Wraps a block's MLP so its output goes through the adapter."""

    def __init__(self, mlp: nn.Module, adapter: BottleneckAdapter):
        super().__init__()
        self.mlp = mlp
        self.bottleneck_adapter = adapter

    def forward(self, *args, **kwargs):
        out = self.mlp(*args, **kwargs)
        if isinstance(out, tuple):
            return (self.bottleneck_adapter(out[0]),) + out[1:]
        return self.bottleneck_adapter(out)


def _blocks(model: nn.Module) -> list[nn.Module]:
    for path in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        node = model
        try:
            for part in path.split("."):
                node = getattr(node, part)
        except AttributeError:
            continue
        return list(node)
    raise ValueError("cannot find the transformer blocks of this model for bottleneck adapters")


def add_bottleneck_adapters(model: nn.Module, bottleneck_size: int, dropout: float) -> nn.Module:
    """Freeze the model and insert a trainable adapter after each block's MLP."""
    hidden = model.config.hidden_size
    for param in model.parameters():
        param.requires_grad = False
    reference = next(model.parameters())
    for block in _blocks(model):
        adapter = BottleneckAdapter(hidden, bottleneck_size, dropout).to(reference.device)
        block.mlp = AdaptedMLP(block.mlp, adapter)
    model.bottleneck_config = {"bottleneck_size": bottleneck_size, "dropout": dropout}
    return model


def adapter_state_dict(state_dict: dict) -> dict:
    return {k: v for k, v in state_dict.items() if KEY in k}


def save_bottleneck(output_dir: str | Path, state_dict: dict, config: dict) -> None:
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    torch.save({k: v.detach().cpu() for k, v in adapter_state_dict(state_dict).items()}, output_dir / WEIGHTS_NAME)
    (output_dir / CONFIG_NAME).write_text(json.dumps(config, indent=2))


def load_bottleneck(model: nn.Module, adapter_dir: str | Path) -> nn.Module:
    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / CONFIG_NAME).read_text())
    add_bottleneck_adapters(model, config["bottleneck_size"], config.get("dropout", 0.0))
    weights = torch.load(adapter_dir / WEIGHTS_NAME, map_location="cpu")
    missing = set(weights) - set(model.state_dict())
    if missing:
        raise ValueError(f"adapter weights do not match the model: {sorted(missing)[:3]}")
    model.load_state_dict(weights, strict=False)
    return model
