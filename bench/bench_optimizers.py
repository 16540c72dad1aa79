"""Muon against AdamW on the same tiny pretraining run (loss at equal steps and at equal time),
and each optimizer's measured state against the estimate's optimizer bytes.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_optimizers.py [--steps 60] [--out FILE]

In-process, CPU, fp32, one rank (the Trainer's own loop, as a one-rank CPU run trains): the same
tiny model from the same seed, the same demo text in the same order, the same schedule
(train.learning_rate 3e-3, cosine, 3 % warmup); only train.optimizer differs. Prints a markdown
section (and writes it to --out).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("LLMTUI_CACHE", tempfile.mkdtemp(prefix="llmtui-bench-opt-"))

STATE_KINDS = ("adamw", "muon", "adafactor", "schedule_free_adamw", "lion")


def recipe_for(kind: str, steps: int, micro_batch: int, seq: int):
    from tuiapp.core.config.recipe import parse_recipe

    return parse_recipe(f"""
[dataset]
name = "demo:text"
[method]
kind = "pretrain"
[train]
optimizer = "{kind}"
max_steps = {steps}
micro_batch = {micro_batch}
learning_rate = 3e-3
max_seq_len = {seq}
logging_steps = 1
[launch]
gpus = 1
""", f"{kind}.toml")


def train(kind: str, steps: int, micro_batch: int, seq: int) -> dict:
    import torch
    import transformers
    from transformers import TrainerCallback

    from tuiapp.trainer.dataset.data import build_datasets, make_collator
    from tuiapp.trainer.loop import optimizers
    from tuiapp.trainer.models.model import apply_method, cache_dir, load_model, load_tokenizer
    from tuiapp.trainer.models.tiny import ensure_tiny_model
    from tuiapp.trainer.run import RunTrainer, _training_args

    torch.set_num_threads(max(1, torch.get_num_threads()))
    path = str(ensure_tiny_model(Path(os.environ["LLMTUI_CACHE"])))
    recipe = recipe_for(kind, steps, micro_batch, seq)
    tokenizer = load_tokenizer(path, False, recipe)
    train_set, _ = build_datasets(recipe, tokenizer, cache_dir())
    transformers.set_seed(recipe.train.seed)
    model = apply_method(load_model(recipe, path, "fp32"), recipe, path)
    rows: list[tuple[int, float, float]] = []  # step, seconds since the first step began, loss

    class Clock(TrainerCallback):
        start = None

        def on_step_begin(self, args, state, control, **kwargs):
            if self.start is None:
                self.start = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                rows.append((state.global_step, time.perf_counter() - self.start, float(logs["loss"])))

    with tempfile.TemporaryDirectory() as out:
        args = _training_args(recipe, Path(out), "fp32", has_eval=False)
        args.report_to = []
        trainer = RunTrainer(model=model, args=args, train_dataset=train_set,
                             data_collator=make_collator(recipe, tokenizer), processing_class=tokenizer,
                             callbacks=[Clock()])
        optimizers.install(trainer, recipe)
        trainer.train()
        state = optimizers.state_bytes(trainer.optimizer)
    return {"kind": kind, "rows": rows, "state": state, "recipe": recipe}


def loss_at_step(rows, step: int) -> float:
    return next(loss for s, _, loss in rows if s >= step)


def loss_at_time(rows, seconds: float) -> float:
    """The loss of the last step finished by `seconds` (mean of the 3 before it, to damp noise)."""
    done = [loss for _, t, loss in rows if t <= seconds]
    return sum(done[-3:]) / len(done[-3:])


def step_cost(micro_batch: int, seq: int, reps: int = 20) -> dict:
    """Milliseconds of one optimizer step (AdamW, Muon; interleaved, median) and of one forward +
    backward on the tiny model, one thread: what 'equal time' comes to when the machine is busy."""
    import statistics

    import torch
    from transformers import AutoModelForCausalLM

    from tuiapp.trainer.loop import optimizers
    from tuiapp.trainer.models.tiny import ensure_tiny_model

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(Path(os.environ["LLMTUI_CACHE"])))
    batch = torch.randint(0, model.config.vocab_size, (micro_batch, seq))
    passes = []
    for _ in range(5):
        begin = time.perf_counter()
        model(input_ids=batch, labels=batch).loss.backward()
        passes.append(time.perf_counter() - begin)
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3)
    muon = optimizers.MuonFactory()(model, lr=1e-3, weight_decay=0.0, decay_names=set(), betas=(0.9, 0.999),
                                    eps=1e-8, momentum=0.95, ns_steps=5, lr_scale=1.0)
    times: dict[str, list[float]] = {"adamw": [], "muon": []}
    for _ in range(reps):
        for name, optimizer in (("adamw", adamw), ("muon", muon)):
            begin = time.perf_counter()
            optimizer.step()
            times[name].append(time.perf_counter() - begin)
    out = {name: 1000 * statistics.median(values[3:]) for name, values in times.items()}
    out["forward_backward"] = 1000 * statistics.median(passes[1:])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--step-cost", action="store_true", help="only the step cost, printed")
    args = parser.parse_args(argv)
    from tuiapp.core.plan import estimate

    if args.step_cost:
        print(step_cost(args.micro_batch, args.seq))
        return 0

    runs = {kind: train(kind, args.steps, args.micro_batch, args.seq) for kind in ("adamw", "muon")}
    lines = [f"## Optimizers: Muon vs AdamW (tiny pretraining, {args.steps} steps)", "",
             f"Made by `bench/bench_optimizers.py --steps {args.steps}`: the tiny model from scratch on demo:text, "
             f"micro_batch {args.micro_batch} x {args.seq} tokens, learning rate 3e-3 (cosine, 3 % warmup), fp32 on "
             "CPU, one rank, in-process through the run's Trainer; only train.optimizer differs (Muon: torch's, "
             "updates scaled to AdamW's RMS, on the 2-D hidden weights; AdamW on the rest). The CPU is shared with "
             "other work: the times are noisy, the losses are not.", "",
             "| step | AdamW loss | Muon loss |", "|---|---|---|"]
    marks = sorted({max(1, args.steps // 6), args.steps // 3, args.steps // 2, 2 * args.steps // 3, args.steps})
    for step in marks:
        lines.append(f"| {step} | {loss_at_step(runs['adamw']['rows'], step):.3f} | "
                     f"{loss_at_step(runs['muon']['rows'], step):.3f} |")
    totals = {k: r["rows"][-1][1] for k, r in runs.items()}
    lines += ["", "| | AdamW | Muon |", "|---|---|---|",
              f"| seconds for {args.steps} steps | {totals['adamw']:.1f} | {totals['muon']:.1f} |",
              f"| seconds per step | {totals['adamw'] / args.steps:.3f} | {totals['muon'] / args.steps:.3f} |"]
    for fraction in (0.5, 1.0):
        seconds = fraction * min(totals.values())
        lines.append(f"| loss at {seconds:.1f} s (equal time) | {loss_at_time(runs['adamw']['rows'], seconds):.3f} | "
                     f"{loss_at_time(runs['muon']['rows'], seconds):.3f} |")
    cost = step_cost(args.micro_batch, args.seq)
    per_step = {k: cost["forward_backward"] + cost[k] for k in ("adamw", "muon")}
    muon_steps = int(args.steps * per_step["adamw"] / per_step["muon"])
    lines += ["", f"Step cost measured apart (one thread, median): forward + backward {cost['forward_backward']:.0f} ms, "
              f"AdamW step {cost['adamw']:.0f} ms, Muon step {cost['muon']:.0f} ms (Newton-Schulz on every hidden "
              f"matrix). At equal time, in AdamW's {args.steps} steps Muon makes {muon_steps}: loss "
              f"{loss_at_step(runs['muon']['rows'], muon_steps):.3f} (Muon) vs "
              f"{loss_at_step(runs['adamw']['rows'], args.steps):.3f} (AdamW)."]
    lines += ["", "Optimizer state after a real step (sum of the state tensors) against the estimate's optimizer "
              "bytes, same model, fp32:", "", "| optimizer | measured | estimate | error |", "|---|---|---|---|"]
    for kind in STATE_KINDS:
        measured = runs[kind]["state"] if kind in runs else train(kind, 1, 2, 32)["state"]
        predicted = estimate.estimate_recipe(recipe_for(kind, 1, 2, 32), dict(estimate.TINY_CONFIG), 1,
                                             cuda=False).memory.optimizer
        lines.append(f"| {kind} | {measured:,} B | {predicted:,} B | {100 * (predicted - measured) / measured:+.2f} % |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
