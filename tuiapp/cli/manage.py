"""`llmtui queue | sweep | tag | note | rename | archive | delete | trash`: the experiment manager's
commands. Each calls tuiapp.core (queue, sweep, meta, service) and prints; nothing is decided here."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tuiapp.cli import numbers
from tuiapp.core.common.errors import EXIT_BAD_INPUT, EXIT_OK, RunError, UserError
from tuiapp.core.config import sweep
from tuiapp.core.config.recipe import read_recipe_data
from tuiapp.core.lifecycle import service
from tuiapp.core.run_folder.progress import fmt_duration, plural
from tuiapp.core.store import meta, queue, served
from tuiapp.core.store.runs import Run, RunStore


def add_queue_arguments(p) -> None:
    group = p.add_argument_group("queue (wait for free devices; see `llmtui queue`)")
    group.add_argument("--queue", action="store_true", help="queue the run: it starts when its GPUs (or a CPU slot) "
                       "are free and the runs ahead of it have started")
    group.add_argument("--priority", type=numbers.integer(), default=0, help="higher starts first (default 0)")
    group.add_argument("--slots", type=numbers.count(), default=None, help="runs at once without CUDA (default "
                       f"${queue.SLOTS_ENV} or 1)")


# ---------------------------------------------------------------- queue


def queue_rows(store: RunStore) -> list[dict]:
    now = time.time()
    rows = []
    for position, entry in enumerate(queue.waiting(store.root), start=1):
        run = Run(store.root / entry.run_id).load()
        rows.append({"position": position, "id": entry.run_id, "name": run.name, "priority": entry.priority,
                     "devices": entry.devices, "slots": entry.slots, "waited_s": now - entry.enqueued})
    return rows


def cmd_queue(args) -> int:
    store = RunStore(args.runs_dir)
    if args.action == "move":
        if not args.run:
            raise UserError(message="which run?", fix="llmtui queue move RUN --top|--up|--down|--bottom")
        run = store.get(args.run)
        where = args.where or "top"
        try:
            queue.move(store.root, run.id, where)
        except KeyError:
            raise RunError(message=f"{run.id} is not waiting in the queue ({run.status})",
                           fix="see `llmtui queue`") from None
        print(f"moved {run.id} {where}")
    rows = queue_rows(store)
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("the queue is empty")
    else:
        print(f"{'#':>3} {'ID':<44} {'PRIO':>4} {'DEVICES':>8} {'WAITED':>8}")
    for row in rows:
        devices = ",".join(map(str, row["devices"])) if isinstance(row["devices"], list) else str(row["devices"])
        print(f"{row['position']:>3} {row['id'][:44]:<44} {row['priority']:>4} {devices:>8} "
              f"{fmt_duration(row['waited_s']):>8}")
    for run_id, claim in sorted(served.queue_claims(store.root).items()):  # what they hold, queued runs wait for
        held = f"GPU {','.join(map(str, claim['devices']))}" if claim.get("devices") else "no GPU, no CPU slot"
        others = [r for r in served.read_record(store.root / run_id).get("runs") or [] if r != run_id]
        print(f"served by `llmtui serve`: {run_id}" + (f" with {', '.join(others)} (one server)" if others else "")
              + f" ({held})")
    return EXIT_OK


# ---------------------------------------------------------------- sweep


def cmd_sweep(args) -> int:
    store = RunStore(args.runs_dir)
    data, text = read_recipe_data(args.recipe, args.set)
    plan = sweep.plan_sweep(data, text, str(args.recipe), sweep.parse_grid(args.grid or []), random_n=args.random,
                            seed=args.seed, slots=args.slots, overrides=args.set)
    slots = plan.spec.slots or args.slots or None
    launches, refused = [], []
    for combo in plan.combinations:
        options = service.LaunchOptions(recipe_file=str(args.recipe), queue=True, priority=args.priority, slots=slots)
        try:
            launches.append(service.plan_launch(combo.recipe, store, Path.cwd(), options))
        except service.LaunchRefused as exc:
            shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in combo.values.items())
            refused.append(f"combination {combo.index} ({shown}):\n{exc}")
    if refused:
        print("\n".join(refused), file=sys.stderr)
        print(f"error: {len(refused)} of {len(plan.combinations)} combinations fail pre-flight; nothing was created",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    drawn = f" ({len(plan.combinations)} of {plan.total} drawn at random, seed {plan.spec.seed})" \
        if len(plan.combinations) < plan.total else ""
    print(f"sweep {plan.name}: {len(plan.combinations)} runs{drawn}, varying {', '.join(plan.keys)}")
    print("\n".join(plan.table()))
    if args.dry_run:
        print("dry run: nothing was created")
        return EXIT_OK
    group_id = sweep.new_group_id(plan.name)
    sweep.write_group(store.root, group_id, plan, [])
    ids: list[str] = []
    for combo, launch in zip(plan.combinations, launches, strict=True):
        launch.options.group = {"id": group_id, "name": plan.name, "index": combo.index, "keys": plan.keys,
                                "values": combo.values}
        ids.append(service.launch(launch, store).id)
        sweep.write_group(store.root, group_id, plan, ids)
    print(f"queued {len(ids)} runs as {group_id}; see `llmtui queue` and `llmtui runs --group {group_id}`")
    return EXIT_OK


# ---------------------------------------------------------------- tags, notes, names, archive, delete


def cmd_tag(args) -> int:
    run = RunStore(args.runs_dir).get(args.run)
    if not args.changes:
        raise UserError(message="tag: say which tags to add or remove", fix=f"llmtui tag {run.id} +baseline -old")
    tags = meta.change_tags(run.path, [meta.printable(change, "tag") for change in args.changes])
    print(f"{run.id}: " + (" ".join(tags) if tags else "(no tags)"))
    return EXIT_OK


def cmd_note(args) -> int:
    run = RunStore(args.runs_dir).get(args.run)
    meta.set_note(run.path, "" if args.clear else " ".join(args.text))
    print(f"{run.id}: note " + ("cleared" if args.clear or not args.text else "saved"))
    return EXIT_OK


def cmd_rename(args) -> int:
    run = RunStore(args.runs_dir).get(args.run)
    meta.set_display_name(run.path, args.name)
    print(f"{run.id}: shown as '{args.name}'")
    return EXIT_OK


def cmd_archive(args) -> int:
    store = RunStore(args.runs_dir)
    for ref in args.runs:
        run = store.get(ref)
        meta.set_archived(run.path, not args.undo)
        print(f"{run.id}: {'unarchived' if args.undo else 'archived (hidden from `llmtui runs`; --archived shows it)'}")
    return EXIT_OK


def cmd_delete(args) -> int:
    store = RunStore(args.runs_dir)
    runs = [store.get(ref) for ref in args.runs]
    if not args.yes:
        if not sys.stdin.isatty():
            raise UserError(message="delete asks for confirmation", fix="add --yes to confirm without a terminal")
        answer = input(f"move {plural(len(runs), 'run')} to {meta.trash_dir(store.root)}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing deleted")
            return EXIT_OK
    for run in runs:
        target = meta.delete(run, store.root)
        print(f"{run.id}: moved to {target} (restore with `llmtui trash --restore {target.name}`)")
    purged = meta.purge(store.root)
    if purged:
        print(f"purged {plural(len(purged), 'run')} deleted over {meta.TRASH_DAYS:.0f} days ago")
    return EXIT_OK


def cmd_trash(args) -> int:
    store = RunStore(args.runs_dir)
    if args.restore:
        print(f"restored {meta.restore(args.restore, store.root)}")
        return EXIT_OK
    if args.purge:
        gone = meta.purge(store.root, older_than_days=args.older_than)
        print(f"purged {plural(len(gone), 'run')}")
        return EXIT_OK
    items = meta.trashed(store.root)
    if not items:
        print("the trash is empty")
    for path, deleted in items:
        print(f"{path.name:<48} deleted {fmt_duration(time.time() - deleted)} ago")
    return EXIT_OK


def add_commands(add) -> None:
    p = add("queue", cmd_queue, "queued runs in start order; `queue move RUN --top/--up/--down/--bottom` reorders")
    p.add_argument("action", nargs="?", choices=["list", "move"], default="list")
    p.add_argument("run", nargs="?")
    where = p.add_mutually_exclusive_group()
    for name in ("top", "up", "down", "bottom"):
        where.add_argument(f"--{name}", dest="where", action="store_const", const=name)
    p.add_argument("--json", action="store_true")

    p = add("sweep", cmd_sweep, "queue one run per combination of --grid values (checked before anything exists)")
    p.add_argument("recipe")
    p.add_argument("--grid", action="append", metavar="KEY=V1,V2", help="a recipe key and its values; repeat")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe key for every run")
    p.add_argument("--random", type=numbers.count(), default=None, metavar="N", help="try N combinations drawn at random")
    p.add_argument("--seed", type=numbers.count(0), default=None)
    p.add_argument("--slots", type=numbers.count(), default=None, help="runs at once without CUDA (default 1)")
    p.add_argument("--priority", type=numbers.integer(), default=0)
    p.add_argument("--dry-run", action="store_true", help="print the combinations; create nothing")

    p = add("tag", cmd_tag, "add (+name) or remove (-name) tags")
    p.add_argument("run")
    # REMAINDER: '-name' removes a tag, and argparse would take it for an option
    p.add_argument("changes", nargs=argparse.REMAINDER, metavar="+TAG|-TAG")

    p = add("note", cmd_note, "set a run's note")
    p.add_argument("run")
    p.add_argument("text", nargs="*")
    p.add_argument("--clear", action="store_true")

    p = add("rename", cmd_rename, "set the name a run is shown with (its folder keeps its id)")
    p.add_argument("run")
    p.add_argument("name")

    p = add("archive", cmd_archive, "hide runs from the default history (--undo shows them again)")
    p.add_argument("runs", nargs="+")
    p.add_argument("--undo", action="store_true")

    p = add("delete", cmd_delete, "move finished runs to the trash (never a live run)")
    p.add_argument("runs", nargs="+")
    p.add_argument("--yes", action="store_true", help="do not ask")

    p = add("trash", cmd_trash, "list deleted runs, restore one, or purge them")
    p.add_argument("--restore", metavar="NAME")
    p.add_argument("--purge", action="store_true")
    p.add_argument("--older-than", type=numbers.non_negative(), default=0.0, metavar="DAYS")

