"""`llmtui probe RECIPE`: a few real steps at growing micro-batch sizes; the table and the pick.

The probing rank runs through the DeepSpeed launcher (tuiapp.core.plan.probe plans it); its folder
is kept under the runs folder's .probes/, where `llmtui estimate` finds it for its error line.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

from tuiapp.cli import numbers
from tuiapp.core.common.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, UserError
from tuiapp.core.common.jsonout import error_document, write_document
from tuiapp.core.config.recipe import load_recipe
from tuiapp.core.plan import launcher, probe
from tuiapp.core.prelaunch import door
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store.runs import RunStore

EXIT_NOTHING_FITS = 1  # no size fit under the memory limit


def add_command(add) -> None:
    p = add("probe", cmd_probe, "train a few steps at micro_batch 1, 2, 4, ...; keep the largest that fits")
    p.add_argument("recipe")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe key")
    p.add_argument("--max", type=numbers.count(), default=None, help="largest micro_batch to try (default: train.max_micro_batch)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="memory one rank may use, e.g. 12GB (default: the GPU's memory, or on CPU this "
                   f"machine's memory over the run's ranks; ${probe.DEVICE_MEMORY_ENV} sets it too)")
    p.add_argument("--headroom", type=numbers.fraction(high=0.99), default=None, help="fraction of that memory left free (default: "
                   "train.memory_headroom)")
    p.add_argument("--steps", type=numbers.count(2), default=probe.STEPS, help="steps per size, the first untimed")
    p.add_argument("--json", action="store_true", help="print probe.json instead of the table")


def _wait(child, out_dir: Path, quiet: bool) -> int:
    """Wait for the probing rank, printing each size as it lands; Ctrl-C ends its group."""
    shown = 0
    try:
        while True:
            code = child.poll()
            rows = [r for r in probe.read_rows(out_dir) if "micro_batch" in r]
            for row in rows[shown:]:
                if not quiet:
                    print(f"  micro_batch {row['micro_batch']}: {row['status']}, peak {probe.fmt_gb(row['peak_bytes'])}",
                          flush=True)
            shown = len(rows)
            if code is not None:
                return code
            time.sleep(0.5)
    except KeyboardInterrupt:
        launcher.signal_group(child.pid, signal.SIGTERM)
        child.wait(timeout=30)
        raise


class Refused(UserError):
    """Pre-flight errors: printed as the findings; as JSON the first error and every finding."""

    def __init__(self, findings: list, file: str):
        self.findings = findings
        first = next(f for f in findings if f.level == "error")
        super().__init__(message=first.message, file=file, key=first.key, fix=first.fix)

    def __str__(self) -> str:
        return door.format_findings(self.findings)

    def document(self) -> dict:
        document = error_document(self)
        document["findings"] = [vars(f) for f in self.findings]
        return document


def _checked(args, store: RunStore):
    """The recipe to probe, with its checks passed, and the memory limit; a UserError otherwise."""
    overrides = list(args.set or [])
    if args.max is not None:
        overrides.append(f"train.max_micro_batch={args.max}")
    if args.headroom is not None:
        overrides.append(f"train.memory_headroom={args.headroom}")
    recipe = load_recipe(args.recipe, overrides)
    findings = door.recipe_findings(recipe, store, base_dir=Path.cwd())
    findings += [f for f in probe.rules(recipe.model_copy(update={"train": recipe.train.model_copy(
        update={"micro_batch": "auto"})})) if f.level == "error"]
    if door.has_errors(findings):
        raise Refused(findings, str(args.recipe))
    recipe, _ = door.resolve_recipe(recipe, store)
    cuda = launcher.cuda_device_count()
    limit = probe.parse_bytes(args.memory_limit) if args.memory_limit else probe.default_limit(recipe, cuda)
    return recipe, cuda, limit


def cmd_probe(args) -> int:
    store = RunStore(args.runs_dir)
    try:
        recipe, cuda, limit = _checked(args, store)
    except UserError as exc:
        print(str(exc) if isinstance(exc, Refused) else f"error: {exc}", file=sys.stderr)
        if args.json:  # the one document a --json command prints, errors too
            write_document(sys.stdout, exc.document() if isinstance(exc, Refused) else error_document(exc))
        return EXIT_BAD_INPUT
    out_dir = store.root / probe.PROBES_DIR / (time.strftime("%Y%m%d-%H%M%S") + f"-{recipe.name or 'probe'}")
    out_dir.mkdir(parents=True, exist_ok=True)
    RunDir(out_dir).recipe_toml.write_text(recipe.to_toml(), encoding="utf-8")
    sizes = probe.candidate_sizes(recipe.train.max_micro_batch)
    if not args.json:
        print(f"probing micro_batch {', '.join(map(str, sizes))} on {'cuda' if cuda else 'cpu'}, {args.steps} steps "
              f"each (folder {out_dir})", flush=True)
    started = time.time()
    try:
        with probe.running(recipe, RunDir(out_dir).recipe_toml, out_dir, gpu_id=0 if cuda else None, limit_bytes=limit,
                           steps=args.steps, new_session=True) as child:
            code = _wait(child, out_dir, quiet=args.json)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    result = probe.finish(recipe, out_dir, code, started, base_dir=Path.cwd(), limit_bytes=limit)
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
    else:
        print(probe.format_table(result))
    return EXIT_OK if result.chosen is not None else EXIT_NOTHING_FITS
