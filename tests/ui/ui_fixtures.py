"""Helpers of the UI tests (imported by conftest.py and the tests).

SYNTHETIC RUN DIRECTORIES: until the real-trainer fixtures land, `make_run` builds run folders
with the real core code (RunStore.create for recipe.toml/run.json, JsonlWriter for
metrics.jsonl) and deterministic values with fixed timestamps, so snapshots never move. The
metrics follow the trainer's row format (step, max_steps, epoch, time, loss, lr, grad_norm,
tokens, tokens_per_s, samples_per_s, step_time, mem.rank0{device,rss,peak,host}; eval rows with
split/eval_loss/perplexity/samples). Swap these for directories from real trainer runs when
they exist.
"""

from __future__ import annotations

import io
import math
import os
import time
from pathlib import Path

from rich.console import Console

from tuiapp.core.metrics import JsonlWriter
from tuiapp.core.recipe import METHOD_MODELS, Recipe, TrainSpec
from tuiapp.core.runs import Run, RunStore
from tuiapp.ui.app import create_app

os.environ["TZ"] = "UTC"  # start times are shown in local time: pin it for snapshots
time.tzset()

FIXED_NOW = 1_763_769_600.0  # 2025-11-22 00:00:00 UTC: the clock of every test app


def fixed_clock() -> float:
    return FIXED_NOW


def make_run(
    root: Path,
    name: str,
    *,
    index: int = 0,
    method: str = "lora",
    status: str = "succeeded",
    steps: int = 40,
    written: int | None = None,
    lr: float = 2e-4,
    seed: int = 0,
    started: float | None = None,
    step_s: float = 2.0,
    eval_every: int = 10,
    samples: bool = True,
    reason: str | None = None,
    last_time: float | None = None,
    dataset: str = "demo:facts",
) -> Run:
    """A synthetic run folder with deterministic metrics (see the module docstring)."""
    store = RunStore(root)
    recipe = Recipe(
        name=name,
        method=METHOD_MODELS[method](),
        train=TrainSpec(max_steps=steps, learning_rate=lr, eval_steps=eval_every, seed=seed),
        dataset={"name": dataset},
    )
    run = store.create(recipe, recipe_file=f"recipes/{name}.toml")
    fixed = root / f"20251121-{index:06d}-{name}-{index:04x}"
    run.path.rename(fixed)
    run = Run(fixed).load()
    written = steps if written is None else written
    started = started if started is not None else FIXED_NOW - 3600 + index * 60
    if last_time is not None:  # place the last row at last_time
        started = last_time - written * step_s
    ended = started + written * step_s + 5 if status not in ("running", "created") else None
    run.info.update(
        id=fixed.name, status=status, created=started - 1, started=started, ended=ended,
        host="testhost", ranks=1, accelerator="cpu", reason=reason, attempts=1,
    )
    run.save()
    with JsonlWriter(run.metrics_path) as writer:
        tokens = 0
        for step in range(1, written + 1):
            tokens += 2048
            progress = step / steps
            loss = 0.6 + 2.4 * math.exp(-4 * progress * (1 + lr * 1000)) + 0.04 * math.sin(step * 0.9 + seed)
            warm = max(1, steps // 10)
            rate = lr * (step / warm if step <= warm else 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))
            writer.write({
                "step": step, "max_steps": steps, "epoch": round(progress * 0.5, 4),
                "time": started + step * step_s, "loss": round(loss, 5), "lr": rate,
                "grad_norm": round(1.0 + 0.3 * math.cos(step), 4), "tokens": tokens,
                "tokens_per_s": 1024.0 + 8 * (step % 7) + 50 * seed, "samples_per_s": 2.0, "step_time": step_s,
                "mem": {"rank0": {"device": "cpu", "rss": 900_000_000 + step * 1_000_000, "peak": 1_000_000_000 + step * 2_000_000 + seed * 10_000_000, "host": "testhost"}},
            })
            if eval_every and step % eval_every == 0:
                eval_loss = round(loss + 0.1, 5)
                row = {"split": "eval", "step": step, "epoch": round(progress * 0.5, 4), "time": started + step * step_s + 0.5,
                       "eval_loss": eval_loss, "perplexity": math.exp(eval_loss)}
                if samples:
                    row["samples"] = [{"prompt": "What is the capital of France?", "output": f"Paris (step {step})"}]
                writer.write(row)
    with open(run.log_path, "w", encoding="utf-8") as log:
        log.write(f"$ deepspeed --num_gpus 1 --module tuiapp.trainer --run-dir {name}\n")
        for step in range(1, written + 1, 10):
            log.write(f"[rank0] step {step}/{steps}\n")
    (run.path / "ranks").mkdir(exist_ok=True)
    (run.path / "ranks" / "rank0.log").write_text("rank 0 ready\nrank 0 training\n", encoding="utf-8")
    return run


def standard_runs(root: Path) -> dict[str, Run]:
    """Six runs covering every status: the history/compare/run-view fixtures."""
    return {
        "baseline": make_run(root, "baseline", index=1, lr=2e-4, seed=0),
        "high-lr": make_run(root, "high-lr", index=2, lr=1e-3, seed=1),
        "full-sft": make_run(root, "full-sft", index=3, method="sft", status="failed", steps=40, written=17,
                             reason="rank 0: RuntimeError: CUDA out of memory", seed=2),
        "halted": make_run(root, "halted", index=4, method="dora", status="stopped", written=25, seed=3, dataset="demo:chat"),
        "live-one": make_run(root, "live-one", index=5, status="running", steps=100, written=30, last_time=FIXED_NOW - 4, seed=4),
        "stuck": make_run(root, "stuck", index=6, method="prefix", status="running", steps=100, written=12, last_time=FIXED_NOW - 900, seed=5),
    }


def test_app(root: Path, base_dir: Path, **options):
    """An app with a frozen clock, no GPU/host monitor and no HF cache: deterministic frames."""
    defaults = dict(clock=fixed_clock, base_dir=base_dir, system_monitor=False, hf_cache_dirs=[], poll_s=0.1, history_poll_s=0.3)
    defaults.update(options)
    return create_app(root, **defaults)


test_app.__test__ = False  # not a test: a factory


async def wait_for(pilot, predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Let the app run until predicate() is true (workers post their messages meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def screen_text(app) -> str:
    """The current frame as plain text (what a user reads)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, record=True, legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()

