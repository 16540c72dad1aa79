"""Helpers of the UI tests (imported by conftest.py and the tests).

REAL RUN DIRECTORIES: the runs the tests and snapshots show are copies of the folders in
`tests/fixtures/runs/`, made by `tests/fixtures/make_runs.py` from real runs of the CLI, launcher,
DeepSpeed and Trainer on the bundled tiny model (see that script and `tests/fixtures/manifest.json`
for what each run is). They keep the measured losses, lrs, tokens, throughput and memory; their
timestamps, ids, paths, pids and host are normalised, so snapshots never move. The frozen clock
of every test app, FIXED_NOW, is the moment make_runs.py copied the two running ones.

    stuck     prefix, `running` but its rank hung (SIGSTOP) minutes before FIXED_NOW: stalled
    baseline  lora, 40 steps, lr 1e-2, succeeded        high-lr   the same with lr 5e-2
    sft       full fine-tune, 40 steps, two sample prompts, succeeded
    halted    dora, stopped with `llmtui stop`          crashed   2 ranks, rank 1 SIGKILLed: failed
    live      lora, copied while training: `running`, its last step just before FIXED_NOW

SYNTHETIC RUN DIRECTORIES: `synthetic_run` still builds a folder by hand (the real core code for
recipe.toml/run.json, made-up metrics) for the few tests that need what no small real run has.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import time
from pathlib import Path

from rich.console import Console

from tuiapp.core.config.recipe import METHOD_MODELS, Recipe, TrainSpec
from tuiapp.core.run_folder.metrics import JsonlWriter
from tuiapp.core.store.runs import Run, RunStore
from tuiapp.ui.app import create_app

os.environ["TZ"] = "UTC"  # start times are shown in local time: pin it for snapshots
time.tzset()

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))
FIXED_NOW: float = MANIFEST["now"]  # the clock of every test app: when the fixtures were copied
REAL_IDS: dict[str, str] = {name: run["id"] for name, run in MANIFEST["runs"].items()}


def fixed_clock() -> float:
    return FIXED_NOW


def real_runs(root: Path, names: list[str] | None = None) -> dict[str, Run]:
    """Copies of the committed real-run folders in `root` (all of them, or `names`): {name: Run}."""
    root.mkdir(parents=True, exist_ok=True)
    runs = {}
    for name in names or list(REAL_IDS):
        runs[name] = copy_real_run(root, name)
    return runs


def copy_real_run(root: Path, name: str, as_id: str | None = None) -> Run:
    """One real-run fixture copied into `root` (under another folder name with `as_id`)."""
    target = root / (as_id or REAL_IDS[name])
    shutil.copytree(FIXTURES / "runs" / REAL_IDS[name], target)
    run = Run(target).load()
    if as_id:
        run.record.id = as_id
        run.save()
    return run


def real_rows(name: str, split: str = "train") -> list[dict]:
    """The metrics rows of one real-run fixture (train or eval), to check what the UI shows."""
    path = FIXTURES / "runs" / REAL_IDS[name] / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if r.get("split", "train") == split]


def real_info(name: str) -> dict:
    """The run.json of one real-run fixture."""
    return json.loads((FIXTURES / "runs" / REAL_IDS[name] / "run.json").read_text(encoding="utf-8"))


def synthetic_run(
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
    """SYNTHETIC: a hand-made run folder with deterministic metrics in the trainer's row format.

    Only for the few tests that need data no small real run gives (hundreds of steps, a run
    made up on the spot); every other test uses `real_runs`. `test_data.py` checks that these
    rows carry the keys the real trainer's rows carry.
    """
    store = RunStore(root)
    recipe = Recipe(
        name=name,
        method=METHOD_MODELS[method](),
        train=TrainSpec(max_steps=steps, learning_rate=lr, eval_steps=eval_every, seed=seed),
        dataset={"name": dataset},
    )
    run = store.create(recipe, recipe_file=f"recipes/{name}.toml")
    fixed = root / f"20251231-{index:06d}-{name}-5{index:03x}"  # 5xxx: synthetic
    run.path.rename(fixed)
    run = Run(fixed).load()
    written = steps if written is None else written
    started = started if started is not None else FIXED_NOW - 3600 + index * 60
    if last_time is not None:  # place the last row at last_time
        started = last_time - written * step_s
    ended = started + written * step_s + 5 if status not in ("running", "created") else None
    run.record.set(
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


def test_app(root: Path, base_dir: Path, **options):
    """An app with a frozen clock, no GPU/host monitor and no HF cache: deterministic frames."""
    defaults = dict(clock=fixed_clock, base_dir=base_dir, system_monitor=False, hf_cache_dirs=[], poll_s=0.1, history_poll_s=0.3)
    defaults.update(options)
    return create_app(root, **defaults)


test_app.__test__ = False  # not a test: a factory


async def wait_for(pilot, predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """Let the app run until predicate() is true (workers post their messages meanwhile); an
    exception that ended the app is raised at once, not hidden behind the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        failed = getattr(pilot.app, "_exception", None)
        if failed is not None:
            raise AssertionError(f"the app failed while waiting for {what}: {failed!r}") from failed
        await pilot.pause(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def screen_text(app) -> str:
    """The current frame as plain text (what a user reads)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, record=True, legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()

