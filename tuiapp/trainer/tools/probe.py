"""The probing rank: a few real training steps at each micro-batch size, one JSON row per size.

`python -m tuiapp.trainer.tools.probe --recipe R --out DIR --sizes 1,2,4 ...`, started through the
DeepSpeed launcher by tuiapp.core.plan.probe. Each size gets a fresh model and the recipe's own
TrainingArguments (DeepSpeed config included) and trains on the longest examples, so the peak is
that of the worst batch. Peak memory: the CUDA allocator's max_memory_allocated, or on CPU the
process's peak RSS (VmHWM, reset between sizes through /proc/self/clear_refs). Sizes stop growing
once one goes over the budget (or is out of memory), or when the next one would likely not fit.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
import time
from pathlib import Path

import psutil
import torch
import transformers
from accelerate.state import AcceleratorState
from transformers import Trainer, TrainerCallback, TrainingArguments

from tuiapp.core.common import trainer_tools
from tuiapp.core.config.recipe import Recipe, parse_recipe
from tuiapp.core.plan.probe import ROWS_FILE
from tuiapp.trainer.loop import optimizers, strategies
from tuiapp.trainer.methods.adapters import apply_method
from tuiapp.trainer.models.bundled import resolve_model_path
from tuiapp.trainer.models.model import cache_dir, load_model, load_tokenizer
from tuiapp.trainer.run import resolve_precision, training_kwargs


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog=trainer_tools.prog("probe"))
    parser.add_argument("--recipe", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="folder for rows.jsonl")
    parser.add_argument("--sizes", required=True, help="micro-batch sizes, ascending: 1,2,4")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--limit", type=int, default=0, help="device memory in bytes (0 = the device's own)")
    parser.add_argument("--headroom", type=float, default=0.1)
    parser.add_argument("--local_rank", "--local-rank", type=int, default=-1)
    return parser.parse_known_args(argv)[0]


# ---------------------------------------------------------------- memory


def _vm_status(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        return
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back, so the next baseline is honest
    except (OSError, AttributeError):
        pass


def reset_peak() -> bool:
    """Start a new peak; False when the CPU peak cannot be reset (it then only grows)."""
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        return True
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def current_bytes() -> int:
    if torch.cuda.is_available():
        return torch.cuda.memory_allocated()
    return psutil.Process().memory_info().rss


def peak_bytes() -> int:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated()
    return _vm_status("VmHWM") or psutil.Process().memory_info().rss


def device_bytes() -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return psutil.virtual_memory().total


# ---------------------------------------------------------------- one size


class StepClock(TrainerCallback):
    def __init__(self):
        self.begins: list[float] = []
        self.ends: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.begins.append(time.perf_counter())

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())


class CountingCollator:
    """The recipe's collator, counting the non-padding tokens of each batch."""

    def __init__(self, collate, pad_id: int | None):
        self.collate, self.pad_id, self.tokens = collate, pad_id, []

    def __call__(self, features):
        batch = self.collate(features)
        ids = batch["input_ids"]
        if "attention_mask" in batch:
            self.tokens.append(int(batch["attention_mask"].sum()))
        elif self.pad_id is not None and ids.dim() == 2 and ids.shape[0] > 1:
            self.tokens.append(int((ids != self.pad_id).sum()))
        else:
            self.tokens.append(int(ids.numel()))
        return batch


def longest(dataset, count: int):
    """The `count` longest examples (repeated when the data has fewer)."""
    lengths = [len(ids) for ids in dataset["input_ids"]]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    picked = (order * (count // max(1, len(order)) + 1))[:count]
    return dataset.select(picked)


def measure(recipe: Recipe, size: int, steps: int, model_path: str, precision: str, tokenizer, train_set,
            out: Path) -> dict:
    from tuiapp.trainer.dataset.data import make_collator
    from tuiapp.trainer.run import _varlen_attention

    sized = recipe.model_copy(deep=True)
    sized.train.micro_batch = size
    _release_memory()
    before = current_bytes()
    resettable = reset_peak()
    transformers.set_seed(recipe.train.seed)
    model = apply_method(load_model(sized, model_path, precision), sized, model_path)
    if sized.train.gradient_checkpointing and hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()
    kwargs = training_kwargs(sized, out, precision, has_eval=False)
    kwargs.update(output_dir=str(out / "trainer"), max_steps=steps, gradient_accumulation_steps=1,
                  save_strategy="no", eval_strategy="no", logging_steps=steps, logging_first_step=False,
                  report_to="none", warmup_steps=0)
    clock = StepClock()
    collator = CountingCollator(make_collator(sized, tokenizer, varlen_attention=_varlen_attention(model)),
                                tokenizer.pad_token_id)
    trainer = Trainer(model=model, args=TrainingArguments(**kwargs), train_dataset=longest(train_set, size * steps),
                      data_collator=collator, callbacks=[clock])
    optimizers.install(trainer, sized)  # the run's optimizer, so its state is in the peak
    row = {"micro_batch": size, "status": "ok"}
    try:
        trainer.train()
    except torch.OutOfMemoryError:
        row["status"] = "oom"
    peak = peak_bytes()
    row.update(peak_bytes=peak, measured_bytes=peak if torch.cuda.is_available() else max(0, peak - before),
               baseline_bytes=before, peak_resettable=resettable)
    timed = [end - begin for begin, end in zip(clock.begins[1:], clock.ends[1:], strict=False)]
    if row["status"] == "ok" and timed:
        row["step_s"] = round(sum(timed) / len(timed), 4)
        row["tokens_per_s"] = round(sum(collator.tokens[1:len(timed) + 1]) / sum(timed), 1)
    del trainer, model
    AcceleratorState._reset_state()  # the next size's Trainer brings its own DeepSpeed plugin
    _release_memory()
    return row


# ---------------------------------------------------------------- the rank


def main(argv=None) -> int:
    args = parse_args(argv)
    recipe = parse_recipe(args.recipe.read_text(encoding="utf-8"), str(args.recipe))
    transformers.logging.set_verbosity_warning()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / ROWS_FILE
    model_path = resolve_model_path(recipe.model.name)
    strategies.prepare_distributed(recipe)  # CPU DeepSpeed joins its one-rank group here
    precision = resolve_precision(recipe.train.precision)
    tokenizer = load_tokenizer(model_path, recipe.model.trust_remote_code, recipe)
    from tuiapp.trainer.dataset.data import build_datasets

    train_set, _ = build_datasets(recipe, tokenizer, cache_dir())
    limit = args.limit or device_bytes()
    budget = limit * (1 - args.headroom)
    cuda = torch.cuda.is_available()
    with open(rows_path, "a", encoding="utf-8") as rows:
        def write(row: dict) -> None:
            rows.write(json.dumps(row) + "\n")
            rows.flush()

        write({"kind": "device", "device": "cuda" if cuda else "cpu", "limit_bytes": int(limit),
               "device_bytes": device_bytes()})
        previous = None
        for size in [int(s) for s in args.sizes.split(",") if s.strip()]:
            row = measure(recipe, size, args.steps, model_path, precision, tokenizer, train_set, out)
            if row["status"] == "ok" and row["peak_bytes"] > budget:
                row["status"] = "over"
            write(row)
            print(f"probe: micro_batch {size}: {row['status']}, peak {row['peak_bytes'] / 2**20:.0f} MiB, "
                  f"{row.get('tokens_per_s', 0):.0f} tokens/s", flush=True)
            if row["status"] != "ok":
                break
            # on CPU going over means the kernel's OOM killer, not an exception: stop before a size
            # whose peak, grown as from the last doubling, would pass the whole limit
            if previous is not None and not cuda:
                growth = (row["peak_bytes"] - previous["peak_bytes"]) * size / max(1, size - previous["micro_batch"])
                if row["peak_bytes"] + growth > limit:
                    write({"kind": "note", "note": f"stopped after micro_batch {size}: the next size would "
                           "likely pass the memory limit"})
                    break
            previous = row
    return 0


if __name__ == "__main__":
    sys.exit(main())
