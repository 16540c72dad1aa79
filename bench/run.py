"""The benchmark suite of llmtui, one command:

    .venv/bin/python bench/run.py [--quick]

Runs every benchmark on this machine, in one go, and writes bench/RESULTS.md:
  1. training throughput and time to first step, `llmtui run` vs a plain Trainer + DeepSpeed
     script (bench/bench_train.py, bench/baseline_train.py), with a profile of why;
  2. overhead of llmtui itself: the following CLI's CPU and memory, no torch in it, TTFS ratio
     (bench/bench_overhead.py; it reuses the runs of 1.);
  3. data: tokenization throughput and cache reuse (bench/bench_data.py);
  4. the TUI benchmarks (bench/bench_ui.py) when that script is present.
About 8 minutes on a quiet 2-core CPU machine (--quick: about 3); when other processes take
the cores it runs longer and RESULTS.md says so. Each script also runs on its own and prints
its markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_data  # noqa: E402
import bench_overhead  # noqa: E402
import bench_train  # noqa: E402
import common  # noqa: E402
from common import fmt, md_table  # noqa: E402

RESULTS = common.BENCH / "RESULTS.md"
UI_SCRIPT = common.BENCH / "bench_ui.py"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_ui(quick: bool, timeout: float = 900) -> dict:
    if not UI_SCRIPT.exists():
        return {"markdown": "_bench/bench_ui.py is not present: no UI benchmark._", "ok": None, "argv": None}
    argv = [common.PYTHON, str(UI_SCRIPT)]
    if quick and "--quick" in UI_SCRIPT.read_text(errors="replace"):
        argv.append("--quick")
    log("UI benchmark: " + " ".join(argv[1:]))
    t0 = time.time()
    try:
        out = subprocess.run(argv, cwd=common.ROOT, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"markdown": f"_bench_ui.py did not finish in {timeout:.0f} s._", "ok": False, "argv": argv,
                "wall": time.time() - t0}
    text = out.stdout.strip()
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        text += f"\n\n_bench_ui.py exited with {out.returncode}:_\n\n```\n{tail}\n```"
    return {"markdown": text, "ok": out.returncode == 0, "argv": argv, "wall": time.time() - t0}


# ------------------------------------------------------------------ targets and findings


def _summary(train: dict, name: str) -> dict | None:
    for run in train["runs"]:
        if run["task"]["name"] == name and "skipped" not in run:
            return run
    return None


def targets_table(train: dict, overhead: dict, data: dict) -> str:
    rows = []
    for name in ("pretrain", "sft"):
        run = _summary(train, name)
        target = bench_train.TASKS[name]["target"]
        if run is None:
            rows.append([f"{name}: llmtui / baseline tokens/s", "skipped (no data)", f"≥ {target}×", "—"])
            continue
        a, b = run["summary"]["llmtui"], run["summary"]["baseline"]
        r = bench_train.ratio(a["tok_s"], b["tok_s"])
        rows.append([f"{name}: llmtui / baseline non-padding tokens/s", fmt(r, ".2f") + "×", f"≥ {target}×",
                     _verdict(r is not None and r >= target)])
    samples = overhead["analysis"]["samples"]
    if samples:
        cpu = max((s["cpu_pct_training"] for s in samples if s["cpu_pct_training"] is not None), default=None)
        rss = max((s["rss_max_mb"] for s in samples if s["rss_max_mb"] is not None), default=None)
        mapped = any(s["torch_mapped"] for s in samples) or any(s["torch_mapped"] is None for s in samples)
        rows.append(["`llmtui run` CLI CPU while training (max over runs)", fmt(cpu, ".2f") + "% of a core",
                     "< 1%", _verdict(cpu is not None and cpu < 1.0)])
        rows.append(["`llmtui run` CLI RSS (max)", fmt(rss, ".0f") + " MB", "< 150 MB",
                     _verdict(rss is not None and rss < 150)])
        heavy = sorted({h for imp in overhead["imports"] for h in imp["heavy"]})
        rows.append(["CLI never loads torch (maps + importtime)",
                     "no torch" if not mapped and not heavy else f"loaded: {', '.join(heavy) or 'mapped'}", "no torch",
                     _verdict(not mapped and not heavy)])
    for t in overhead["analysis"]["ttfs"]:
        r = bench_train.ratio(t["llmtui_warm"], t["baseline_warm"])
        rows.append([f"{t['task']}: time to first step, llmtui / baseline (warm)", fmt(r, ".2f") + "×", "≤ 1.1×",
                     _verdict(r is not None and r <= 1.1)])
    for d in data["results"]:
        if "skipped" in d:
            continue
        rows.append([f"data {d['task']}: 2nd build_datasets with the same cache", f"{d['second_s']:.3f} s vs "
                     f"{d['first_s']:.2f} s", "≪ 1st", _verdict(d["second_s"] < 0.2 * d["first_s"])])
    return md_table(["what", "measured", "target", ""], rows)


def _sum(*values):
    return sum(values) if all(v is not None for v in values) else None


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def contention_note(train: dict) -> str | None:
    """A warning when the trainer ranks did not get their cores (other load on the machine).
    CPU runs only: a rank that drives a GPU does not keep its CPU threads busy."""
    if not common.gpu_info().startswith("none"):
        return None
    starved = []
    for run in train["runs"]:
        for tool, s in (run.get("summary") or {}).items():
            util, threads = s.get("cpu_util"), s.get("threads")
            try:
                wanted = 100 * int(threads)
            except (TypeError, ValueError):
                wanted = 100 * (os.cpu_count() or 1)
            if util is not None and util < 0.8 * wanted:
                starved.append(f"{run['task']['name']}/{tool} {util:.0f}% of {wanted}%")
    if not starved:
        return None
    return ("**Warning: other processes took the cores during this run** (trainer rank CPU use: "
            + ", ".join(starved) + "). Tokens/s and times of those runs are noise, not llmtui or the "
            "baseline; rerun on a quiet machine.")


def findings(train: dict, overhead: dict, data: dict) -> str:
    """What the numbers say, computed from this run's numbers (observations from building the suite
    are marked as such)."""
    out = []
    note = contention_note(train)
    if note:
        out.append(note)
    sft = _summary(train, "sft")
    if sft is not None:
        a, b = sft["summary"]["llmtui"], sft["summary"]["baseline"]
        r = bench_train.ratio(a["tok_s"], b["tok_s"])
        target = bench_train.TASKS["sft"]["target"]
        prof = {p["layout"]: p for p in sft.get("profile") or []}
        text = (f"**SFT: {fmt(r, '.2f')}× the baseline end to end (target {target}×, "
                f"{'met' if r is not None and r >= target else 'missed'}).** The baseline spends "
                f"{fmt(100 * (b['padding'] or 0), '.0f')}% of its positions on padding"
                + (f", llmtui {fmt(100 * prof['llmtui']['padding'], '.0f')}% (profile)" if "llmtui" in prof else "")
                + "; both see the "
                f"same non-padding tokens per step ({fmt(a['tokens_per_step'], ',.0f')} vs "
                f"{fmt(b['tokens_per_step'], ',.0f')}) and the same loss curve (final "
                f"{fmt(a['final_loss'], '.3f')} vs {fmt(b['final_loss'], '.3f')}). ")
        if "llmtui" in prof and "baseline" in prof:
            ours, theirs = prof["llmtui"], prof["baseline"]
            compute_ratio = bench_train.ratio(ours["tok_s"], theirs["tok_s"])
            text += (f"Compute alone (profile: same examples, no Trainer/DeepSpeed): llmtui's layout "
                     f"(`{ours['collator']}`, {ours['shape']}, {fmt(100 * ours['padding'], '.0f')}% padding) "
                     f"runs {fmt(ours['tok_s'], ',.0f')} tok/s, the padded batch ({theirs['shape']}) "
                     f"{fmt(theirs['tok_s'], ',.0f')} tok/s ({fmt(compute_ratio, '.2f')}×); counted from the "
                     f"shapes they need {fmt(ours['gflop_per_ktok'], '.1f')} and {fmt(theirs['gflop_per_ktok'], '.1f')} "
                     f"GFLOP per 1k tokens. ")
            other = next((p for k, p in prof.items() if k not in ("llmtui", "baseline")), None)
            if other is not None:
                gain = bench_train.ratio(other["tok_s"], ours["tok_s"])
                flattened_other = other["collator"] == "DataCollatorWithFlattening"
                text += (f"The other packed layout, {other['layout']} ({other['shape']}), needs "
                         f"{fmt(other['gflop_per_ktok'], '.1f')} GFLOP per 1k tokens "
                         f"({fmt(100 * other['attention_share'], '.0f')}% attention) and runs "
                         f"{fmt(other['tok_s'], ',.0f')} tok/s, {fmt(gain, '.2f')}× llmtui's. ")
                if flattened_other and (gain or 0) < 1:
                    text += ("One flattened row costs (Σ lengths)² in attention with sdpa's block-diagonal "
                             "mask, more than the padding it saves; rows of ≤ max_seq_len avoid that (flattening "
                             "pays only with flash-attention's varlen kernels). ")
                elif not flattened_other and (gain or 0) > 1.05:
                    text += ("**Next step** (`tuiapp/trainer/dataset/data.py:make_collator`): without varlen attention "
                             "kernels, pack each micro batch into rows of ≤ max_seq_len (first-fit decreasing, "
                             "position_ids restarting per example, a separate pad segment; `binpack_collator` in "
                             "bench/bench_train.py is a reference) instead of one flattened row, whose "
                             "block-diagonal sdpa mask costs (Σ lengths)² in attention. ")
            if r is not None and r < target and compute_ratio is not None and compute_ratio >= target:
                text += (f"The data layout alone gives {compute_ratio:.2f}×, so the end-to-end gap is per-step "
                         "cost outside the model (Trainer, DeepSpeed, callbacks: see their cost in section 2) or load "
                         "from other processes (see the rank CPU use); profile that first.")
        out.append(text)
    pre = _summary(train, "pretrain")
    if pre is not None:
        a, b = pre["summary"]["llmtui"], pre["summary"]["baseline"]
        r = bench_train.ratio(a["tok_s"], b["tok_s"])
        out.append(f"**Pretrain ({fmt(r, '.2f')}× the baseline, target 1.0×).** llmtui trains on full "
                   f"{pre['task']['max_seq_len']}-token blocks of concatenated documents (no padding, no token "
                   f"thrown away); the docs-style baseline truncates each document to max_seq_len (dropping the "
                   f"rest of long documents) and pads the short ones: "
                   f"{fmt(100 * (b['padding'] or 0), '.0f')}% of its positions are padding, and every padded row "
                   f"carries an attention mask, so sdpa cannot take its causal fast path. Loss curves are close "
                   f"(final {fmt(a['final_loss'], '.3f')} vs {fmt(b['final_loss'], '.3f')}), not identical: the "
                   f"token streams differ (whole corpus in blocks vs the first {pre['task']['max_seq_len']} tokens "
                   f"of each document, which the baseline repeats after one pass over 300 documents).")
    ttfs = overhead["analysis"]["ttfs"]
    if ttfs:
        parts = []
        for t in ttfs:
            pa, pb = t["phases_llmtui"], t["phases_baseline"]
            r = bench_train.ratio(t["llmtui_warm"], t["baseline_warm"])
            line = (f"{t['task']}: llmtui {fmt(t['llmtui_warm'])} s vs baseline {fmt(t['baseline_warm'])} s "
                    f"({fmt(r, '.2f')}×)")
            cli = pa.get("invoke→launched")
            ours_start = _sum(cli, pa.get("launched→started"))
            if ours_start is not None and pb.get("invoke→started") is not None:
                line += (f": to the Trainer's start {ours_start:.1f} s vs {pb['invoke→started']:.1f} s (of which "
                         f"llmtui's CLI + supervisor {fmt(cli, '.2f')} s), first step "
                         f"{fmt(pa.get('started→first_step'), '.1f')} s vs {fmt(pb.get('started→first_step'), '.1f')} s")
            parts.append(line)
        imports = overhead.get("rank_imports") or {}
        rank_l = next((v for k, v in imports.items() if k.startswith("llmtui rank")), None)
        rank_b = next((v for k, v in imports.items() if k.startswith("baseline rank")), None)
        text = "**Time to first step.** " + "; ".join(parts) + "."
        if rank_l is not None and rank_b is not None:
            text += (f" The ranks' imports alone take {rank_l:.1f} s (llmtui: transformers Trainer, datasets, "
                     f"pydantic for the recipe) vs {rank_b:.1f} s (baseline).")
        text += (" llmtui's own additions are the CLI (recipe validation, a full read of the dataset for the "
                 "checks, preflight) and the supervisor process before the DeepSpeed launcher both tools run; "
                 "the rest is the same launcher → rank chain.")
        out.append(text)
    if common.OPS_BUILD.get("built"):
        out.append(
            f"**DeepSpeed's CPU comm op is JIT-compiled at a CPU rank's start when TORCH_EXTENSIONS_DIR has no "
            f"matching build** ({common.OPS_BUILD['seconds']:.0f} s here, once per session; the tables exclude "
            "it). llmtui's first run on a machine pays it in its time to first step, like any DeepSpeed "
            "script. Worse, the default folder (~/.cache/torch_extensions) is shared by every venv: two venvs "
            "(e.g. a checkout and CI) rebuild it in turn because their source paths differ, each rebuild "
            "holding a lock that every starting rank waits on, and a rank killed during the build (a stop "
            "in the first seconds) leaves a stale lock on which every later run hangs forever (seen while "
            "building this suite). Fix (`tuiapp/core/lifecycle/supervisor.py:_rank_env`): set TORCH_EXTENSIONS_DIR "
            "to a per-venv folder under the llmtui cache, e.g. `<cache>/torch_extensions/<hash of "
            "sys.prefix>`, unless the user set it; and have preflight warn about a `lock` file there older "
            "than a few minutes with no compiler running.")
    leaks = [run["summary"]["llmtui"].get("shm_left_mb") for run in train["runs"] if "skipped" not in run]
    leaks = [x for x in leaks if x]
    if leaks:
        out.append(
            f"**DeepSpeed's CPU comm op leaves {max(leaks):.0f} MB per rank in /dev/shm (RAM) after a run** "
            "(`/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_<rank>`, never unlinked). Each run has "
            "its own master port, so they pile up until reboot (tests and benchmarks once left 291 of them, "
            "19 GB of a 24 GB machine). llmtui's supervisor removes its run's buffers once the ranks are gone "
            "(tuiapp/core/machine/shm.py); the table shows what each tool left, and the benchmark removes the rest.")
    fp = data.get("fingerprint")
    if fp and len(set(fp.values())) > 1:
        out.append("**Tokenized-data cache key depends on tokenizer call state.** "
                   "`tuiapp.trainer.dataset.data.tokenizer_fingerprint` hashes `backend_tokenizer.to_str()`, which "
                   "serialises the backend's current truncation/padding settings: the same tokenizer gives key "
                   f"`{fp['fresh']}` fresh and `{fp['after_truncating_call']}` after one call with "
                   "truncation=True, so such a tokenizer misses the cache and writes a second copy. Ranks load "
                   "a fresh tokenizer, so runs hit the cache today; fix: `json.loads(backend.to_str())`, drop "
                   "`truncation` and `padding`, hash the rest.")
    return "\n\n".join(out)


# ------------------------------------------------------------------ main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Run every llmtui benchmark and write bench/RESULTS.md.")
    parser.add_argument("--quick", action="store_true", help="1 repetition, fewer steps (about 3 minutes)")
    parser.add_argument("--reps", type=int, help="training repetitions per tool (default 3; --quick 1)")
    parser.add_argument("--steps", type=int, help="optimizer steps per training run (default 40; --quick 25)")
    parser.add_argument("--skip-ui", action="store_true")
    parser.add_argument("--out", default=str(RESULTS), help="where to write the results (default bench/RESULTS.md)")
    args = parser.parse_args(argv)
    common.exit_on_sigterm()

    t0 = time.time()
    info = common.machine_info()
    log(f"machine: {info['cpu']}, {info['cores']}, load {info['load average at start']}")
    durations = {}

    def timed(name, fn):
        start = time.time()
        try:
            return fn()
        finally:
            durations[name] = time.time() - start
            log(f"{name}: {durations[name]:.0f} s")

    data = timed("data", lambda: bench_data.run_all(args.quick, log=log))
    train = timed("training", lambda: bench_train.run_all(args.quick, args.reps, args.steps, log=log))
    overhead = timed("overhead", lambda: bench_overhead.run_all(args.quick, train_runs=train["runs"], log=log))
    ui = {"markdown": "_skipped (--skip-ui)._"} if args.skip_ui else timed("ui", lambda: run_ui(args.quick))
    elapsed = time.time() - t0
    end_load = " ".join(f"{x:.2f}" for x in os.getloadavg())

    command = "  ".join(["`.venv/bin/python bench/run.py" + (" --quick" if args.quick else "")
                         + (f" --reps {args.reps}" if args.reps else "") + (f" --steps {args.steps}" if args.steps else "")
                         + "`"])
    doc = [
        "# llmtui benchmarks",
        "",
        f"Made by {command} in {elapsed / 60:.1f} minutes ("
        + ", ".join(f"{k} {v / 60:.1f}" for k, v in durations.items()) + ")"
        + (" (--quick: one repetition, fewer steps — indicative only)" if args.quick else "") + ". "
        "Every number below comes from this one run on this one machine, the tools side by side. "
        + (f"DeepSpeed's CPU comm op was JIT-built once into the session's own TORCH_EXTENSIONS_DIR before "
           f"any timing ({common.OPS_BUILD['seconds']:.0f} s), so both tools start with it built, as after a "
           "user's first run. " if common.OPS_BUILD.get("built") else "")
        + "Load average at the start / end: " + info["load average at start"] + " / " + end_load
        + " (on a busy machine the throughput numbers are noise; rerun on a quiet one). The section "
        "\"Peer: LLaMA-Factory\" is made by its own command, `.venv/bin/python bench/bench_peer.py --write` "
        "(about half an hour), and kept here as it was.",
        "",
        "## Machine",
        "",
        common.machine_markdown(info),
        "",
        "## Targets",
        "",
        targets_table(train, overhead, data),
        "",
        "## Findings",
        "",
        findings(train, overhead, data),
        "",
        "## 1. Training throughput: `llmtui run` vs plain Trainer + DeepSpeed",
        "",
        train["markdown"],
        "",
        "## 2. Overhead of llmtui itself",
        "",
        overhead["markdown"],
        "",
        "## 3. Data: tokenization and its cache",
        "",
        data["markdown"],
        "",
        "## 4. UI",
        "",
        ui["markdown"],
        "",
        "## Reproduce",
        "",
        "```",
        "make install                        # or the venv of the README",
        ".venv/bin/python bench/run.py       # everything, writes bench/RESULTS.md (~8 min; --quick ~3)",
        ".venv/bin/python bench/bench_train.py [--quick] [--tasks pretrain,sft] [--reps N] [--steps N]",
        ".venv/bin/python bench/bench_overhead.py [--quick]",
        ".venv/bin/python bench/bench_data.py [--quick]",
        ".venv/bin/python bench/bench_ui.py [--quick]",
        ".venv/bin/python bench/bench_peer.py [--reps N] [--rows unpacked,best] [--write] [--profile ROW]  # vs LLaMA-Factory",
        "```",
        "",
        f"Data: `{common.DATA_DIR}` (LLaMA-Factory demo files; set LLMTUI_BENCH_DATA to move it; benchmarks "
        "that need it are skipped without it). Runs, caches and models go to temporary folders "
        "(LLMTUI_CACHE and HF_DATASETS_CACHE point there), removed at the end.",
        "",
    ]
    peer = _kept_section(Path(args.out), "## Peer: LLaMA-Factory")  # bench/bench_peer.py's; too long to rerun here
    Path(args.out).write_text("\n".join(doc + ([peer] if peer else [])), encoding="utf-8")
    log(f"wrote {args.out} in {elapsed / 60:.1f} min")
    print(Path(args.out).read_text())
    return 0


def _kept_section(path: Path, heading: str) -> str | None:
    """A section of the current RESULTS.md, from its heading to the next '## ' heading."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    if heading not in text:
        return None
    section = heading + text.split(heading, 1)[1]
    end = section.find("\n## ", 1)
    return (section if end < 0 else section[: end + 1]).rstrip("\n") + "\n"


if __name__ == "__main__":
    sys.exit(main())
