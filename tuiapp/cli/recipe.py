"""`llmtui validate | estimate | schema | data`: a recipe before any run. Validation and the
memory estimate come from tuiapp.core.prelaunch.door; `data` shows the trainer's own view of the examples
through a torch-side tool (tuiapp.trainer.tools.preview) in a child process."""

from __future__ import annotations

import json
from pathlib import Path

from tuiapp.cli import numbers
from tuiapp.cli.shared import json_document, print_err, trainer_tool
from tuiapp.core.common.errors import EXIT_BAD_INPUT, EXIT_OK, UserError
from tuiapp.core.common.jsonout import error_document
from tuiapp.core.config.recipe import json_schema, load_recipe
from tuiapp.core.prelaunch import door
from tuiapp.core.store.runs import RunStore


def cmd_validate(args) -> int:
    recipe = load_recipe(args.recipe, args.set)
    findings = door.recipe_findings(recipe, RunStore(args.runs_dir), base_dir=Path.cwd())
    print(door.format_findings(findings) or "")
    if door.has_errors(findings):
        return EXIT_BAD_INPUT
    print(f"{args.recipe}: ok ({recipe.method.kind} on {recipe.model.name}, data {recipe.dataset.label})")
    return EXIT_OK


def cmd_schema(args) -> int:
    print(json.dumps(json_schema(), indent=2))
    return EXIT_OK


def cmd_estimate(args) -> int:
    if not args.json:
        recipe = load_recipe(args.recipe, args.set)
        print(door.estimate_report(recipe, RunStore(args.runs_dir), base_dir=Path.cwd(), nodes=args.nodes,
                                     gpus=args.gpus)["text"])
        return EXIT_OK
    return json_document(lambda: door.estimate_report(load_recipe(args.recipe, args.set), RunStore(args.runs_dir),
                                                        base_dir=Path.cwd(), nodes=args.nodes, gpus=args.gpus)["json"])


def cmd_data(args) -> int:
    try:
        load_recipe(args.recipe, args.set)  # validate first: a clear error, no traceback
    except UserError as exc:
        if not args.json:
            raise
        print_err(str(exc))
        print(json.dumps(error_document(exc), indent=2))  # the one document, as the tool would print it
        return EXIT_BAD_INPUT
    argv = [str(args.recipe), "--show", str(args.show)]
    for override in args.set or []:
        argv += ["--set", override]
    if args.json:
        argv.append("--json")
    return trainer_tool("preview", argv)


# ---------------------------------------------------------------- parser


def add_checks(add) -> None:
    """validate, estimate, schema."""
    p = add("validate", cmd_validate, "check a recipe (exit 0 ok, 2 bad)")
    p.add_argument("recipe")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")

    p = add("estimate", cmd_estimate, "memory per GPU for a recipe")
    p.add_argument("recipe")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.add_argument("--gpus", type=numbers.count(), default=None,
                   help="GPUs per node (default: the recipe's launch.gpus_per_node, its hosts' slots or launch.gpus)")
    p.add_argument("--nodes", type=numbers.count(), default=None,
                   help="nodes (default: the recipe's launch.nodes, its hosts, or 1)")
    p.add_argument("--json", action="store_true")

    add("schema", cmd_schema, "print the recipe JSON Schema")


def add_data(add) -> None:
    p = add("data", cmd_data, "show training examples exactly as the trainer sees them")
    p.add_argument("recipe")
    p.add_argument("--show", type=numbers.count(0), default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
