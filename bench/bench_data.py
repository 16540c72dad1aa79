"""Data: tokenization throughput of llmtui's pipeline, and its cache.

    .venv/bin/python bench/bench_data.py [--quick]

`tuiapp.trainer.dataset.data.build_datasets` (what every rank runs before training) on the real
sample data, with the bundled tiny model's tokenizer:
  * first call with a fresh cache dir: read + normalise records, tokenize (pretrain: documents
    + eos concatenated into blocks; SFT: chat template + assistant-only labels), save the cache;
  * second call with the same cache dir: must load it instead of tokenizing again (≪ first).
For context, the baseline script's docs-style tokenization (`load_dataset` + `.map`, fresh
datasets cache) of the same file is timed too.

    .venv/bin/python bench/bench_data.py --corpus-mb 1024,4096 [--no-peer] [--json FILE]

Data at any size: a pretraining corpus of each size made from the shared c4 sample repeated (in a
temporary folder, never committed, deleted after each size). For each size, three real
`llmtui run`s of the tiny pretrain task (bench_train's, 3 steps), launch to the first logged step:
streaming (`dataset.streaming = true`), cold (a fresh data cache: the run tokenizes the corpus;
the rank's "tokenizing" phase gives the cold throughput) and warm (the cache the cold run wrote).
The rank's peak resident memory is polled every 0.2 s, alone and with its tokenizing workers.
Then LLaMA-Factory's own data preparation of the same file (stage pt, cutoff 512,
preprocessing_num_workers 2, fresh datasets cache: `get_dataset` timed in its venv, made as by
bench_peer.py) side by side; when that venv cannot be made, one line says why.
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
    from tuiapp.core.config.recipe import parse_recipe
    from tuiapp.core.data.datasets import load_records
    from tuiapp.trainer.dataset.data import build_datasets

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

    from tuiapp.core.config.recipe import parse_recipe
    from tuiapp.trainer.dataset.data import cache_key

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
        out.append("Cache key stability (`tuiapp.trainer.dataset.data.cache_key` of one tokenizer, an SFT recipe on demo:facts): "
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


def corpus_recipe(corpus: Path, streaming: bool) -> str:
    """The tiny pretrain run of the benchmarks (bench_train's task), on `corpus`, a few steps."""
    text = common.recipe_toml({"name": "corpus", "data": str(corpus), "format": "text", "method": "pretrain",
                               "max_seq_len": 512, "steps": FIRST_STEP_STEPS, "micro_batch": 8, "lr": 3e-3})
    if streaming:
        text = text.replace('format = "text"\n', 'format = "text"\nstreaming = true\n')
    # a cold build of a 4 GB corpus is one long phase: not a hang
    return text + "startup_timeout_s = 7200\n"


FIRST_STEP_STEPS = 3


def _anon(pid: int) -> int:
    """Resident anonymous memory (RssAnon): RSS less the pages of mapped files (the memory-mapped
    Arrow files a process reads count in its RSS but are page cache the kernel can take back)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _tree_rss(process: psutil.Process) -> tuple[int, int, int, int]:
    """(RSS of the process, of it and its children, RssAnon of the process, of it and its children)."""
    own = process.memory_info().rss
    own_anon = _anon(process.pid)
    kids = kids_anon = 0
    for child in process.children(recursive=True):
        try:
            kids += child.memory_info().rss
            kids_anon += _anon(child.pid)
        except psutil.Error:
            pass
    return own, own + kids, own_anon, own_anon + kids_anon


def first_step(corpus: Path, work: Path, env: dict, streaming: bool, timeout: float) -> dict:
    """`llmtui run` of the tiny pretrain recipe on `corpus`, launch to its first logged step; the
    rank's phases (when it tokenized) and its peak resident memory, alone and with its workers."""
    from tuiapp.core.run_folder import rundir

    work.mkdir(parents=True, exist_ok=True)
    recipe = work / "recipe.toml"
    recipe.write_text(corpus_recipe(corpus, streaming))
    runs = work / "runs"
    argv = [*common.llmtui_command(), "run", str(recipe), "--runs-dir", str(runs)]
    phases: dict[str, float] = {}
    peaks = [0, 0, 0, 0]
    rank = None
    run_dir = None
    first = None
    completed = False
    with open(work / "cli.log", "wb") as log:
        t0 = time.time()
        proc = subprocess.Popen(argv, cwd=common.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                if run_dir is None and runs.is_dir():
                    run_dir = next((p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")), None)
                if run_dir is not None:
                    try:
                        phase = json.loads(rundir.phase_path(run_dir, 0).read_text())
                        phases.setdefault(phase["phase"], phase["since"])
                        if rank is None or rank.pid != phase.get("pid"):
                            rank = psutil.Process(phase["pid"])
                    except (OSError, ValueError, KeyError, psutil.Error):
                        pass
                    if first is None:
                        ev = {e.get("event"): e for e in common.read_jsonl(run_dir / "events.jsonl")}
                        if "first_step" in ev:
                            first = ev["first_step"]["time"]
                if rank is not None:
                    try:
                        peaks = [max(a, b) for a, b in zip(peaks, _tree_rss(rank), strict=True)]
                    except psutil.Error:
                        pass
                time.sleep(0.2)
            completed = proc.poll() is not None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if not completed:
                common.kill_run(run_dir)
    if run_dir is not None and first is None:
        ev = {e.get("event"): e for e in common.read_jsonl(run_dir / "events.jsonl")}
        first = ev.get("first_step", {}).get("time")
    tokenizing = None
    if "tokenizing" in phases:
        after = [t for t in phases.values() if t > phases["tokenizing"]]
        tokenizing = (min(after) - phases["tokenizing"]) if after else None
    return {"ok": proc.returncode == 0 and first is not None, "ttfs": (first - t0) if first else None,
            "tokenizing_s": tokenizing, "rank_mb": peaks[0] / 1e6 or None, "tree_mb": peaks[1] / 1e6 or None,
            "rank_anon_mb": peaks[2] / 1e6 or None, "tree_anon_mb": peaks[3] / 1e6 or None,
            "phases": {k: round(v - t0, 2) for k, v in phases.items()},
            "log": common._tail(work / "cli.log") + ("\n" + common._tail(run_dir / "stdout.log") if run_dir else "")}


# Runs in LLaMA-Factory's venv: its dataset building alone (load the JSON lines, align, tokenize and
# group into blocks for stage pt), as `llamafactory-cli train` does before training.
PEER_DATA = r"""
import importlib.machinery, json, sys, time, types
stub = types.ModuleType("torchaudio")  # see bench_peer.PEER_RUNNER
stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
sys.modules["torchaudio"] = stub
from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer
model_args, data_args, training_args, finetuning_args, _ = get_train_args(json.load(open(sys.argv[1])))
tokenizer_module = load_tokenizer(model_args)
template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
started = time.perf_counter()
module = get_dataset(template, model_args, data_args, training_args, stage="pt", **tokenizer_module)
print(json.dumps({"seconds": time.perf_counter() - started, "rows": len(module["train_dataset"])}))
"""


def peer_preprocess(corpus: Path, model_dir: Path, work: Path, env: dict, timeout: float) -> dict:
    """LLaMA-Factory's pretraining data preparation of `corpus`, 2 preprocessing workers, fresh caches."""
    import bench_peer

    work.mkdir(parents=True, exist_ok=True)
    (work / "data").mkdir(exist_ok=True)
    (work / "data" / "dataset_info.json").write_text(json.dumps(
        {"corpus": {"file_name": str(corpus), "columns": {"prompt": "text"}}}))
    args = {"model_name_or_path": str(model_dir), "stage": "pt", "do_train": True, "finetuning_type": "full",
            "dataset": "corpus", "dataset_dir": str(work / "data"), "template": "chatml", "cutoff_len": 512,
            "preprocessing_num_workers": PEER_WORKERS, "overwrite_cache": True, "output_dir": str(work / "out"),
            "report_to": "none", "per_device_train_batch_size": 8, "bf16": False, "fp16": False}
    (work / "args.json").write_text(json.dumps(args))
    (work / "runner.py").write_text(PEER_DATA)
    peer_env = {**env, "HF_DATASETS_CACHE": str(work / "hf-datasets"), "CUDA_VISIBLE_DEVICES": "",
                "DISABLE_VERSION_CHECK": "1", "WANDB_DISABLED": "true"}
    argv = [str(bench_peer.PEER_PYTHON), str(work / "runner.py"), str(work / "args.json")]
    try:
        result, peaks = _peak_rss(argv, peer_env, work / "peer.log", timeout)
    except RuntimeError as exc:
        return {"ok": False, "error": str(exc), "log": common._tail(work / "peer.log")}
    return {"ok": True, "seconds": result["seconds"], "rows": result["rows"], "rank_mb": peaks[0] / 1e6,
            "tree_mb": peaks[1] / 1e6, "rank_anon_mb": peaks[2] / 1e6, "tree_anon_mb": peaks[3] / 1e6}


PEER_WORKERS = 2


def _peak_rss(argv: list[str], env: dict, log_path: Path, timeout: float) -> tuple[dict, list[int]]:
    """(the child's last JSON line, its peaks as _tree_rss gives them, in bytes)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=log_path.parent,
                                start_new_session=True)
        peaks = [0, 0, 0, 0]
        parent = psutil.Process(proc.pid)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    peaks = [max(a, b) for a, b in zip(peaks, _tree_rss(parent), strict=True)]
                except psutil.Error:
                    pass
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    out = proc.stdout.read().strip().splitlines()
    if proc.returncode != 0 or not out:
        raise RuntimeError(f"exit {proc.returncode}")
    return json.loads(out[-1]), peaks


def corpus_scaling(sizes_mb: list[int], peer: bool = True, log=print) -> dict:
    """For each size: streaming, cold and warm first steps of `llmtui run`, then LLaMA-Factory's
    preprocessing of the same file (when its venv can be made)."""
    work = common.temp_dir("corpus")
    rows = []
    peer_note = None
    try:
        model_dir = common.ensure_model(work / "cache")
        env = common.bench_env(work / "cache", work / "hf-datasets")
        if peer:
            import bench_peer

            peer_note = bench_peer.ensure_peer()
            if peer_note:
                log(f"LLaMA-Factory skipped: {peer_note}")
            else:
                peer_note = bench_peer.peer_version()
        for size in sizes_mb:
            corpus = work / f"c4-{size}mb.jsonl"
            docs = make_corpus(corpus, size)
            row = {"mb": size, "docs": docs, "bytes": corpus.stat().st_size}
            timeout = 600 + size * 3  # ~1.5 MB/s under load, twice over
            try:
                log(f"corpus {size} MB ({docs:,} documents): streaming first step")
                row["streaming"] = first_step(corpus, work / f"stream-{size}", env, True, 600)
                log(f"corpus {size} MB: streaming: {json.dumps(_summary(row)['streaming'])}")
                common.remove(work / "cache" / "data")
                log(f"corpus {size} MB: cold first step (tokenizing into a fresh cache)")
                row["cold"] = first_step(corpus, work / f"cold-{size}", env, False, timeout)
                log(f"corpus {size} MB: cold: {json.dumps(_summary(row)['cold'])}")
                log(f"corpus {size} MB: warm first step")
                row["warm"] = first_step(corpus, work / f"warm-{size}", env, False, 600)
                log(f"corpus {size} MB: warm: {json.dumps(_summary(row)['warm'])}")
                for key in ("streaming", "cold", "warm"):
                    if not row[key]["ok"]:
                        log(f"corpus {size} MB: {key} run failed:\n{row[key]['log']}")
                if peer and not bench_peer.ensure_peer():
                    common.remove(work / "cache" / "data")  # done with: its disk goes to the peer's datasets cache
                    log(f"corpus {size} MB: LLaMA-Factory's preprocessing, {PEER_WORKERS} workers")
                    row["peer"] = peer_preprocess(corpus, model_dir, work / f"peer-{size}", env, timeout * 2)
                    if not row["peer"]["ok"]:
                        log(f"corpus {size} MB: LLaMA-Factory failed: {row['peer']}")
                log(f"corpus {size} MB: {json.dumps(_summary(row))}")
            except KeyboardInterrupt:
                rows.append(row)
                raise
            finally:
                if row not in rows:
                    rows.append(row)
                corpus.unlink(missing_ok=True)
                common.remove(work / "cache" / "data")
                for sub in ("stream", "cold", "warm", "peer"):
                    common.remove(work / f"{sub}-{size}")
    finally:
        common.remove(work)
    return {"rows": rows, "peer": peer_note, "markdown": corpus_markdown(rows, peer_note)}


def _summary(row: dict) -> dict:
    out = {"mb": row["mb"], "docs": row["docs"]}
    for key in ("streaming", "cold", "warm", "peer"):
        if key in row:
            out[key] = {k: v for k, v in row[key].items() if k != "log"}
    return out


def corpus_markdown(rows: list[dict], peer_note: str | None) -> str:
    def get(row, key, field):
        return (row.get(key) or {}).get(field)

    table = []
    for r in rows:
        mb = r["bytes"] / 1e6
        tok, peer = get(r, "cold", "tokenizing_s"), get(r, "peer", "seconds")
        table.append([
            f"{r['mb']:,} MB", f"{r['docs']:,}", fmt(tok, ",.0f"), fmt(mb / tok if tok else None, ".2f"),
            fmt(peer, ",.0f"), fmt(mb / peer if peer else None, ".2f"),
            fmt(get(r, "cold", "ttfs"), ",.1f"), fmt(get(r, "warm", "ttfs"), ".1f"), fmt(get(r, "streaming", "ttfs"), ".1f"),
            fmt(get(r, "cold", "rank_mb"), ",.0f"), fmt(get(r, "cold", "tree_mb"), ",.0f"),
            fmt(get(r, "cold", "tree_anon_mb"), ",.0f"),
            fmt(get(r, "warm", "rank_mb"), ",.0f"), fmt(get(r, "streaming", "rank_mb"), ",.0f"),
            fmt(get(r, "peer", "tree_mb"), ",.0f"), fmt(get(r, "peer", "tree_anon_mb"), ",.0f"),
        ])
    out = [md_table(["corpus", "documents", "llmtui tokenizing s (cold)", "llmtui MB/s",
                     f"LLaMA-Factory s ({PEER_WORKERS} workers)", "LF MB/s", "first step s: cold", "warm", "streaming",
                     "peak rank MB: cold", "cold + workers", "(anon)", "warm", "streaming", "LF peak MB (+ workers)",
                     "(anon)"], table)]
    out.append("")
    out.append(f"Peer: {peer_note or 'not run'}.")
    for r in rows:
        out.append(f"- {r['mb']:,} MB phases (s after launch): " + "; ".join(
            f"{key}: {get(r, key, 'phases')}" for key in ("cold", "warm", "streaming") if key in r))
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--corpus-mb", default="", help="sizes of generated c4 corpora, e.g. 1024,4096")
    parser.add_argument("--no-peer", action="store_true", help="--corpus-mb without LLaMA-Factory's preprocessing")
    parser.add_argument("--json", default="", help="--corpus-mb: also write the raw figures to this file")
    args = parser.parse_args(argv)
    common.exit_on_sigterm()
    if args.corpus_mb:
        skipped = common.missing_data_message(common.C4)
        if skipped:
            print(skipped)
            return 0
        sizes = [int(v) for v in args.corpus_mb.split(",") if v.strip()]
        result = corpus_scaling(sizes, peer=not args.no_peer, log=lambda m: print(m, file=sys.stderr, flush=True))
        print(result["markdown"])
        if args.json:
            Path(args.json).write_text(json.dumps({k: v for k, v in result.items() if k != "markdown"}, indent=1))
        return 0
    result = run_all(args.quick, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(result["markdown"])
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
