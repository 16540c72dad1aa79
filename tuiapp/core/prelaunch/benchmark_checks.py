"""`[[eval.benchmarks]]` before launch: the harness is installed, each task resolves (a task YAML
exists and names its task; the demo task is made), the run evaluates at all, and its method is one
whose trainer scores them (sft, pretrain and the adapter methods)."""

from __future__ import annotations

from pathlib import Path

from tuiapp.core.common.errors import UserError
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import is_trl
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.data import bench_tasks


def findings(recipe: Recipe, base_dir: Path) -> list[Finding]:
    benchmarks = recipe.eval.benchmarks
    if not benchmarks:
        return []
    kind = recipe.method.kind
    if is_trl(kind):
        return [Finding("error", "eval.benchmarks", f"benchmarks are scored during sft, pretrain and adapter runs, "
                        f"not {kind}", "remove [[eval.benchmarks]] and score the run after training: llmtui eval "
                        "RUN --benchmark TASK")]
    out = []
    if not bench_tasks.lm_eval_installed():
        out.append(Finding("error", "eval.benchmarks", "benchmarks need lm-evaluation-harness (the lm-eval package), "
                           "which is not installed", bench_tasks.INSTALL_FIX))
    if not recipe.train.eval_steps and not recipe.train.sample_prompts:
        out.append(Finding("error", "train.eval_steps", "benchmarks run at evaluations, and this run has none "
                           "(train.eval_steps = 0)", "set train.eval_steps (the benchmarks also run after the last "
                           "step), or eval.benchmark_at = 'end' with train.eval_steps = the run's length"))
    names: dict[str, int] = {}
    for index, bench in enumerate(benchmarks):
        key = f"eval.benchmarks.{index}.task"
        try:
            task = bench_tasks.resolve(bench.task, base_dir, key=key)
        except UserError as exc:
            out.append(Finding("error", key, (f"{exc.file}: " if exc.file else "") + exc.message, exc.fix))
            continue
        if task.name in names:
            out.append(Finding("error", key, f"task {task.name} is also eval.benchmarks.{names[task.name]}",
                               "keep one table per task"))
        names[task.name] = index
        if task.include is None:
            out.append(Finding("info", key, f"{task.name} comes from lm-eval's registry: its data must already be "
                               "in the local datasets cache (nothing is downloaded)", None))
    return out
