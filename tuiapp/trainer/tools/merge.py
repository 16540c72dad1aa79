"""`llmtui merge`'s tensor side: several runs' models merged into one folder.

    python -m tuiapp.trainer.tools.merge PLAN_JSON --out DIR

The plan (tuiapp.core.after.merging) was checked before this starts. LoRA adapters are combined by peft's
`add_weighted_adapter` on the shared base and saved as one adapter; full weights by peft's
task-arithmetic functions on each tensor's change from the base (linear: the weighted mean of the
weights themselves). The folder gets the tokenizer and an llmtui.json that names the merged runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from tuiapp.core.common import trainer_tools
from tuiapp.trainer.models.model import FINAL_INFO, keep_sentencepiece
from tuiapp.trainer.tools.quiet import quiet_libraries


def merge_adapters(plan: dict, out: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(plan["base_model"], dtype=torch.float32)
    names = [f"run{i}" for i in range(len(plan["finals"]))]
    model = PeftModel.from_pretrained(base, plan["finals"][0], adapter_name=names[0])
    for name, final in zip(names[1:], plan["finals"][1:], strict=True):
        model.load_adapter(final, adapter_name=name)
    extra = {"density": plan["density"]} if plan["method"] in ("ties", "dare_linear", "dare_ties") else {}
    model.add_weighted_adapter(names, plan["weights"], "merged", combination_type=plan["method"], **extra)
    model.set_adapter("merged")
    for name in names:
        model.delete_adapter(name)
    model.save_pretrained(out, selected_adapters=["merged"])
    nested = out / "merged"  # peft saves a non-default adapter in a subfolder of its name
    if nested.is_dir():
        for item in nested.iterdir():
            item.replace(out / item.name)
        nested.rmdir()


def merge_full(plan: dict, out: Path) -> None:
    from peft.utils import merge_utils
    from transformers import AutoModelForCausalLM

    models = [AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32) for final in plan["finals"]]
    states = [m.state_dict() for m in models]
    weights = torch.tensor(plan["weights"], dtype=torch.float32)
    base = None
    if plan["method"] != "linear":
        base = AutoModelForCausalLM.from_pretrained(plan["base_model"], dtype=torch.float32).state_dict()
    merged = {}
    with torch.no_grad():
        for key, first in states[0].items():
            if not first.is_floating_point():
                merged[key] = first
                continue
            tensors = [state[key] for state in states]
            if base is None:
                merged[key] = sum(w * t for w, t in zip(weights / weights.sum(), tensors, strict=True))
                continue
            tasks = [t - base[key] for t in tensors]  # ties, dare_linear, dare_ties: on the changes
            merged[key] = base[key] + getattr(merge_utils, plan["method"])(tasks, weights, plan["density"])
    models[0].load_state_dict(merged)
    models[0].save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()
    parser = argparse.ArgumentParser(prog=trainer_tools.prog("merge"))
    parser.add_argument("plan", help="the plan as JSON (tuiapp.core.after.merging.MergePlan)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    plan = json.loads(args.plan)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(plan["seed"])  # dare drops a random share of each change
    (merge_adapters if plan["kind"] == "adapter" else merge_full)(plan, out)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(plan["finals"][0]).save_pretrained(out)
    keep_sentencepiece(out, plan["finals"][0], plan["info"].get("base_model"))
    info = {**plan["info"], "merged_from": plan["run_ids"], "merge": {
        "method": plan["method"], "weights": plan["weights"], **({"density": plan["density"]}
                                                                if plan["method"] != "linear" else {})}}
    (out / FINAL_INFO).write_text(json.dumps(info, indent=2))
    # `out` is the hidden work folder that becomes the new run: the CLI names the run, not this folder
    print(f"merged {len(plan['finals'])} runs ({plan['method']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
