"""`llmtui merge`: what merging several runs' models means, decided before any tensor is read.

Runs merge when they trained the same base model the same way: LoRA adapters (peft's weighted
adapters: linear, cat, ties, dare_linear, dare_ties) or every weight (task arithmetic on the
differences from the base: linear, ties, dare_linear, dare_ties). Anything else is refused here with
the fix. The merge itself is tuiapp.trainer.tools.merge; its output becomes a new run (method and base of
the merged runs, `merged_from` in its run.json) that chat, eval and export take like any other.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from tuiapp.core.common.errors import UserError
from tuiapp.core.common.methods import MERGE_ADAPTER_KINDS, MERGE_FULL_KINDS, from_config, is_reward_model
from tuiapp.core.prelaunch.model_check import require_base
from tuiapp.core.store.runs import Run

ADAPTER_METHODS = ("linear", "cat", "ties", "dare_linear", "dare_ties")
FULL_METHODS = ("linear", "ties", "dare_linear", "dare_ties")
NEEDS_DENSITY = ("ties", "dare_linear", "dare_ties")


@dataclass
class MergePlan:
    method: str
    kind: str  # "adapter" or "full"
    weights: list[float]
    density: float
    seed: int
    base_model: str
    finals: list[str]  # each run's final/ folder
    run_ids: list[str]
    info: dict = field(default_factory=dict)  # the first run's llmtui.json, the merged model's starts from it

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _final_info(run: Run) -> dict:
    if run.status != "succeeded" or not run.final_path.is_dir():
        raise UserError(message=f"{run.id} has no final model ({run.status})", fix="merge succeeded runs")
    path = run.dir.final_info
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UserError(message=f"{path} is missing or unreadable", file=str(path),
                        fix="merge runs trained by llmtui (their final/ holds llmtui.json)") from None


def _adapter_shape(run: Run) -> tuple:
    config = json.loads((run.final_path / "adapter_config.json").read_text(encoding="utf-8"))
    targets = config.get("target_modules")
    return config.get("r"), tuple(sorted(targets)) if isinstance(targets, list) else targets


def plan_merge(runs: list[Run], method: str, weights: list[float] | None, density: float, seed: int) -> MergePlan:
    if len(runs) < 2:
        raise UserError(message="merge takes two runs or more", fix="llmtui merge RUN_A RUN_B --name NAME")
    if len({r.id for r in runs}) != len(runs):
        raise UserError(message="a run is named twice", fix="name each run once")
    infos = [_final_info(run) for run in runs]
    kinds = {info.get("weights", info.get("method")) for info in infos}
    described = ", ".join(f"{run.id}: {info.get('weights', info.get('method'))}" for run, info in zip(runs, infos,
                                                                                                       strict=True))
    if kinds <= MERGE_ADAPTER_KINDS:  # peft's weighted adapters combine LoRA's A and B
        form, methods = "adapter", ADAPTER_METHODS
    elif kinds <= MERGE_FULL_KINDS:
        form, methods = "full", FULL_METHODS
    else:
        raise UserError(message=f"these runs cannot be merged ({described})",
                        fix="merge LoRA adapters with each other, or runs that trained every weight (sft, pretrain) "
                        "with each other")
    if method not in methods:
        raise UserError(message=f"--method {method} is not a merge of {'LoRA adapters' if form == 'adapter' else 'full weights'}",
                        fix=f"use one of {', '.join(methods)}")
    if any(is_reward_model(info.get("method")) for info in infos):
        raise UserError(message="reward models (a score head on the base) are not merged",
                        fix="merge runs whose models generate (sft, the adapter methods, dpo, ...)")
    bases = {str(info.get("base_model")) for info in infos}
    if len(bases) != 1:
        raise UserError(message=f"the runs start from different base models ({', '.join(sorted(bases))})",
                        fix="merge runs fine-tuned from the same base model")
    if form == "adapter" or method != "linear":  # adapters merge on their base; ties/dare take changes from it
        require_base(", ".join(run.id for run in runs), next(iter(bases)), "the merge loads")
    if form == "full" and method != "linear" and any(map(from_config, kinds)):
        raise UserError(message=f"--method {method} merges the changes from the base, and a pretrain run has no "
                        "base it changed", fix="use --method linear for pretrain runs")
    if form == "adapter" and method != "cat" and len({_adapter_shape(run) for run in runs}) != 1:
        shapes = ", ".join(f"{run.id}: rank {_adapter_shape(run)[0]}" for run in runs)
        raise UserError(message=f"--method {method} combines adapters of one rank and the same target modules ({shapes})",
                        fix="use --method cat (concatenates them), or merge adapters trained with the same rank "
                        "and target_modules")
    weights = list(weights) if weights else [1.0 / len(runs)] * len(runs)
    if len(weights) != len(runs) or any(w <= 0 for w in weights):
        raise UserError(message=f"--weights has {len(weights)} values for {len(runs)} runs",
                        fix=f"give one positive weight per run, e.g. --weights {','.join(['0.5'] * len(runs))}")
    if method in NEEDS_DENSITY and not 0 < density <= 1:
        raise UserError(message=f"--density {density} is out of range", fix="use a fraction in (0, 1], e.g. 0.5")
    return MergePlan(method=method, kind=form, weights=weights, density=density, seed=seed, base_model=bases.pop(),
                     finals=[str(run.final_path) for run in runs], run_ids=[run.id for run in runs], info=infos[0])
