"""`llmtui eval RUN --benchmark`: lm-evaluation-harness on a run's final model, its checkpoints and its
base, after training; the scoring is the rank's own (tuiapp/trainer/loop/benchmarks.py).

    python -m tuiapp.trainer.tools.benchmarks RUN_DIR --task T [--task T2] --out FILE [--limit N]
        [--num-fewshot K] [--chat-template] [--checkpoints final|all] [--base]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tuiapp.core.after.targets import checkpoints as checkpoint_steps
from tuiapp.core.after.targets import model_target
from tuiapp.core.common import trainer_tools
from tuiapp.core.common.errors import UserError
from tuiapp.core.config.recipe import BenchmarkSpec
from tuiapp.core.run_folder import benchmarks as bench_results
from tuiapp.trainer.loop.benchmarks import score


def _evaluate(args) -> dict:
    from tuiapp.trainer.tools import inference

    specs = [BenchmarkSpec(task=t, limit=args.limit, num_fewshot=args.num_fewshot, chat_template=args.chat_template)
             for t in args.task]
    recipe = inference.frozen_recipe(args.run_dir)
    checkpoints: list[int | None] = [args.checkpoint]
    if args.checkpoints == "all":
        checkpoints = [*checkpoint_steps(args.run_dir), None]
    result: dict = {"time": time.time(), "tasks": args.task, "limit": args.limit, "num_fewshot": args.num_fewshot,
                    "chat_template": args.chat_template, "models": []}
    targets = [("tuned", c) for c in checkpoints] + ([("base", None)] if args.base else [])
    for name, checkpoint in targets:
        target = model_target(args.run_dir, checkpoint, purpose="be evaluated")
        loaded = inference.load(name, target, recipe.model.trust_remote_code)
        label = "base" if name == "base" else target.label
        print(f"{label}: loaded in {loaded.load_s:.1f}s; benchmarks {', '.join(args.task)}", file=sys.stderr, flush=True)
        scores = score(loaded.model, loaded.tokenizer, specs, Path.cwd())
        step = 0 if name == "base" else checkpoint if checkpoint is not None else bench_results.final_step(args.run_dir)
        result["models"].append({"model": label, "step": step, "scores": scores})
        del loaded
    return result


def main(argv=None) -> int:
    from tuiapp.trainer.tools.quiet import quiet_libraries

    quiet_libraries()
    parser = argparse.ArgumentParser(prog=trainer_tools.prog("benchmarks"))
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--task", action="append", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--num-fewshot", type=int, default=0)
    parser.add_argument("--chat-template", action="store_true")
    parser.add_argument("--checkpoints", choices=("final", "all"), default="final")
    parser.add_argument("--checkpoint", type=int, default=None)
    parser.add_argument("--base", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = _evaluate(args)
    except UserError as exc:
        print(f"error: {exc}" + (f"\n  fix: {exc.fix}" if exc.fix else ""), file=sys.stderr)
        return 2
    bench_results.write(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
