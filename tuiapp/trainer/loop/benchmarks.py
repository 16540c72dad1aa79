"""lm-evaluation-harness on a model already loaded: the rank's own model at each evaluation of a
run (`[[eval.benchmarks]]`, the Benchmarks callback), or a run's final model, checkpoints and base
after training (`llmtui eval RUN --benchmark`: tuiapp/trainer/tools/benchmarks.py, the tool).

The model is wrapped in lm-eval's HFLM as it is (no second copy, no reload); the harness's own
seeding is turned off so a run's random state is the same with or without benchmarks. Every rank
scores the same requests in the same order (a ZeRO-3 forward needs all ranks); rank 0 writes.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from transformers import TrainerCallback

from tuiapp.core.common.errors import UserError
from tuiapp.core.config.recipe import BenchmarkSpec
from tuiapp.core.data import bench_tasks
from tuiapp.core.run_folder import benchmarks as bench_results

_managers: dict[tuple, object] = {}


def _manager(includes: tuple[str, ...], defaults: bool):
    from lm_eval.tasks import TaskManager

    key = (includes, defaults)
    if key not in _managers:  # indexing the registry's YAMLs takes seconds: once per process
        _managers[key] = TaskManager(include_path=list(includes) or None, include_defaults=defaults,
                                     verbosity="ERROR")
    return _managers[key]


def _numbers(metrics: dict) -> dict[str, float]:
    """lm-eval's 'acc,none' -> 'acc' (a filter other than none stays: 'exact_match,strict-match' ->
    'exact_match_strict-match'); stderr columns and non-numbers left out."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or "_stderr" in key or key == "sample_len":
            continue
        metric, _, filt = key.partition(",")
        name = metric if filt in ("", "none") else f"{metric}_{filt}"
        if math.isfinite(float(value)):
            out[name] = float(value)
    return out


def score(model, tokenizer, specs: list[BenchmarkSpec], base_dir: Path | None = None,
          batch_size: int = 8) -> dict[str, dict[str, float]]:
    """{task: {metric: value}} of the model on each benchmark; UserError when a task cannot run."""
    bench_tasks.require_harness()
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    resolved = [(spec, bench_tasks.resolve(spec.task, base_dir)) for spec in specs]
    includes = tuple(sorted({task.include for _, task in resolved if task.include}))
    manager = _manager(includes, defaults=any(task.include is None for _, task in resolved))
    was_training = model.training
    model.eval()
    wrapped = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    out: dict[str, dict[str, float]] = {}
    try:
        for spec, task in resolved:
            try:
                found = lm_eval.simple_evaluate(
                    model=wrapped, tasks=[task.name], num_fewshot=spec.num_fewshot or None,
                    limit=spec.limit or None, task_manager=manager, bootstrap_iters=0, log_samples=False,
                    apply_chat_template=spec.chat_template, random_seed=None, numpy_random_seed=None,
                    torch_random_seed=None, fewshot_random_seed=1234, verbosity="ERROR")
            except Exception as exc:  # an unknown task, or its data not here offline
                raise UserError(message=f"benchmark {spec.task} could not run: {type(exc).__name__}: {exc}",
                                key="eval.benchmarks", fix="check the task name (`lm-eval ls tasks`); offline, a "
                                "registry task's dataset must already be in the local datasets cache; a task "
                                "YAML must read local files") from None
            for name, metrics in ((found or {}).get("results") or {}).items():
                out[name] = _numbers(metrics)
    finally:
        model.train(was_training)
    return out


class Benchmarks(TrainerCallback):
    """Scores the recipe's benchmarks at each evaluation (or only the last, benchmark_at = 'end') on
    the model being trained; the recorder writes them into that evaluation's metrics row
    (bench/<task>/<metric>). Added before the recorder: callbacks run in the order added."""

    def __init__(self, recorder, tokenizer, specs: list[BenchmarkSpec], at: str = "evals",
                 base_dir: Path | None = None):
        self.recorder = recorder
        self.tokenizer = tokenizer
        self.specs = specs
        self.at = at
        self.base_dir = base_dir

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        last = state.max_steps and state.global_step >= state.max_steps
        if model is None or (self.at == "end" and not (last or control.should_training_stop)):
            return
        started = time.time()
        scores = score(model, self.tokenizer, self.specs, self.base_dir,
                       batch_size=max(1, int(args.per_device_eval_batch_size or 1)))
        self.recorder.extra_eval.update(bench_results.metric_row(scores))
        self.recorder.extra_eval["bench_s"] = round(time.time() - started, 3)
