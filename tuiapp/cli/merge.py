"""`llmtui merge RUN_A RUN_B ... --name NAME`: several runs' models merged into a new run.

The runs are checked before any work (tuiapp.core.after.merging); the tensors are merged in a child process
(tuiapp.trainer.tools.merge) into a hidden folder of the runs folder, and only a finished merge becomes a run:
a failed one leaves nothing behind."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from tuiapp.cli import numbers
from tuiapp.cli.shared import trainer_tool
from tuiapp.core.after import merging
from tuiapp.core.common.errors import EXIT_OK, RunError
from tuiapp.core.config.recipe import load_recipe
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store.runs import RunStore


def cmd_merge(args) -> int:
    store = RunStore(args.runs_dir)
    runs = [store.get(run_id) for run_id in args.runs]
    weights = [float(w) for w in args.weights.split(",")] if args.weights else None
    plan = merging.plan_merge(runs, args.method, weights, args.density, args.seed)
    work = Path(tempfile.mkdtemp(prefix=".merging-", dir=store.root))
    try:
        code = trainer_tool("merge", [plan.to_json(), "--out", str(RunDir(work).final)])
        if code != 0:
            raise RunError(message=f"the merge failed (exit {code}); no run was made", fix="see the output above")
        recipe = load_recipe(runs[0].dir.recipe_toml).model_copy(update={"name": args.name})
        run = store.create(recipe, model_ref=runs[0].record.model_ref)
        RunDir(work).final.replace(run.final_path)
        now = time.time()
        run.record.set(status="succeeded", started=now, ended=now, merged_from=plan.run_ids,
                       merge={"method": plan.method, "weights": plan.weights,
                              **({"density": plan.density} if plan.method in merging.NEEDS_DENSITY else {})})
        run.save()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{run.id}: {plan.method} merge of {', '.join(plan.run_ids)} (weights "
          f"{', '.join(f'{w:g}' for w in plan.weights)}); chat, eval and export take it like any run")
    return EXIT_OK


def add_command(add) -> None:
    p = add("merge", cmd_merge, "merge several runs' LoRA adapters or full weights into a new run")
    p.add_argument("runs", nargs="+", metavar="RUN", help="two runs or more, fine-tuned from the same base model")
    p.add_argument("--name", required=True, help="the new run's name")
    p.add_argument("--method", default="linear", choices=sorted(set(merging.ADAPTER_METHODS + merging.FULL_METHODS)),
                   help="linear (weighted mean), cat (LoRA: the adapters side by side), ties, dare_linear, dare_ties "
                   "(on the changes from the base; --density of each change kept)")
    p.add_argument("--weights", default="", metavar="W,W,...", help="one weight per run (default: equal)")
    p.add_argument("--density", type=numbers.fraction(low_open=True), default=0.5, help="ties/dare: the fraction of each change kept")
    p.add_argument("--seed", type=numbers.count(0), default=0, help="dare's random drop")
