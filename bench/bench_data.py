"""Data: tokenization throughput of llmtui's pipeline, and its cache.

    .venv/bin/python bench/bench_data.py [--quick]

`tuiapp.trainer.data.build_datasets` (what every rank runs before training) on the real
sample data, with the bundled tiny model's tokenizer:
  * first call with a fresh cache dir: read + normalise records, tokenize (pretrain: documents
    + eos concatenated into blocks; SFT: chat template + assistant-only labels), save the cache;
  * second call with the same cache dir: must load it instead of tokenizing again (≪ first).
For context, the baseline script's docs-style tokenization (`load_dataset` + `.map`, fresh
datasets cache) of the same file is timed too.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import fmt, md_table, median  # noqa: E402

TASKS = {
    "pretrain": {"name": "pretrain", "file": common.C4, "format": "text", "method": "pretrain",
                 "max_seq_len": 512},
    "sft": {"name": "sft", "file": common.ALPACA, "format": "alpaca", "method": "sft", "max_seq_len": 1024},
}


def _task(spec: dict) -> dict:
    return {**spec, "data": str(common.data_file(spec["file"])), "steps": 10, "micro_batch": 8, "lr": 3e-3}


def measure(spec: dict, model_dir: Path, reps: int, work: Path) -> dict:
    from datasets import disable_caching, enable_caching
    from transformers import AutoTokenizer

    import baseline_train
    from tuiapp.core.datasets import load_records
    from tuiapp.core.recipe import parse_recipe
    from tuiapp.trainer.data import build_datasets

    task = _task(spec)
    recipe = parse_recipe(common.recipe_toml(task))
    examples = len(load_records(recipe.dataset))
    first, second, base = [], [], []
    tokens = rows = None
    for rep in range(reps):
        cache = work / f"{spec['name']}-{rep}"
        # a freshly loaded tokenizer per call, as each rank process has (see fingerprint_check)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        t0 = time.perf_counter()
        train, _ = build_datasets(recipe, tokenizer, cache)
        t1 = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        t1 = time.perf_counter()
        again, _ = build_datasets(recipe, tokenizer, cache)
        t2 = time.perf_counter()
        if tokens is None:
            tokens = sum(len(ids) for ids in train["input_ids"])
            rows = len(train)
            assert len(again) == rows, "the cached dataset differs from the first one"
        first.append(t1 - t0)
        second.append(t2 - t1)
        # docs-style tokenization of the same file, no datasets cache reuse
        disable_caching()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        try:
            t3 = time.perf_counter()
            if spec["method"] == "pretrain":
                baseline_train.pretrain_dataset(tokenizer, task["data"], task["max_seq_len"])
            else:
                baseline_train.sft_dataset(tokenizer, task["data"], task["max_seq_len"])
            base.append(time.perf_counter() - t3)
        finally:
            enable_caching()
    cache_files = sorted(p.name for p in (work / f"{spec['name']}-0" / "data").iterdir())
    return {"task": spec["name"], "file": spec["file"], "max_seq_len": spec["max_seq_len"], "examples": examples,
            "rows": rows, "tokens": tokens, "first_s": median(first), "second_s": median(second),
            "baseline_s": median(base), "first_all": first, "second_all": second, "cache_entries": cache_files}


def fingerprint_check(model_dir: Path) -> dict:
    """Does the cache key of a tokenizer depend on how it was last called? The key hashes
    `backend_tokenizer.to_str()`, which holds the backend's current truncation/padding state."""
    from transformers import AutoTokenizer

    from tuiapp.core.recipe import parse_recipe
    from tuiapp.trainer.data import cache_key

    task = {"name": "sft", "data": "demo:facts", "format": "auto", "method": "sft", "max_seq_len": 1024,
            "steps": 10, "micro_batch": 8, "lr": 3e-3}  # a bundled demo: runs without the sample data
    recipe = parse_recipe(common.recipe_toml(task))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    fresh = cache_key(recipe.dataset, recipe, tokenizer)
    tokenizer(["some text"], truncation=True, max_length=8)  # e.g. a docs-style map before
    after_truncating = cache_key(recipe.dataset, recipe, tokenizer)
    tokenizer(["some text"])
    after_plain = cache_key(recipe.dataset, recipe, tokenizer)
    return {"fresh": fresh, "after_truncating_call": after_truncating, "after_plain_call": after_plain}


def markdown(results: list[dict], reps: int, fingerprint: dict | None = None) -> str:
    out = [f"`build_datasets` with the tiny model's tokenizer, {reps} repetition(s), medians; "
           "tokens = tokens in the tokenized dataset (pretrain: full blocks; SFT: whole examples)."]
    out.append("")
    rows = []
    for r in results:
        if "skipped" in r:
            rows.append([r["task"], r["skipped"]] + [""] * 7)
            continue
        rows.append([
            f"{r['task']} ({r['file']}, max_seq_len {r['max_seq_len']})",
            f"{r['examples']:,} → {r['rows']:,} rows",
            f"{r['tokens']:,}",
            fmt(r["first_s"], ".2f"),
            fmt(r["examples"] / r["first_s"], ",.0f"),
            fmt(r["tokens"] / r["first_s"], ",.0f"),
            fmt(r["second_s"], ".3f"),
            fmt(r["first_s"] / r["second_s"], ",.0f") + "×" if r["second_s"] else "—",
            fmt(r["baseline_s"], ".2f"),
        ])
    out.append(md_table(["data", "examples", "tokens", "1st call s (fresh cache)", "examples/s", "tokens/s",
                         "2nd call s (same cache)", "1st / 2nd", "baseline map s (docs style)"], rows))
    out.append("")
    for r in results:
        if "skipped" not in r:
            out.append(f"- {r['task']}: every call: " + ", ".join(
                f"{a:.2f} s → {b:.3f} s" for a, b in zip(r["first_all"], r["second_all"], strict=True))
                + f"; cache entry written: `data/{', '.join(r['cache_entries'])}`")
    if fingerprint:
        stable = len(set(fingerprint.values())) == 1
        out.append("")
        out.append("Cache key stability (`tuiapp.trainer.data.cache_key` of one tokenizer, an SFT recipe on demo:facts): "
                   f"fresh `{fingerprint['fresh']}`, after a call with truncation=True "
                   f"`{fingerprint['after_truncating_call']}`, after a plain call `{fingerprint['after_plain_call']}` — "
                   + ("stable." if stable else "**unstable**: the key hashes `backend_tokenizer.to_str()`, which "
                      "includes the backend's current truncation/padding state, so a tokenizer that was called "
                      "with truncation before `build_datasets` misses the cache and writes a second entry. "
                      "Fix: drop the `truncation` and `padding` fields of that JSON before hashing in "
                      "`tokenizer_fingerprint`. (Ranks load a fresh tokenizer, so training runs hit the cache today.)"))
    return "\n".join(out)


def run_all(quick: bool = False, log=print) -> dict:
    reps = 1 if quick else 3
    work = common.temp_dir("data")
    results = []
    fingerprint = None
    try:
        model_dir = common.ensure_model(work / "model-cache")
        for name, spec in TASKS.items():
            skipped = common.missing_data_message(spec["file"])
            if skipped:
                log(f"  data {name}: {skipped}")
                results.append({"task": name, "skipped": skipped})
                continue
            log(f"data benchmark: {name}, {reps} repetition(s)")
            results.append(measure(spec, model_dir, reps, work))
        fingerprint = fingerprint_check(model_dir)
    finally:
        common.remove(work)
    return {"results": results, "fingerprint": fingerprint, "markdown": markdown(results, reps, fingerprint)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    common.exit_on_sigterm()
    result = run_all(args.quick, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(result["markdown"])
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
