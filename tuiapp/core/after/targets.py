"""What model a run offers after training: its final model or checkpoint N, and the base it
started from. Pure: the folders are only looked at, so the CLI and the TUI can refuse a bad
request (no final model, a checkpoint that does not exist, a reward model to chat with) with a
clear error before any torch process starts; `llmtui chat`, `llmtui eval` and the inference
server (tuiapp.trainer.tools.serve) all resolve a run through `model_target`.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import tomllib

from tuiapp.core.common.errors import RunError, UserError
from tuiapp.core.prelaunch.model_check import FINAL_INFO, PEFT_CONFIG, adapter_kind, folder_problems, require_base
from tuiapp.core.run_folder.rundir import ACTIVE, CHECKPOINT_STATE_JSON, RunDir, read_record

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
NO_CHAT = {"reward"}  # a reward model scores answers; it has no language-model head


@dataclass(frozen=True)
class Target:
    """A run's model: `path` holds a full model or an adapter (`kind` 'full', 'peft' or
    'bottleneck') whose base is `base` (a folder, 'tiny' or a hub id)."""

    run_dir: str
    path: str
    label: str  # "final" or "checkpoint-N"
    kind: str  # full | peft | bottleneck
    method: str  # the recipe's method.kind
    base: str  # what the run started from
    step: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def checkpoints(run_dir: Path) -> list[int]:
    """Steps of the run's complete checkpoints (those with a trainer state), oldest first."""
    root = RunDir(run_dir).checkpoints
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        match = CHECKPOINT.match(child.name)
        if match and (child / CHECKPOINT_STATE_JSON).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _frozen_method(run_dir: Path) -> str:
    try:
        recipe = tomllib.loads(RunDir(run_dir).recipe_toml.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return ""
    method = recipe.get("method") or {}
    return str(method.get("kind") or "")


def final_weights(run_dir: Path) -> str:
    """What the run's final model trained: the adapter's kind or 'sft'/'pretrain' for every weight
    (final/llmtui.json's `weights`, which preference runs set), else its method."""
    run_dir = Path(run_dir)
    info = _read_json(RunDir(run_dir).final_info)
    return str(info.get("weights") or info.get("method") or read_record(RunDir(run_dir).record).method
               or _frozen_method(run_dir) or "")


def base_of(run_dir: Path) -> str:
    """The base model a run trained from: final/llmtui.json's resolved path when it still exists,
    else what run.json recorded (a resolved path or 'tiny'), else the recipe's model.name."""
    run_dir = Path(run_dir)
    record = read_record(RunDir(run_dir).record)
    candidates = [_read_json(RunDir(run_dir).final_info).get("base_model"), record.model]
    recipe = record.recipe or {}
    candidates.append((recipe.get("model") or {}).get("name"))
    names = [str(c) for c in candidates if c]
    for name in names:
        if Path(name).is_dir():
            return name
    for name in names:  # 'tiny', a hub id: resolved where the model loads
        if not name.startswith(("/", "run:")) and not Path(name).expanduser().is_absolute():
            return name
    return names[0] if names else "tiny"


def _no_final_fix(status: str, run_id: str) -> str:
    """What to do about a run without final/ and without checkpoints, by where it stands."""
    if status in ACTIVE:
        return f"wait for it to succeed (`llmtui show {run_id}` follows it)"
    if status == "succeeded":  # it had one: the folder was deleted or moved since
        return f"its final/ folder is gone (deleted or moved): put it back, or train it again (`llmtui reproduce {run_id}`)"
    return f"resume it (`llmtui resume {run_id}`), or train it again (`llmtui reproduce {run_id}`)"


def model_target(run_dir: Path, checkpoint: int | None = None, purpose: str = "chat") -> Target:
    """The run's final model, or its checkpoint `checkpoint`; RunError names what is missing."""
    run_dir = Path(run_dir)
    record = read_record(RunDir(run_dir).record)
    run_id = run_dir.name
    method = str(record.method or _frozen_method(run_dir) or "")
    if method in NO_CHAT:
        raise RunError(message=f"{run_id} trained a reward model: it scores answers and cannot {purpose}",
                       fix="pick a run of a generative method (sft, lora, dpo, ...)")
    if checkpoint is None:
        folder, label, step = RunDir(run_dir).final, "final", None
        if not folder.is_dir():
            status = record.status or "unknown"
            saved = checkpoints(run_dir)
            fix = (f"use --checkpoint {saved[-1]} (saved: {', '.join(map(str, saved))})" if saved
                   else _no_final_fix(status, run_id))
            raise RunError(message=f"{run_id} has no final model ({status})", fix=fix)
        step = _read_json(folder / FINAL_INFO).get("step")
    else:
        folder, label, step = RunDir(run_dir).checkpoints / f"checkpoint-{checkpoint}", f"checkpoint-{checkpoint}", checkpoint
        if checkpoint not in checkpoints(run_dir):
            saved = checkpoints(run_dir)
            fix = (f"use one of: {', '.join(map(str, saved))}" if saved
                   else "this run kept no checkpoint (train.save_steps); use its final model (no --checkpoint)")
            raise RunError(message=f"{run_id} has no checkpoint {checkpoint}", fix=fix)
    kind = adapter_kind(folder) or "full"
    if kind == "full":
        problems = folder_problems(folder, label=f"{run_id}/{label}")
        if problems:
            raise RunError(message=problems[0], fix="ZeRO-3 checkpoints hold only shards unless the weights are "
                           "gathered on save; use the final model, or export it first")
    base = base_of(run_dir)
    if kind != "full":
        require_base(run_id, base, "its adapter applies to")
    return Target(str(run_dir), str(folder), label, kind, method, base, step)


def check_shared_base(targets: list) -> None:
    """Several runs served together must be peft adapters of one kind on one base (the base is
    loaded once, each adapter on it): a full model, llmtui's bottleneck adapter, two bases or two
    adapter types are refused before anything starts, naming the run and the fix."""
    apart = "serve them separately, each on its own port: " + "; ".join(
        f"llmtui serve {Path(t.run_dir).name} --port {8001 + i}" for i, t in enumerate(targets))
    names = [Path(t.run_dir).name for t in targets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UserError(message=f"{twice[0]} is named twice", fix="name each run once")
    for target in targets:
        if target.kind != "peft":
            what = "a full model" if target.kind == "full" else f"a {target.kind} adapter (llmtui's own, not peft's)"
            raise UserError(message=f"{Path(target.run_dir).name} ({target.method}) is {what}: several runs are served "
                                    "together only as peft adapters (LoRA...) of one base model", fix=apart)

    def base_key(base: str) -> str:
        return str(Path(base).resolve()) if Path(base).is_dir() else base

    def peft_type(target) -> str:
        try:
            return str(json.loads((Path(target.path) / PEFT_CONFIG).read_text(encoding="utf-8")).get("peft_type"))
        except (OSError, ValueError, AttributeError):
            return "?"

    first = targets[0]
    for target in targets[1:]:
        if base_key(target.base) != base_key(first.base):
            raise UserError(message=f"{Path(first.run_dir).name} trained on {first.base} and {Path(target.run_dir).name} "
                                    f"on {target.base}: one server holds one base model", fix=apart)
        if peft_type(target) != peft_type(first):
            raise UserError(message=f"{Path(first.run_dir).name} is a {peft_type(first)} adapter and "
                                    f"{Path(target.run_dir).name} a {peft_type(target)} one: one server holds "
                                    "adapters of one type", fix=apart)
