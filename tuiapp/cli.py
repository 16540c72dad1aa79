"""`llmtui`: the command line. Subcommands call tuiapp.core; the bare command opens the TUI.

This process never imports torch, transformers, deepspeed or textual (the TUI is imported
lazily, and commands that need torch run it in a child process).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuiapp import cli_scale
from tuiapp.core import checks, launcher
from tuiapp.core.errors import UserError
from tuiapp.core.metrics import JsonlReader, dedupe_steps, train_rows
from tuiapp.core.progress import fmt_bytes, fmt_duration, fmt_number, fmt_time, progress_line
from tuiapp.core.recipe import json_schema, load_recipe
from tuiapp.core.runs import FINAL, RunStore

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
OUTCOME_EXIT = {"succeeded": EXIT_OK, "failed": EXIT_FAILED, "stopped": EXIT_INTERRUPTED}


def _print_err(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)


# ------------------------------------------------------------------ commands


def cmd_validate(args) -> int:
    recipe = load_recipe(args.recipe, args.set)
    findings = checks.static_findings(recipe, RunStore(args.runs_dir), base_dir=Path.cwd())
    print(checks.format_findings(findings) or "")
    if checks.has_errors(findings):
        return EXIT_BAD_INPUT
    print(f"{args.recipe}: ok ({recipe.method.kind} on {recipe.model.name}, data {recipe.dataset.name})")
    return EXIT_OK


def cmd_schema(args) -> int:
    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


def cmd_estimate(args) -> int:
    recipe = load_recipe(args.recipe, args.set)
    report = checks.estimate_report(recipe, RunStore(args.runs_dir), base_dir=Path.cwd(), nodes=args.nodes, gpus=args.gpus)
    if args.json:
        print(json.dumps(report["json"], indent=2))
    else:
        print(report["text"])
    return EXIT_OK


def cmd_run(args) -> int:
    store = RunStore(args.runs_dir)
    recipe = load_recipe(args.recipe, args.set)
    recipe, model_ref = checks.resolve_recipe(recipe, store)
    if cli_scale.wanted(args, recipe):  # multi-node, SLURM, fsdp/ddp: docs/scale-out.md
        return cli_scale.cmd_run(args, recipe, model_ref, store, follow)
    findings = checks.before_launch(recipe, store, base_dir=Path.cwd())
    text = checks.format_findings(findings)
    if text:
        print(text, file=sys.stderr)
    if checks.has_errors(findings):
        return EXIT_BAD_INPUT
    ranks, gpu_ids = launcher.plan_ranks(recipe.launch, launcher.cuda_device_count())
    port = recipe.launch.master_port or launcher.free_port()
    if args.dry_run:
        argv = launcher.deepspeed_argv(Path(store.root) / "<run-id>", ranks, gpu_ids, port)
        print("would run: " + " ".join(str(a) for a in argv))
        print("dry run: nothing was created")
        return EXIT_OK
    run = store.create(recipe, recipe_file=str(args.recipe))
    if model_ref != recipe.model.name:
        run.update(model_ref=model_ref)
    argv = launcher.deepspeed_argv(run.path, ranks, gpu_ids, port)
    print(f"run {run.id} in {run.path}")
    print("command: " + " ".join(str(a) for a in argv))
    launcher.start(run, port=port)
    if args.detach:
        print(f"detached; follow with `llmtui show {run.id}`, stop with `llmtui stop {run.id}`")
        return EXIT_OK
    return follow(run, store)


def follow(run, store) -> int:
    """Print progress lines until the run ends; Ctrl-C stops the run cleanly."""
    reader = JsonlReader(run.metrics_path)
    rows: list[dict] = []
    interrupted = False

    def on_interrupt(signum, frame):
        nonlocal interrupted
        if interrupted:
            return
        interrupted = True
        print("\nstopping the run (checkpoint, then exit)...", flush=True)
        launcher.stop(run, wait=False)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        while True:
            for row in reader.read_new():
                if row.get("split", "train") == "train" and "step" in row:
                    rows.append(row)
                    print(progress_line(row, rows), flush=True)
            run.load().refresh_truth()
            if run.status in FINAL:
                for row in reader.read_new():
                    if row.get("split") == "eval":
                        print(f"eval step {row.get('step')}: loss {fmt_number(row.get('eval_loss'), '.4f')}")
                break
            time.sleep(0.5)
    finally:
        signal.signal(signal.SIGINT, previous)
    print(f"{run.id}: {run.status}" + (f" — {run.info.get('reason')}" if run.info.get("reason") else ""))
    if run.status == "succeeded":
        print(f"final model: {run.final_path}")
    return OUTCOME_EXIT.get(run.status, EXIT_FAILED)


def _row(run) -> dict:
    summary = run.summary()
    info = run.info
    ended = info.get("ended") or (time.time() if run.status == "running" else None)
    started = info.get("started")
    return {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "stalled": checks.stall_hint(run, summary),
        "method": info.get("method"),
        "model": info.get("model_ref") or info.get("model"),
        "dataset": info.get("dataset"),
        "step": summary["step"],
        "max_steps": summary["max_steps"],
        "last_loss": summary["last_loss"],
        "best_eval_loss": summary["best_eval_loss"],
        "tokens_per_s": summary["tokens_per_s"],
        "peak_mem": summary["peak_mem"],
        "duration_s": (ended - started) if (ended and started) else None,
        "started": started,
        "reason": info.get("reason"),
    }


def cmd_runs(args) -> int:
    runs = RunStore(args.runs_dir).list()
    rows = [_row(r) for r in runs]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print(f"no runs in {RunStore(args.runs_dir).root}")
        return EXIT_OK
    header = f"{'ID':<40} {'STATUS':<10} {'METHOD':<13} {'STEP':>11} {'LOSS':>8} {'TOK/S':>8} {'MEM':>8} {'TIME':>7}"
    print(header)
    for row in rows:
        step = f"{fmt_number(row['step'], '.0f')}/{fmt_number(row['max_steps'], '.0f')}"
        status = row["status"] + ("!" if row["stalled"] else "")
        print(
            f"{row['id'][:40]:<40} {status:<10} {str(row['method']):<13} {step:>11} "
            f"{fmt_number(row['last_loss'], '.4f'):>8} {fmt_number(row['tokens_per_s'], '.0f'):>8} "
            f"{fmt_bytes(row['peak_mem']):>8} {fmt_duration(row['duration_s']):>7}"
        )
        if row["stalled"]:
            print(f"  ! {row['stalled']}")
    return EXIT_OK


def cmd_show(args) -> int:
    store = RunStore(args.runs_dir)
    run = store.get(args.run)
    row = _row(run)
    rows = dedupe_steps(train_rows(run.metrics()))
    if args.json:
        print(json.dumps({"run": run.info, "summary": row, "metrics_rows": len(rows)}, indent=2, default=str))
        return EXIT_OK
    print(f"{run.id}  [{run.status}]  {run.info.get('method')} on {row['model']}  data {row['dataset']}")
    print(f"  path      {run.path}")
    print(f"  started   {fmt_time(row['started'])}   duration {fmt_duration(row['duration_s'])}")
    if rows:
        print(f"  progress  {progress_line(rows[-1], rows)}")
    print(f"  best eval {fmt_number(row['best_eval_loss'], '.4f')}")
    for line in cli_scale.show_lines(run):  # strategy, nodes, SLURM job
        print(line)
    if run.info.get("trust_remote_code"):
        print("  trust_remote_code = true (the model's own code runs)")
    if row["stalled"]:
        print(f"  ! {row['stalled']}")
    if run.info.get("reason"):
        print("  reason    " + str(run.info["reason"]).replace("\n", "\n            "))
    if run.final_path.is_dir():
        print(f"  final     {run.final_path}")
    return EXIT_OK


def cmd_stop(args) -> int:
    run = RunStore(args.runs_dir).get(args.run)
    if run.status not in ("created", "running"):
        print(f"{run.id} is {run.status}; nothing to stop")
        return EXIT_OK
    print(f"stopping {run.id} (checkpoint, then exit; killed after {args.grace:.0f}s)...")
    gone = launcher.stop(run, grace_s=args.grace)
    run.load()
    print(f"{run.id}: {run.status}" + ("" if gone else " (some processes could not be killed)"))
    return EXIT_OK if gone else EXIT_FAILED


def cmd_resume(args) -> int:
    store = RunStore(args.runs_dir)
    run = store.get(args.run)
    scaled = cli_scale.resume(args, run, store, follow)  # SLURM and node-by-node runs
    if scaled is not None:
        return scaled
    if run.status == "running":
        raise UserError(message=f"{run.id} is still running", fix="stop it first, or follow it with `llmtui show`")
    if run.status == "succeeded":
        raise UserError(message=f"{run.id} already succeeded", fix="start a new run instead")
    run.recipe()  # a readable frozen recipe, or a clear error
    run.update(status="created", reason=None)
    print(f"resuming {run.id} from its last complete checkpoint")
    launcher.start(run, resume=True)
    if args.detach:
        return EXIT_OK
    return follow(run, store)


def _trainer_tool(module: str, argv: list[str]) -> int:
    """Run a torch-side tool in a child process, so this process stays free of torch."""
    return subprocess.call([sys.executable, "-m", module, *argv], stdin=subprocess.DEVNULL)


def cmd_data(args) -> int:
    load_recipe(args.recipe, args.set)  # validate first: a clear error, no traceback
    argv = [str(args.recipe), "--show", str(args.show)]
    for override in args.set or []:
        argv += ["--set", override]
    if args.json:
        argv.append("--json")
    return _trainer_tool("tuiapp.trainer.preview", argv)


def cmd_export(args) -> int:
    run = RunStore(args.runs_dir).get(args.run)
    if not run.final_path.is_dir():
        raise UserError(message=f"{run.id} has no final model ({run.status})", fix="export a succeeded run")
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UserError(message=f"{out} exists and is not empty", fix="choose a new folder for --out")
    argv = [str(run.final_path), "--out", str(out)] + (["--merge"] if args.merge else [])
    return _trainer_tool("tuiapp.trainer.export", argv)


def cmd_tui(args) -> int:
    from tuiapp.ui.app import run_app

    return run_app(RunStore(args.runs_dir).root)


# ------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llmtui", description="Train and fine-tune LLMs from the terminal.")
    parser.add_argument("--runs-dir", default=None, help="runs folder (default: $LLMTUI_RUNS_DIR or ./runs)")
    sub = parser.add_subparsers(dest="command")

    def add(name, func, help_text):
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(func=func)
        p.add_argument("--runs-dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return p

    p = add("run", cmd_run, "validate a recipe, create a run and launch it")
    p.add_argument("recipe")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe key")
    p.add_argument("--dry-run", action="store_true", help="validate and print the command; create nothing")
    p.add_argument("--detach", action="store_true", help="return at once; the run goes on")
    cli_scale.add_run_arguments(p)

    p = add("validate", cmd_validate, "check a recipe (exit 0 ok, 2 bad)")
    p.add_argument("recipe")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")

    p = add("estimate", cmd_estimate, "memory per GPU for a recipe")
    p.add_argument("recipe")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.add_argument("--gpus", type=int, default=None, help="GPUs per node (default: from the recipe)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--json", action="store_true")

    add("schema", cmd_schema, "print the recipe JSON Schema")

    p = add("runs", cmd_runs, "list runs")
    p.add_argument("--json", action="store_true")

    p = add("show", cmd_show, "show one run")
    p.add_argument("run")
    p.add_argument("--json", action="store_true")

    p = add("stop", cmd_stop, "stop a run gracefully (checkpoint, then exit)")
    p.add_argument("run")
    p.add_argument("--grace", type=float, default=launcher.STOP_GRACE_S, help="seconds before SIGKILL")

    p = add("resume", cmd_resume, "continue a stopped or failed run from its last checkpoint")
    p.add_argument("run")
    p.add_argument("--detach", action="store_true")
    cli_scale.add_resume_arguments(p)

    p = add("data", cmd_data, "show training examples exactly as the trainer sees them")
    p.add_argument("recipe")
    p.add_argument("--show", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")

    p = add("export", cmd_export, "write a run's adapter or merged model to a folder")
    p.add_argument("run")
    p.add_argument("--out", required=True)
    p.add_argument("--merge", action="store_true", help="merge the adapter into its base model")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "runs_dir", None):
        args.runs_dir = None
    func = getattr(args, "func", cmd_tui)
    try:
        return func(args)
    except UserError as exc:
        _print_err(str(exc))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
