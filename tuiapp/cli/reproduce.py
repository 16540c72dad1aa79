"""`llmtui reproduce RUN`: launch a run's recipe again (as frozen in its folder, every --set applied),
after naming each difference between the environment it was made in (its provenance.json: package
versions, llmtui's revision, Python, OS, machine, the data's fingerprint) and this one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tuiapp.cli.run import follow, plan_or_exit
from tuiapp.core.common.errors import EXIT_OK
from tuiapp.core.config.recipe import load_recipe
from tuiapp.core.lifecycle import service
from tuiapp.core.run_folder import provenance
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store import environment
from tuiapp.core.store.runs import RunStore


def _say(line: str) -> None:
    print(line, flush=True)


def differences(run_dir: Path) -> tuple[list[str], Path]:
    """Each mismatch between the run's recorded environment and this one, and the folder the run was
    launched from (its relative data paths start there; the current one when it is gone)."""
    recorded = provenance.read(run_dir)
    recipe = load_recipe(RunDir(run_dir).recipe_toml)
    base = Path.cwd()
    if recorded and isinstance(recorded.get("cwd"), str) and Path(recorded["cwd"]).is_dir():
        base = Path(recorded["cwd"])
    return provenance.mismatches(recorded, environment.collect(recipe, [], base)), base


def cmd_reproduce(args) -> int:
    store = RunStore(args.runs_dir)
    source = store.get(args.run)
    recorded = provenance.read(source.path) or {}
    warnings, base = differences(source.path)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr, flush=True)
    if not warnings:
        print(f"environment: as {source.id} was made (versions, machine, data)", flush=True)
    if base.resolve() != Path.cwd().resolve():
        print(f"launching from {base}, where {source.id} was launched", flush=True)
        os.chdir(base)
    recipe = load_recipe(source.dir.recipe_toml)
    options = service.LaunchOptions(recipe_file=source.record.recipe_file or str(source.dir.recipe_toml),
                                    overrides=list(recorded.get("overrides") or []), runs_dir=args.runs_dir)
    plan, code = plan_or_exit(recipe, store, base, options, args.dry_run)
    if plan is None:
        return code
    run = service.launch(plan, store, say=_say)
    print(f"reproducing {source.id} as {run.id}", flush=True)
    if args.detach:
        print(f"detached; follow with `llmtui show {run.id}`")
        return EXIT_OK
    return follow(run, store)


def add_command(add) -> None:
    p = add("reproduce", cmd_reproduce, "launch a run's recipe again, warning on each difference of the environment")
    p.add_argument("run")
    p.add_argument("--dry-run", action="store_true", help="the warnings and the command; create nothing")
    p.add_argument("--detach", action="store_true", help="return at once; the run goes on")
