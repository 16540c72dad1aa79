"""`llmtui runs | show`: what the runs folder holds, a table of runs (filtered by tag, sweep,
archive) or one run in full; `--json` for scripts."""

from __future__ import annotations

import json
import sys
import time

from tuiapp.cli import numbers, scale
from tuiapp.cli.shared import print_err
from tuiapp.core.after import judging
from tuiapp.core.common.errors import EXIT_BAD_INPUT, EXIT_OK, UserError
from tuiapp.core.common.jsonout import error_document, write_document
from tuiapp.core.common.methods import is_rl
from tuiapp.core.config.recipe import batch_fill_hint, batching_label
from tuiapp.core.prelaunch import rl
from tuiapp.core.run_folder import (
    benchmarks,
    distill_line,
    events,
    profile_lines,
    provenance,
    reward_health,
    runstate,
    sequence_line,
)
from tuiapp.core.run_folder.metrics import dedupe_steps, source_tokens, source_tokens_text, summarize, train_rows
from tuiapp.core.run_folder.progress import fmt_bytes, fmt_duration, fmt_number, fmt_time, plural, progress_line
from tuiapp.core.run_folder.rundir import attempt_count, duration_s, first_started
from tuiapp.core.store import meta, queue
from tuiapp.core.store.runs import ACTIVE, RunStore

PROFILE_OPS = 15  # show --profile: the ops listed
# how the CLI acts on a flagged status (core.run_folder.runstate's hint says what is wrong)
FLAG_COMMANDS = {
    "orphaned": "`llmtui resume {id}` watches them again (a new supervisor adopts them), `llmtui stop {id}` ends them",
    "stalled": "`llmtui stop {id}` then `llmtui resume {id}`",
    "hung": "`llmtui doctor {id}` shows where it waits",
}


def _row(run) -> dict:
    metrics = run.metrics()
    summary = summarize(metrics)
    record = run.record
    notes = meta.read_meta(run.path)
    trained = dedupe_steps(train_rows(metrics))
    times = [r["time"] for r in trained[-runstate.STALL_WINDOW:] if isinstance(r.get("time"), (int, float))]
    view = runstate.status_of(record, time.time(), times, zero_steps=runstate.zero_steps(trained))
    return {
        "id": run.id,
        "name": notes.get("display_name") or run.name,
        "status": run.status,
        "shown": {"key": view.key, "label": view.label, "short": view.short},  # as the TUI shows the status
        "tags": notes.get("tags") or [],
        "note": notes.get("note") or None,
        "archived": bool(notes.get("archived")),
        "group": record.group,
        "queue_position": queue.position(run.path.parent, run.id) if run.status == "queued" else None,
        "phase": record.phase if run.status == "starting" else None,
        "stalled": f"{view.hint}: {FLAG_COMMANDS[view.key].format(id=run.id)}" if view.flagged else None,
        "method": record.method,
        "model": record.model_ref or record.model,
        "dataset": record.dataset,
        "batching": batching_label(record.recipe),
        "step": summary["step"],
        "max_steps": summary["max_steps"],
        "last_loss": summary["last_loss"],
        "best_eval_loss": None if is_rl(record.method) else summary["best_eval_loss"],  # an RL run's says nothing
        "best_reward_accuracy": summary.get("best_accuracy"),  # preference methods
        "best_reward_margin": summary.get("best_margin"),
        "tokens_per_s": summary["tokens_per_s"],
        "peak_mem": summary["peak_mem"],
        "duration_s": duration_s(record),
        "started": first_started(record),
        "attempts": attempt_count(record),
        "reason": record.reason,
        "error": record.error,
    }


def cmd_runs(args) -> int:
    runs = RunStore(args.runs_dir).list()
    rows = [row for row in (_row(r) for r in runs) if matches(row, args)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print(_nothing_shown(runs, args))
        return EXIT_OK
    header = f"{'ID':<40} {'STATUS':<14} {'METHOD':<13} {'STEP':>11} {'LOSS':>8} {'TOK/S':>8} {'MEM':>8} {'TIME':>7}"
    print(header)
    for row in rows:
        step = f"{fmt_number(row['step'], '.0f')}/{fmt_number(row['max_steps'], '.0f')}"
        status = row["shown"]["short"] + ("!" if row["stalled"] else "")
        print(
            f"{row['id'][:40]:<40} {status:<14} {str(row['method']):<13} {step:>11} "
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
        print_err(str(exc))
        write_document(sys.stdout, error_document(exc))  # the one document of a --json command, errors too
        return EXIT_BAD_INPUT
    row = _row(run)
    rows = dedupe_steps(train_rows(run.metrics()))
    if args.json:
        print(json.dumps(_show_document(run, row, rows), indent=2, default=str))
        return EXIT_OK
    _print_show(run, row, rows, profile=getattr(args, "profile", False))
    if getattr(args, "generations", None):
        print_generations(run.path, args.generations)
    return EXIT_OK


def _show_document(run, row: dict, rows: list[dict]) -> dict:
    """`show --json`: the record, its summary row and what was measured."""
    return {"run": run.record.to_json(), "summary": row, "metrics_rows": len(rows),
            "source_tokens": source_tokens(rows[-1]) if rows else {},
            "benchmarks": benchmarks.latest_scores(run.metrics()), "bench_eval": benchmarks.latest(run.path),
            "provenance": provenance.read(run.path), "profile": profile_lines.read(run.path)}


def _step_tokens(rows: list[dict]) -> list[float]:
    """Tokens a step between each two logged rows (their running totals apart, over the steps between)."""
    marks = [(r["step"], r["tokens"]) for r in rows if isinstance(r.get("tokens"), (int, float))]
    return [(b - a) / (s1 - s0) for (s0, a), (s1, b) in zip(marks, marks[1:], strict=False) if s1 > s0]


def _world_size(run) -> int:
    started = [e for e in run.events() if events.kind(e) == events.STARTED]
    return started[-1].get("world_size") or 0 if started else 0


def _print_show(run, row: dict, rows: list[dict], profile: bool = False) -> None:
    print(f"{run.id}  [{run.status}]  {run.record.method} on {row['model']}  data {row['dataset']}")
    print(f"  path      {run.path}")
    print(f"  batching  {row['batching']}")
    hint = batch_fill_hint(run.record.recipe, _step_tokens(rows), _world_size(run))
    for line in (hint or "").splitlines():
        print(f"            {line}")
    attempts = f"   attempts {row['attempts']}" if row["attempts"] > 1 else ""
    print(f"  started   {fmt_time(row['started'])}   duration {fmt_duration(row['duration_s'])}{attempts}")
    if row["phase"]:
        print(f"  phase     {row['phase']} (since {fmt_duration(time.time() - (run.record.phase_since or time.time()))})")
    if rows:
        print(f"  progress  {progress_line(rows[-1], rows, eta=run.status in ACTIVE)}")
        if source_tokens_text(rows[-1]):  # a mixture: each source's tokens so far
            print(f"  sources   {source_tokens_text(rows[-1])}")
    if not is_rl(run.record.method):  # an RL run's eval loss says nothing: its held-out reward follows
        print(f"  best eval {fmt_number(row['best_eval_loss'], '.4f')}")
    if row["best_reward_accuracy"] is not None:
        print(f"  rewards   best accuracy {fmt_number(row['best_reward_accuracy'], '.3f')} · "
              f"best margin {fmt_number(row['best_reward_margin'], '.3f')}")
    _print_online_rewards(run, rows)
    for line in distill_line.show_lines(run.metrics()):  # distill: kl, ce, top-1 agreement, held out
        print(line)
    for line in scale.show_lines(run):  # strategy, nodes, SLURM job
        print(line)
    for line in sequence_line.show_lines(run.path):  # train.sequence_parallel: degree, per-rank sequence
        print(line)
    for line in profile_lines.show_lines(run.path, ops=PROFILE_OPS if profile else 0):  # train.profile_steps
        print(line)
    if run.record.trust_remote_code:
        print("  trust_remote_code = true (the model's own code runs)")
    if row["stalled"]:
        print(f"  ! {row['stalled']}")
    if run.record.reason:
        print("  reason    " + str(run.record.reason).replace("\n", "\n            "))
    if run.final_path.is_dir():
        print(f"  final     {run.final_path}")
    for line in bench_lines(run):
        print(line)
    for line in provenance.lines(provenance.read(run.path)):
        print(line)


def _print_online_rewards(run, rows: list[dict]) -> None:
    """grpo/rloo: rewards and completion length, first step -> last; the task's reward; hacking signs."""
    online = rl.reward_summary(rows)
    if online:
        print(f"  rewards   {online}")
        headline = reward_health.component_summary(rows, run.record.recipe)  # the task's reward first
        if headline:
            print(f"  primary   {headline}")
        held_out = reward_health.held_out_summary(run.metrics(), run.record.recipe)  # eval rows: held-out prompts
        if held_out:
            print(f"  held out  {held_out}")
        for line in reward_health.hacking_lines(rows, run.record.recipe, run.path):
            print(("  ! " if not line.startswith(" ") else "    ") + line.strip())


def bench_lines(run) -> list[str]:
    """The benchmarks scored while training (the last evaluation's) and the latest `llmtui eval --benchmark`."""
    out = []
    during = benchmarks.latest_scores(run.metrics())
    for task, metrics in during.items():
        out.append(f"  bench     {task}: " + ", ".join(f"{m} {v:.4f}" for m, v in metrics.items()) + " (last eval)")
    after = benchmarks.latest(run.path)
    if after:
        out.append("  bench     llmtui eval --benchmark:")
        out += ["    " + line for line in benchmarks.table(after)]
    judged = judging.results(run.path)
    if judged:
        first, *rest = judging.summary_lines(judged[-1])
        out += [f"  judge     {first}", *(f"          {line}" for line in rest)]
    return out


def print_generations(run_dir, steps: int, width: int = 100) -> None:
    """The last `steps` steps of completions.jsonl, drawn as the Generations pane draws them."""
    from tuiapp.core.run_folder.completions import parse_generation
    from tuiapp.ui.generations import GenerationBrowser, generation_lines

    browser = GenerationBrowser(max_steps=max(1, steps))
    browser.add([g for g in map(parse_generation, reward_health.latest_generations(run_dir)) if g is not None])
    if not browser.keys:
        print("  generations: none logged (method.log_completions = false writes none)")
        return
    for key in browser.keys[-steps:]:
        browser.picked = key
        print()
        for line in generation_lines(browser, width):
            print("  " + line.plain)


def _nothing_shown(runs: list, args) -> str:
    """Why `llmtui runs` lists nothing: an empty folder, or filters no run matches (archived runs hidden)."""
    root = RunStore(args.runs_dir).root
    if not runs:
        return f"no runs in {root}"
    asked = [f"--{name} {getattr(args, name)}" for name in ("tag", "group") if getattr(args, name, None)]
    if getattr(args, "archived", False):
        asked.append("--archived")
    if asked:
        return f"no run in {root} matches {' '.join(asked)} ({plural(len(runs), 'run')} in all: `llmtui runs --all`)"
    return f"no runs to show in {root}: {plural(len(runs), 'archived run')} (`llmtui runs --archived`)"


def matches(row: dict, args) -> bool:
    """`llmtui runs` filters: archived runs are hidden unless asked for."""
    if getattr(args, "archived", False) != bool(row.get("archived")) and not getattr(args, "all", False):
        return False
    if getattr(args, "tag", None) and args.tag not in (row.get("tags") or []):
        return False
    if getattr(args, "group", None) and (row.get("group") or {}).get("id") != args.group:
        return False
    return True


# ---------------------------------------------------------------- parser


def add_list(add) -> None:
    p = add("runs", cmd_runs, "list runs (archived ones only with --archived or --all)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--tag", default=None, help="only runs with this tag")
    p.add_argument("--group", default=None, help="only the runs of this sweep")
    p.add_argument("--archived", action="store_true", help="only archived runs")
    p.add_argument("--all", action="store_true", help="archived runs too")


def add_show(add) -> None:
    p = add("show", cmd_show, "show one run")
    p.add_argument("run")
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", action="store_true", help="train.profile_steps: the profiled steps' top ops, "
                   "their calls, time and share of the steps' wall time")
    p.add_argument("--generations", nargs="?", const=1, type=numbers.count(), metavar="STEPS",
                   help="grpo/rloo: the last STEPS logged steps' generations (default 1), each rollout's turns "
                        "(model, tool call, tool result), rewards and advantage, as the run view's Generations pane")
