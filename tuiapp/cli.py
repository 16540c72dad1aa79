"""`llmtui`: the command line. Subcommands call tuiapp.core; the bare command opens the TUI.

This process never imports torch, transformers, deepspeed or textual (the TUI is imported
lazily, and commands that need torch run it in a child process).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tuiapp import cli_after, cli_cache, cli_manage, cli_model, cli_probe, cli_scale, cli_serve, cli_ship
from tuiapp.core import checks, launcher, meta, queue, rl, service
from tuiapp.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, UserError, exit_code
from tuiapp.core.jsonout import error_document, stdout_to_stderr, write_document
from tuiapp.core.metrics import JsonlReader, dedupe_steps, train_rows
from tuiapp.core.progress import fmt_bytes, fmt_duration, fmt_number, fmt_time, progress_line
from tuiapp.core.recipe import batching_label, json_schema, load_recipe
from tuiapp.core.rundir import ACTIVE, FINAL, attempt_count, duration_s, first_started, read_phases
from tuiapp.core.runs import RunStore

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
    if not args.json:
        recipe = load_recipe(args.recipe, args.set)
        print(checks.estimate_report(recipe, RunStore(args.runs_dir), base_dir=Path.cwd(), nodes=args.nodes,
                                     gpus=args.gpus)["text"])
        return EXIT_OK
    with stdout_to_stderr() as out:  # one JSON document on stdout, in every state
        try:
            recipe = load_recipe(args.recipe, args.set)
            report = checks.estimate_report(recipe, RunStore(args.runs_dir), base_dir=Path.cwd(), nodes=args.nodes,
                                            gpus=args.gpus)
        except UserError as exc:
            _print_err(str(exc))
            write_document(out, error_document(exc))
            return EXIT_BAD_INPUT
        write_document(out, report["json"])
    return EXIT_OK


def _say(line: str) -> None:
    print(line, flush=True)


def cmd_run(args) -> int:
    store = RunStore(args.runs_dir)
    recipe = load_recipe(args.recipe, args.set)
    options = cli_scale.launch_options(args)
    options.oversubscribe = args.oversubscribe
    if options.node_rank:  # node K joins the run node 0 started
        joining = service.plan_join(recipe, store, Path.cwd(), options, say=_say)
        if args.dry_run:
            print("\n".join(joining.preview()))
            return EXIT_OK
        run = service.join(joining, say=_say)
    else:
        try:
            plan = service.plan_launch(recipe, store, Path.cwd(), options)
        except service.LaunchRefused as exc:
            print(exc, file=sys.stderr)
            return EXIT_BAD_INPUT
        notes = checks.format_findings(plan.findings)
        if notes:
            print(notes, file=sys.stderr)
        if args.dry_run:
            print("\n".join(plan.preview(store.root)))
            print("dry run: nothing was created", file=sys.stderr if plan.mode == "slurm" else sys.stdout)
            return EXIT_OK
        run = service.launch(plan, store, say=_say)
    if args.detach:
        print(f"detached; follow with `llmtui show {run.id}`, stop with `llmtui stop {run.id}`")
        return EXIT_OK
    code = follow(run, store)
    if options.node_rank:
        cli_scale.print_node_outcome(run, options.node_rank)
    return code


def follow(run, store) -> int:
    """Print start-up phases and progress lines until the run ends; Ctrl-C stops the run cleanly."""
    reader = JsonlReader(run.metrics_path)
    events = JsonlReader(run.events_path)  # eval_progress: `eval 120/400` while the ranks evaluate
    rows: list[dict] = []
    interrupted = False
    shown: tuple = ()
    shown_figure: dict | None = None

    def on_interrupt(signum, frame):
        nonlocal interrupted
        if interrupted:
            return
        interrupted = True
        print("\nstopping the run (checkpoint, then exit)...", flush=True)
        service.stop(run, wait=False)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        while True:
            info = run.load().refresh_truth().info
            if run.status == "queued":
                place = queue.position(run.path.parent, run.id)
                if ("queued", place) != shown:
                    shown = ("queued", place)
                    print(f"queued: #{place} in line (`llmtui queue`)" if place else "queued", flush=True)
            if run.status == "starting" and not rows:
                hang = (info.get("hang") or {}).get("message")
                state = (info.get("phase"), hang)
                if state != shown:
                    shown = state
                    phase = info.get("phase") or "launching"
                    if phase == "building ops":  # a cached op loads in a moment; a first launch compiles it
                        phase += " (DeepSpeed's CPU comm op: compiled on the first launch in this Python " \
                                 "environment, 1-2 min, then cached)"
                    print(f"starting: {phase}" + (f" — ! {hang}" if hang else ""), flush=True)
                figure = (read_phases(run.path).get(0) or {}).get("progress")
                if isinstance(figure, dict) and figure.get("total") and figure != shown_figure:
                    shown_figure = figure  # rank 0 tokenizing: documents, throughput, ETA
                    print(f"tokenizing {figure.get('done', 0):,}/{figure['total']:,} docs  "
                          f"{figure.get('docs_per_s') or 0:,.0f} docs/s  {figure.get('mb_per_s') or 0:.1f} MB/s  "
                          f"ETA {fmt_duration(figure.get('eta_s'))}", flush=True)
            for event in events.read_new():
                if event.get("event") == "eval_progress":
                    total = event.get("total")
                    print(f"eval {event.get('done')}/{total if total else '?'}  step {event.get('step')}  "
                          f"{fmt_duration(event.get('elapsed_s'))}", flush=True)
            for row in reader.read_new():
                if row.get("split", "train") == "train" and "step" in row:
                    rows.append(row)
                    print(progress_line(row, rows), flush=True)
                elif row.get("split") == "eval":
                    print(f"eval step {row.get('step')}: loss {fmt_number(row.get('eval_loss'), '.4f')}", flush=True)
            if run.status in FINAL:
                for row in reader.read_new():
                    if row.get("split") == "eval":
                        print(f"eval step {row.get('step')}: loss {fmt_number(row.get('eval_loss'), '.4f')}")
                break
            time.sleep(0.5)
    finally:
        signal.signal(signal.SIGINT, previous)
    bell = "\a" if sys.stdout.isatty() else ""  # the terminal's own notification when the run ends
    print(f"{bell}{run.id}: {run.status}" + (f" — {run.info.get('reason')}" if run.info.get("reason") else ""))
    if run.status == "succeeded":
        print(f"final model: {run.final_path}")
    return OUTCOME_EXIT.get(run.status, EXIT_FAILED)


def _row(run) -> dict:
    summary = run.summary()
    info = run.info
    notes = meta.read_meta(run.path)
    return {
        "id": run.id,
        "name": notes.get("display_name") or run.name,
        "status": run.status,
        "tags": notes.get("tags") or [],
        "note": notes.get("note") or None,
        "archived": bool(notes.get("archived")),
        "group": info.get("group"),
        "queue_position": queue.position(run.path.parent, run.id) if run.status == "queued" else None,
        "phase": info.get("phase") if run.status == "starting" else None,
        "stalled": checks.stall_hint(run, summary),
        "method": info.get("method"),
        "model": info.get("model_ref") or info.get("model"),
        "dataset": info.get("dataset"),
        "batching": batching_label(info.get("recipe")),
        "step": summary["step"],
        "max_steps": summary["max_steps"],
        "last_loss": summary["last_loss"],
        "best_eval_loss": summary["best_eval_loss"],
        "best_reward_accuracy": summary.get("best_accuracy"),  # preference methods
        "best_reward_margin": summary.get("best_margin"),
        "tokens_per_s": summary["tokens_per_s"],
        "peak_mem": summary["peak_mem"],
        "duration_s": duration_s(info),
        "started": first_started(info),
        "attempts": attempt_count(info),
        "reason": info.get("reason"),
        "error": info.get("error"),
    }


def cmd_runs(args) -> int:
    runs = RunStore(args.runs_dir).list()
    rows = [row for row in (_row(r) for r in runs) if cli_manage.matches(row, args)]
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
            + (f" ×{row['attempts']}" if row["attempts"] > 1 else "")
        )
        if row["stalled"]:
            print(f"  ! {row['stalled']}")
        elif row["phase"]:
            print(f"  · {row['phase']}")
        elif row["queue_position"]:
            print(f"  · #{row['queue_position']} in the queue")
        elif row["status"] == "failed" and row["reason"]:
            print(f"  ✗ {str(row['reason']).splitlines()[0][:200]}")
        if row["tags"] or row["note"]:
            print("  " + " ".join(f"#{t}" for t in row["tags"]) + (f"  {row['note'][:100]}" if row["note"] else ""))
    return EXIT_OK


def cmd_show(args) -> int:
    store = RunStore(args.runs_dir)
    try:
        run = store.get(args.run)
    except UserError as exc:
        if not args.json:
            raise
        _print_err(str(exc))
        write_document(sys.stdout, error_document(exc))  # the one document of a --json command, errors too
        return EXIT_BAD_INPUT
    row = _row(run)
    rows = dedupe_steps(train_rows(run.metrics()))
    if args.json:
        print(json.dumps({"run": run.info, "summary": row, "metrics_rows": len(rows)}, indent=2, default=str))
        return EXIT_OK
    print(f"{run.id}  [{run.status}]  {run.info.get('method')} on {row['model']}  data {row['dataset']}")
    print(f"  path      {run.path}")
    print(f"  batching  {row['batching']}")
    attempts = f"   attempts {row['attempts']}" if row["attempts"] > 1 else ""
    print(f"  started   {fmt_time(row['started'])}   duration {fmt_duration(row['duration_s'])}{attempts}")
    if row["phase"]:
        print(f"  phase     {row['phase']} (since {fmt_duration(time.time() - (run.info.get('phase_since') or time.time()))})")
    if rows:
        print(f"  progress  {progress_line(rows[-1], rows)}")
    print(f"  best eval {fmt_number(row['best_eval_loss'], '.4f')}")
    if row["best_reward_accuracy"] is not None:
        print(f"  rewards   best accuracy {fmt_number(row['best_reward_accuracy'], '.3f')} · "
              f"best margin {fmt_number(row['best_reward_margin'], '.3f')}")
    online = rl.reward_summary(rows)  # grpo/rloo: rewards and completion length, first step -> last
    if online:
        print(f"  rewards   {online}")
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
    if run.status not in ACTIVE:
        print(f"{run.id} is {run.status}; nothing to stop")
        return EXIT_OK
    print(f"stopping {run.id} (checkpoint, then exit; killed after {args.grace:.0f}s)...")
    gone = service.stop(run, grace_s=args.grace)
    run.load()
    print(f"{run.id}: {run.status}" + ("" if gone else " (some processes could not be killed)"))
    return EXIT_OK if gone else EXIT_FAILED


def cmd_resume(args) -> int:
    store = RunStore(args.runs_dir)
    run = store.get(args.run)
    options = cli_scale.resume_options(args)
    service.resume(run, options, say=_say)
    if args.detach:
        return EXIT_OK
    code = follow(run, store)
    if options.node_rank:
        cli_scale.print_node_outcome(run, options.node_rank)
    return code


def cmd_doctor(args) -> int:
    from tuiapp.core import doctor

    print(doctor.diagnose(RunStore(args.runs_dir).get(args.run)))
    return EXIT_OK


def _trainer_tool(module: str, argv: list[str]) -> int:
    """Run a torch-side tool in a child process, so this process stays free of torch."""
    return subprocess.call([sys.executable, "-m", module, *argv], stdin=subprocess.DEVNULL)


def cmd_data(args) -> int:
    try:
        load_recipe(args.recipe, args.set)  # validate first: a clear error, no traceback
    except UserError as exc:
        if not args.json:
            raise
        _print_err(str(exc))
        print(json.dumps(error_document(exc), indent=2))  # the one document, as the tool would print it
        return EXIT_BAD_INPUT
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
    argv = [str(run.final_path), "--out", str(out)] + (["--merge"] if args.merge else []) + cli_after.export_argv(args)
    return _trainer_tool("tuiapp.trainer.publish", argv)  # export, then --dtype and --push


def cmd_tui(args) -> int:
    from tuiapp.entry import open_tui

    return open_tui(args.runs_dir)


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
    p.add_argument("--oversubscribe", action="store_true", help="launch even when the memory estimate is over twice "
                   "what this machine has, or launch.gpus asks for more CPU ranks than it has cores")
    cli_manage.add_queue_arguments(p)
    cli_scale.add_run_arguments(p)

    p = add("validate", cmd_validate, "check a recipe (exit 0 ok, 2 bad)")
    p.add_argument("recipe")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")

    p = add("estimate", cmd_estimate, "memory per GPU for a recipe")
    p.add_argument("recipe")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.add_argument("--gpus", type=int, default=None,
                   help="GPUs per node (default: the recipe's launch.gpus_per_node, its hosts' slots or launch.gpus)")
    p.add_argument("--nodes", type=int, default=None,
                   help="nodes (default: the recipe's launch.nodes, its hosts, or 1)")
    p.add_argument("--json", action="store_true")

    add("schema", cmd_schema, "print the recipe JSON Schema")

    p = add("runs", cmd_runs, "list runs (archived ones only with --archived or --all)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--tag", default=None, help="only runs with this tag")
    p.add_argument("--group", default=None, help="only the runs of this sweep")
    p.add_argument("--archived", action="store_true", help="only archived runs")
    p.add_argument("--all", action="store_true", help="archived runs too")

    cli_manage.add_commands(add)

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

    p = add("doctor", cmd_doctor, "every rank's phase, state and Python stack; which rank is behind")
    p.add_argument("run")

    p = add("data", cmd_data, "show training examples exactly as the trainer sees them")
    p.add_argument("recipe")
    p.add_argument("--show", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")

    p = add("export", cmd_export, "write a run's adapter or merged model to a folder")
    p.add_argument("run")
    p.add_argument("--out", required=True)
    p.add_argument("--merge", action="store_true", help="merge the adapter into its base model")
    cli_after.add_export_arguments(p)

    cli_after.add_commands(add)  # chat, eval, export-metrics
    cli_probe.add_command(add)
    cli_cache.add_command(add)  # cache list, prune
    cli_model.add_command(add)
    cli_serve.add_command(add)
    cli_ship.add_commands(add)  # serve
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "runs_dir", None):
        args.runs_dir = None
    func = getattr(args, "func", cmd_tui)
    return exit_code(lambda: func(args))


if __name__ == "__main__":
    sys.exit(main())
