"""`llmtui eval RUN --benchmark TASK_OR_YAML`: lm-evaluation-harness tasks scored on a run's final
model (or every checkpoint, `--checkpoints all`) and its base for a baseline, after training. Every
check runs here before any work; the scoring is the benchmarks trainer tool (tuiapp.trainer.tools.benchmarks)
in a child process, which writes runs/<id>/bench/<time>.json (tuiapp.core.run_folder.benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tuiapp.core.after.targets import checkpoints, model_target, require_base
from tuiapp.core.common.child_tool import ChildTool
from tuiapp.core.common.errors import RunError, UserError
from tuiapp.core.data import bench_tasks
from tuiapp.core.run_folder import benchmarks

TOOL = "benchmarks"  # trainer_tools.TOOLS


@dataclass
class BenchRequest:
    tasks: list[str] = field(default_factory=list)
    checkpoints: str = "final"  # final | all
    checkpoint: int | None = None
    no_base: bool = False
    limit: int = 0
    num_fewshot: int = 0
    chat_template: bool = False


@dataclass
class BenchPlan:
    run_id: str
    models: list[str]
    out: Path
    argv: list[str]

    @property
    def summary(self) -> str:
        return f"benchmarks on {', '.join(self.models)} of {self.run_id}..."


def plan(run_dir: Path, request: BenchRequest, base_dir: Path | None = None) -> BenchPlan:
    run_dir = Path(run_dir)
    bench_tasks.require_harness("--benchmark")
    if not request.tasks:
        raise UserError(message="no benchmark named", key="--benchmark", fix=f"--benchmark {bench_tasks.DEMO_TASK} "
                        "(or an lm-eval task name, or a task YAML)")
    if request.limit < 0 or request.num_fewshot < 0:
        raise UserError(message="--limit and --num-fewshot count documents", fix="use 0 or more")
    for task in request.tasks:
        bench_tasks.resolve(task, base_dir, key="--benchmark")
    if request.checkpoints == "all" and request.checkpoint is not None:
        raise UserError(message="--checkpoints all and --checkpoint N do not go together", fix="keep one")
    target = model_target(run_dir, request.checkpoint, purpose="be evaluated")
    models = [target.label]
    if request.checkpoints == "all":
        models = [f"checkpoint-{step}" for step in checkpoints(run_dir)] + models
    if not request.no_base:
        require_base(run_dir.name, target.base, "it is compared with", ", or pass --no-base")
        models.append("base")
    out = benchmarks.new_path(run_dir)
    argv = [str(run_dir), "--out", str(out), "--limit", str(request.limit), "--num-fewshot", str(request.num_fewshot),
            "--checkpoints", request.checkpoints]
    for task in request.tasks:
        argv += ["--task", task]
    if request.checkpoint is not None:
        argv += ["--checkpoint", str(request.checkpoint)]
    if request.chat_template:
        argv.append("--chat-template")
    if not request.no_base:
        argv.append("--base")
    return BenchPlan(run_dir.name, models, out, argv)


def run(planned: BenchPlan, on_line: Callable[[str], None] | None = None) -> dict:
    outcome = ChildTool(TOOL, planned.argv).run(on_line)
    result = benchmarks.read(planned.out) if outcome.code == 0 else None
    if result is None:
        message, fix = outcome.message_and_fix(f"the benchmarks failed (exit {outcome.code})", "see the output above")
        raise RunError(message=message, fix=fix)
    return {**result, "path": str(planned.out)}
