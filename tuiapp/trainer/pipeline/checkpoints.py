"""Checkpoints of a pipeline run, one folder per stage, and their merge into one HF model.

    checkpoints/checkpoint-N/
      trainer_state.json            written last by rank 0: the checkpoint is complete
      config.json, tokenizer files  the whole model's
      stage-K/model.safetensors     stage K's weights under the whole model's names
      stage-K/optimizer.pt, scheduler.pt, rng.pt

Only the first pipeline replica saves (the replicas hold the same weights). A checkpoint is staged
under checkpoints/.staging and renamed into place (tuiapp.trainer.loop.checkpoints.publish).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from tuiapp.core.run_folder.rundir import CHECKPOINT_STATE_JSON
from tuiapp.trainer.loop import checkpoints

STAGE_PREFIX = "stage-"
WEIGHTS = "model.safetensors"
STATE = CHECKPOINT_STATE_JSON


def stage_dir(checkpoint: Path, index: int) -> Path:
    return Path(checkpoint) / f"{STAGE_PREFIX}{index}"


def is_pipeline_folder(folder: Path) -> bool:
    return stage_dir(folder, 0).is_dir()


def stage_folders(folder: Path) -> list[Path]:
    found = sorted((p for p in Path(folder).glob(STAGE_PREFIX + "*") if p.is_dir()),
                   key=lambda p: int(p.name[len(STAGE_PREFIX):]))
    return found


def save_stage(folder: Path, weights: dict, optimizer, scheduler) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(folder / WEIGHTS), metadata={"format": "pt"})
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    torch.save(scheduler.state_dict(), folder / "scheduler.pt")
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    torch.save(rng, folder / "rng.pt")


def load_stage(folder: Path, optimizer, scheduler) -> dict:
    """The stage's weights; the optimizer, scheduler and RNG are restored in place."""
    if not (folder / WEIGHTS).is_file():
        raise RuntimeError(f"{folder} is missing: the checkpoint was saved with fewer pipeline stages; resume "
                           "with the same launch.pipeline_stages")
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu", weights_only=False))
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", map_location="cpu", weights_only=False))
    rng = torch.load(folder / "rng.pt", map_location="cpu", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return load_file(str(folder / WEIGHTS))


def write_state(folder: Path, state: dict) -> None:
    (Path(folder) / STATE).write_text(json.dumps(state, indent=2))


def read_state(folder: Path) -> dict:
    return json.loads((Path(folder) / STATE).read_text())


def merged_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every stage's weights of a pipeline checkpoint in one state dict (the whole model's names)."""
    stages = stage_folders(folder)
    if not stages:
        raise ValueError(f"{folder} holds no {STAGE_PREFIX}K folders: not a pipeline checkpoint")
    weights: dict[str, torch.Tensor] = {}
    for path in stages:
        for name, tensor in load_file(str(path / WEIGHTS)).items():
            weights.setdefault(name, tensor)  # a tied head's copy on the last stage equals the embeddings
    return weights


def whole_model(config, weights: dict[str, torch.Tensor]):
    """A *ForCausalLM built from `config` holding `weights` (all of them, or an error)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict(weights, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = [k for k in result.missing_keys if k not in tied]
    if missing:
        raise ValueError(f"the stages lack {len(missing)} weights of the model (e.g. {missing[0]})")
    model.tie_weights()
    return model


def merge_checkpoint(folder: Path, out: Path) -> Path:
    """A pipeline checkpoint (its stage-K folders, config and tokenizer) as one HF model folder."""
    from transformers import AutoConfig, AutoTokenizer

    folder = Path(folder)
    config = AutoConfig.from_pretrained(folder)
    model = whole_model(config, merged_weights(folder))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    if (folder / "tokenizer_config.json").exists():
        AutoTokenizer.from_pretrained(folder).save_pretrained(out)
    return out


def publish(root: Path, step: int, keep: int) -> Path:
    return checkpoints.publish(root / checkpoints.STAGING, f"checkpoint-{step}", root, keep)
