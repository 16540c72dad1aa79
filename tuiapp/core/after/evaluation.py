"""`llmtui eval` and the TUI's Evaluate: a run's model (and its base) scored on held-out data.
Every check runs here before any work (the model, the data read as training reads it, the
harness when tasks are asked); the scoring itself is the torch-side tool tuiapp.trainer.tools.evaluate
in a child process, which writes its result where core.run_folder.evals reads it."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tuiapp.core.after.targets import model_target, require_base
from tuiapp.core.common.child_tool import ChildTool
from tuiapp.core.common.errors import DatasetError, RunError, UserError
from tuiapp.core.config.recipe import DatasetSpec
from tuiapp.core.data.datasets import load_records, resolve_source
from tuiapp.core.run_folder import evals
from tuiapp.core.store.runs import Run

TOOL = "evaluate"  # trainer_tools.TOOLS
DEFAULT_DATA = "demo:facts-heldout"
HELDOUT = {"demo:facts": "demo:facts-heldout", "demo:shapes": "demo:shapes-heldout",  # a demo -> its held-out split
           "demo:digits": "demo:digits-heldout"}


@dataclass
class EvalRequest:
    data: str = DEFAULT_DATA
    format: str = "auto"
    columns: str = ""  # ROLE=COLUMN,... as the recipe's dataset.columns
    checkpoint: int | None = None
    no_base: bool = False
    limit: int = 0  # first N records only (0 = all)
    gen_limit: int = 50  # records answered for exact match and ROUGE-L
    tasks: str = ""  # lm-evaluation-harness tasks


@dataclass
class EvalPlan:
    run_id: str
    label: str  # the model evaluated: final, checkpoint-N
    records: int
    out: Path  # where the result is written
    argv: list[str]
    data: str

    @property
    def summary(self) -> str:
        return f"evaluating {self.label} of {self.run_id} on {self.data} ({self.records} records)..."


def default_data(run_dir: Path) -> str:
    """What a run is evaluated on when no data is named: the held-out split of the demo it trained
    on (image QA for demo:shapes, 1-or-0 answers for demo:digits; demo:facts-heldout for the other demos). A run that trained on the
    user's own data has none: "" (the demo facts would score something it never learned)."""
    try:
        dataset = Run(Path(run_dir)).recipe().dataset
    except UserError:
        return DEFAULT_DATA
    names = [source.name for source in dataset.sources] or [dataset.name]  # a mixture: its first source leads
    if not all(name.startswith("demo:") for name in names):
        return ""
    return HELDOUT.get(names[0], DEFAULT_DATA)


def no_default_data(run_dir: Path, in_form: bool = False) -> UserError:
    """The error of an evaluation without data for a run that trained on its own data (the CLI's
    words, or the Evaluate form's)."""
    try:
        trained_on = Run(Path(run_dir)).recipe().dataset.label
    except UserError:
        trained_on = "its own data"
    return UserError(message=f"{Path(run_dir).name} trained on {trained_on}: name the held-out data to evaluate on",
                     fix=("type the path of a file" if in_form else "pass --data FILE") + " with records the run "
                     f"did not train on (any format training reads), or {'' if in_form else '--data '}{DEFAULT_DATA} "
                     "for the demo facts")


def parse_columns(text: str) -> dict[str, str]:
    """--columns prompt=question,response=answer (the recipe's dataset.columns)."""
    columns = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        role, sep, column = item.partition("=")
        if not sep or not role.strip() or not column.strip():
            raise UserError(message=f"--columns: '{item}' is not ROLE=COLUMN", fix="e.g. --columns prompt=question,"
                            "response=answer")
        columns[role.strip()] = column.strip()
    return columns


def check_data(name: str, fmt: str, columns: dict[str, str], base_dir: Path | None = None) -> int:
    """The records the evaluation will read (the same reader as training); errors name --data."""
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    spec = DatasetSpec(name=name, format=fmt, columns=columns)
    try:
        if resolve_source(spec, base).kind == "hub":
            raise DatasetError(message=f"'{name}' looks like a hub dataset; eval reads local files and demos",
                               key="--data", fix="save the split as .jsonl (datasets: ds.to_json('eval.jsonl')) "
                               "and pass that file")
        return len(load_records(spec, base))
    except DatasetError as exc:
        raise DatasetError(message=exc.message, file=exc.file, line=exc.line,
                           key=_flag(exc.key), fix=_flag_fix(exc.fix or "") or None) from None


def _flag_fix(fix: str) -> str:
    """A dataset fix in eval's flags: set dataset.format = 'alpaca' is --format alpaca, dataset.columns
    {prompt='q', response='a'} (or prompt='...', response='...') is --columns prompt=q,response=a."""
    fix = fix.replace("{prompt='question', response='answer'}", "prompt=question,response=answer")
    fix = re.sub(r"set dataset\.format = '([^']*)'", r"pass --format \1", fix)
    fix = re.sub(r"(\w+)='([^']*)', (?=\w+=')", r"\1=\2,", fix)  # role='col', role='col' -> role=col,role=col
    fix = re.sub(r"(\w+)='([^']*)'", r"\1=\2", fix)
    fix = fix.replace("set dataset.columns", "pass --columns").replace("in dataset.columns", "with --columns")
    return fix.replace("dataset.format", "--format").replace("dataset.columns", "--columns")


def _flag(key: str | None) -> str | None:
    """The eval flag behind a dataset key (dataset.name is --data, dataset.format --format...)."""
    if not key:
        return None
    return "--data" if key == "dataset.name" else key.replace("dataset.", "--")


def plan(run_dir: Path, request: EvalRequest, base_dir: Path | None = None) -> EvalPlan:
    """Every check, before any work; UserError (RunError, DatasetError) names what to fix."""
    run_dir = Path(run_dir)
    if request.limit < 0 or request.gen_limit < 0:
        raise UserError(message="--limit and --gen-limit count records", fix="use 0 (all / none) or more")
    target = model_target(run_dir, request.checkpoint, purpose="be evaluated")
    if not request.no_base:
        require_base(run_dir.name, target.base, "it is compared with", ", or pass --no-base")
    data = request.data.strip()
    if not data:
        raise UserError(message="no data to evaluate on", key="--data",
                        fix=f"name a local file (.jsonl, .json, .csv, .parquet, .txt), a folder or {DEFAULT_DATA}")
    count = check_data(data, request.format, parse_columns(request.columns), base_dir)
    if request.tasks and importlib.util.find_spec("lm_eval") is None:
        raise UserError(message="--tasks needs lm-evaluation-harness, which is not installed",
                        fix="pip install lm-eval (offline, each task's dataset must also be in the local "
                        "datasets cache), or leave out --tasks")
    out = evals.new_path(run_dir)
    argv = [str(run_dir), "--data", data, "--format", request.format, "--out", str(out),
            "--limit", str(request.limit), "--gen-limit", str(request.gen_limit), "--columns", request.columns]
    if request.checkpoint is not None:
        argv += ["--checkpoint", str(request.checkpoint)]
    if request.no_base:
        argv.append("--no-base")
    if request.tasks:
        argv += ["--tasks", request.tasks]
    return EvalPlan(run_dir.name, target.label, count, out, argv, data)


def tool(planned: EvalPlan) -> ChildTool:
    return ChildTool(TOOL, planned.argv)


def run(planned: EvalPlan, on_line: Callable[[str], None] | None = None, child: ChildTool | None = None) -> dict:
    """The evaluation in a child process; its result (with `path`), or RunError with its reason."""
    outcome = (child or tool(planned)).run(on_line)
    if outcome.cancelled:
        raise RunError(message="the evaluation was cancelled", fix="evaluate again when you want the scores")
    result = evals.read(planned.out) if outcome.code == 0 else None
    if result is None:
        message, fix = outcome.message_and_fix(f"the evaluation failed (exit {outcome.code})", "see the output above")
        raise RunError(message=message, fix=fix)
    return {**result, "path": str(planned.out)}
