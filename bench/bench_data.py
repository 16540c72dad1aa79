"""Data: tokenization throughput of llmtui's pipeline, and its cache.

    .venv/bin/python bench/bench_data.py [--quick]

`tuiapp.trainer.data.build_datasets` (what every rank runs before training) on the real
sample data, with the bundled tiny model's tokenizer:
  * first call with a fresh cache dir: read + normalise records, tokenize (pretrain: documents
    + eos concatenated into blocks; SFT: chat template + assistant-only labels), save the cache;
  * second call with the same cache dir: must load it instead of tokenizing again (≪ first).
For context, the baseline script's docs-style tokenization (`load_dataset` + `.map`, fresh
datasets cache) of the same file is timed too.

    .venv/bin/python bench/bench_data.py --corpus-mb 1024,4096

Data at any size: a pretraining corpus of each size made from the shared c4 sample repeated (in a
temporary folder, never committed), tokenized cold in a rank-like child process (fresh cache) and
loaded warm; the peak resident memory of the rank process and of it with its tokenizing workers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

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


BUILD = """
import json, sys, time
from transformers import AutoTokenizer
from tuiapp.core.recipe import parse_recipe
from tuiapp.trainer.data import build_datasets
recipe = parse_recipe(open(sys.argv[1]).read())
tokenizer = AutoTokenizer.from_pretrained(sys.argv[2])
started = time.perf_counter()
train, _ = build_datasets(recipe, tokenizer, sys.argv[3])
print(json.dumps({"seconds": time.perf_counter() - started, "rows": len(train)}))
"""


def make_corpus(path: Path, megabytes: int) -> int:
    """The shared c4 sample repeated to `megabytes`; returns the number of documents."""
    sample = common.data_file(common.C4).read_bytes()
    if not sample.endswith(b"\n"):
        sample += b"\n"
    docs = 0
    with path.open("wb") as handle:
        while handle.tell() < megabytes * 1024**2:
            handle.write(sample)
            docs += sample.count(b"\n")
    return docs


def _peak_rss(argv: list[str], env: dict) -> tuple[dict, float, float]:
    """(the child's JSON line, peak RSS of the child alone, peak RSS of the child and its children) in MB."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                            cwd=common.ROOT)
    own = tree = 0.0
    parent = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            mine = parent.memory_info().rss
            kids = sum(c.memory_info().rss for c in parent.children(recursive=True))
            own, tree = max(own, mine / 1e6), max(tree, (mine + kids) / 1e6)
        except psutil.Error:
            pass
        time.sleep(0.1)
    out = proc.stdout.read().strip().splitlines()
    if proc.returncode != 0 or not out:
        raise RuntimeError(f"build failed ({proc.returncode})")
    return json.loads(out[-1]), own, tree


def corpus_scaling(sizes_mb: list[int], log=print) -> dict:
    work = common.temp_dir("corpus")
    rows = []
    try:
        model_dir = common.ensure_model(work / "model-cache")
        for size in sizes_mb:
            corpus = work / f"c4-{size}mb.jsonl"
            docs = make_corpus(corpus, size)
            recipe = work / f"r{size}.toml"
            recipe.write_text(common.recipe_toml({"name": "corpus", "data": str(corpus), "format": "text",
                                                  "method": "pretrain", "max_seq_len": 512, "steps": 10,
                                                  "micro_batch": 8, "lr": 3e-3}))
            cache = work / f"cache-{size}"
            argv = [sys.executable, "-c", BUILD, str(recipe), str(model_dir), str(cache)]
            env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
            log(f"corpus {size} MB ({docs:,} documents): cold")
            cold, cold_own, cold_tree = _peak_rss(argv, env)
            log(f"corpus {size} MB: warm")
            warm, warm_own, _ = _peak_rss(argv, env)
            rows.append({"mb": size, "docs": docs, "rows": cold["rows"], "cold_s": cold["seconds"],
                         "docs_per_s": docs / cold["seconds"], "mb_per_s": corpus.stat().st_size / 1e6 / cold["seconds"],
                         "cold_rank_mb": cold_own, "cold_tree_mb": cold_tree, "warm_s": warm["seconds"],
                         "warm_rank_mb": warm_own})
            corpus.unlink()
            common.remove(cache)
    finally:
        common.remove(work)
    table = md_table(["corpus", "documents", "blocks of 512", "cold s", "docs/s", "MB/s", "peak rank MB (cold)",
                      "peak rank + workers MB", "warm load s", "peak rank MB (warm)"],
                     [[f"{r['mb']:,} MB", f"{r['docs']:,}", f"{r['rows']:,}", fmt(r["cold_s"], ".1f"),
                       fmt(r["docs_per_s"], ",.0f"), fmt(r["mb_per_s"], ".2f"), fmt(r["cold_rank_mb"], ",.0f"),
                       fmt(r["cold_tree_mb"], ",.0f"), fmt(r["warm_s"], ".2f"), fmt(r["warm_rank_mb"], ",.0f")]
                      for r in rows])
    return {"rows": rows, "markdown": table}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--corpus-mb", default="", help="sizes of generated c4 corpora, e.g. 1024,4096")
    args = parser.parse_args(argv)
    common.exit_on_sigterm()
    if args.corpus_mb:
        skipped = common.missing_data_message(common.C4)
        if skipped:
            print(skipped)
            return 0
        sizes = [int(v) for v in args.corpus_mb.split(",") if v.strip()]
        print(corpus_scaling(sizes, log=lambda m: print(m, file=sys.stderr, flush=True))["markdown"])
        return 0
    result = run_all(args.quick, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(result["markdown"])
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
