"""Training throughput: `llmtui run` against a plain Trainer + DeepSpeed script, side by side.

    .venv/bin/python bench/bench_train.py [--quick] [--reps N] [--steps N] [--tasks pretrain,sft]

Same model (the bundled tiny Llama), same data (/work/shared/data: c4_demo.jsonl for pretrain,
alpaca_en_demo.json for SFT), same optimisation settings (micro batch, lr, cosine schedule,
3% warmup, seed, max_seq_len, steps), one CPU rank each, both launched by the real DeepSpeed
launcher. What differs is what each tool does with the data: llmtui packs (pretrain: fixed
blocks of concatenated documents; SFT: padding-free flattening of the micro batch), the
baseline pads to the longest sequence in the batch (the HF docs' collators).

Reported: non-padding tokens/s (after a warm-up), time to first optimizer step (from the
command's invocation), wall time, loss curves, and a profile of the steps of each data layout
(compute only, no framework). The callbacks' per-step cost is bench_overhead.py's (`--callbacks`).

Why the tiny model: it is what llmtui bundles and what trains here (2 CPU cores) fast enough for
3 repetitions × 2 tools × 2 tasks in the time budget; a bigger model would only shrink the
share of per-step framework costs, which is exactly what this benchmark wants to expose.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import fmt, md_table, median  # noqa: E402

TASKS = {
    "pretrain": {"name": "pretrain", "file": common.C4, "format": "text", "method": "pretrain",
                 "micro_batch": 8, "max_seq_len": 512, "lr": 3e-3, "target": 1.0},
    "sft": {"name": "sft", "file": common.ALPACA, "format": "alpaca", "method": "sft",
            "micro_batch": 8, "max_seq_len": 1024, "lr": 3e-3, "target": 1.5},
}
FULL = {"steps": 40, "reps": 3, "profile_batches": 5}
QUICK = {"steps": 25, "reps": 1, "profile_batches": 3}


def warmup_steps(steps: int) -> int:
    return max(2, steps // 10)


# ------------------------------------------------------------------ the runs


def bench_task(task: dict, reps: int, log=print) -> dict:
    """reps × (llmtui run, baseline), alternating which goes first; fresh caches at the start,
    so repetition 1 is a cold start for both (tokenization included) and the others are warm."""
    work = common.temp_dir(task["name"])
    cache, hf_cache = work / "cache", work / "hf-datasets"
    env = common.bench_env(cache, hf_cache)
    results = {"llmtui": [], "baseline": []}
    try:
        model_dir = common.ensure_model(cache)
        _repetitions(task, reps, work, env, model_dir, results, log)
    except BaseException:
        common.remove(work)
        raise
    # the caller removes `work` after profiling (the profile reuses the tokenized cache)
    return {"task": task, "results": results, "model_dir": str(model_dir), "work": work, "profile": None,
            "model": describe_model(model_dir, results["llmtui"])}


def _repetitions(task: dict, reps: int, work: Path, env: dict, model_dir: Path, results: dict, log) -> None:
    for rep in range(reps):
        order = ["llmtui", "baseline"] if rep % 2 == 0 else ["baseline", "llmtui"]
        for tool in order:
            where = work / f"{tool}-{rep}"
            if tool == "llmtui":
                result = common.run_llmtui(task, where, env)
            else:
                result = common.run_baseline(task, model_dir, where, env)
            result["rep"] = rep
            results[tool].append(result)
            status = "ok" if result["ok"] else f"FAILED (exit {result['returncode']})"
            log(f"  {task['name']} rep {rep + 1}/{reps} {tool:8s}: {status}, "
                f"ttfs {fmt(result['ttfs'])} s, wall {fmt(result['wall'])} s, "
                f"{fmt(common.throughput(result['rows'], warmup_steps(task['steps'])), '.0f')} tok/s")
            if not result["ok"]:
                log(result["log_tail"])


def describe_model(model_dir: Path, llmtui_results: list[dict]) -> str:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return "the bundled tiny model"
    params = next((r.get("params") for r in llmtui_results if r.get("params")), None)
    return (f"the bundled tiny {config.get('model_type', '?').capitalize()} (hidden {config.get('hidden_size')}, "
            f"{config.get('num_hidden_layers')} layers, {config.get('num_attention_heads')} heads, vocab "
            f"{config.get('vocab_size')}" + (f", {params / 1e6:.2f} M parameters" if params else "") + ")")


def summarize(run: dict) -> dict:
    task = run["task"]
    warm = warmup_steps(task["steps"])
    out = {}
    for tool, results in run["results"].items():
        ok = [r for r in results if r["ok"]]
        warm_runs = [r for r in ok if r["rep"] > 0] or ok
        steps = [t for r in ok for t in common.step_times(r["rows"], warm)]
        padded = None
        if tool == "baseline" and ok:
            rows = sorted(ok[0]["rows"], key=lambda r: r["step"])
            if rows and rows[-1].get("padded"):
                padded = 1.0 - rows[-1]["tokens"] / rows[-1]["padded"]
        cpu = [r["rank"].window(warm) for r in ok if r.get("rank") is not None]
        out[tool] = {
            "cpu_ms_per_ktok": median(c.get("cpu_ms_per_ktok") for c in cpu),
            "cpu_util": median(c.get("cpu_util") for c in cpu),
            "runs": len(results),
            "ok": len(ok),
            "tok_s": median(common.throughput(r["rows"], warm) for r in ok),
            "tok_s_all": [common.throughput(r["rows"], warm) for r in ok],
            "tok_s_best": common.best_of_reps([r["rows"] for r in ok], warm),
            "ttfs_warm": median(r["ttfs"] for r in warm_runs),
            "ttfs_cold": next((r["ttfs"] for r in ok if r["rep"] == 0), None),
            "ttfs_all": [r["ttfs"] for r in ok],
            "wall": median(r["wall"] for r in ok),
            "step_s": median(steps),
            "tokens_per_step": median(common.tokens_per_step(r["rows"], warm) for r in ok),
            "padding": padded,  # llmtui's metrics hold no padding figure: see the profile
            "final_loss": median(_final_loss(r["rows"]) for r in ok),
            "losses": _losses(ok[0]["rows"]) if ok else {},
            "phases": {k: median(r["phases"].get(k) for r in warm_runs) for k in (ok[0]["phases"] if ok else {})},
            "threads": next((r.get("threads") for r in ok if r.get("threads")), None),
            "cli": [r["cli"] for r in ok] if tool == "llmtui" else None,
            "shm_left_mb": median(r.get("shm_left") / 2**20 for r in ok if r.get("shm_left") is not None),
            "argv": results[0]["argv"] if results else None,
            "recipe": results[0].get("recipe") if results else None,
        }
    return out


def _final_loss(rows: list[dict], last: int = 5) -> float | None:
    losses = [r["loss"] for r in sorted(rows, key=lambda r: r["step"]) if isinstance(r.get("loss"), (int, float))]
    return sum(losses[-last:]) / len(losses[-last:]) if losses else None


def _losses(rows: list[dict]) -> dict:
    return {r["step"]: r["loss"] for r in rows if isinstance(r.get("loss"), (int, float))}


# ------------------------------------------------------------------ profile (why)


def profile_layouts(task: dict, model_dir: str, cache: Path, batches: int, seed: int = 0) -> list[dict]:
    """Optimizer steps of each tool's data layout, timed in this process without Trainer,
    DeepSpeed or callbacks: collate / forward / backward / optimizer, from the same initial
    model on the same random micro batches (the same example indices)."""
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        DataCollatorForSeq2Seq,
    )

    import baseline_train
    from tuiapp.core.config.recipe import parse_recipe
    from tuiapp.trainer.dataset.data import build_datasets, make_collator

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // task.get("ranks", 1)))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    recipe = parse_recipe(common.recipe_toml(task))
    ours, _ = build_datasets(recipe, tokenizer, cache)
    if task["method"] == "pretrain":
        theirs = baseline_train.pretrain_dataset(tokenizer, task["data"], task["max_seq_len"])
        their_collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    else:
        theirs = baseline_train.sft_dataset(tokenizer, task["data"], task["max_seq_len"])
        their_collator = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100)
    ours_collator = make_collator(recipe, tokenizer)  # as on a CPU rank (no varlen attention)
    layouts = [("llmtui", ours, ours_collator), ("baseline", theirs, their_collator)]
    if task["method"] != "pretrain":
        # the other packed layout, for comparison: one flattened row, or rows of ≤ max_seq_len
        if type(ours_collator).__name__ == "DataCollatorWithFlattening":
            layouts.append(("rows ≤ max_seq_len (bench binpack_collator)", ours,
                            binpack_collator(task["max_seq_len"], tokenizer.pad_token_id)))
        else:
            from transformers import DataCollatorWithFlattening

            layouts.append(("one flattened row (DataCollatorWithFlattening)", ours, DataCollatorWithFlattening()))
    collator_names = {name: _collator_name(c) for name, _, c in layouts}

    def new_model():
        torch.manual_seed(seed)
        if task["method"] == "pretrain":
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    # the layouts take turns batch by batch, so load from other processes hits them alike
    rng = random.Random(seed)
    size = min(len(d) for _, d, _ in layouts)
    picks = [rng.sample(range(size), task["micro_batch"]) for _ in range(batches + 1)]
    state = {}
    for name, _, _ in layouts:
        model = new_model().to(device)
        model.train()
        state[name] = {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=task["lr"]),
                       "times": {"collate": [], "forward": [], "backward": [], "optimizer": []},
                       "tokens": 0, "positions": 0, "shape": None, "flops": 0.0, "attn_flops": 0.0}
    for i, indices in enumerate(picks):
        for name, dataset, collator in layouts:
            st = state[name]
            model, optimizer = st["model"], st["optimizer"]
            sync()
            t0 = time.perf_counter()
            batch = collator([dataset[j] for j in indices])
            real_tokens = batch.pop("num_tokens", None)
            batch = {k: v.to(device) for k, v in batch.items()}
            t1 = time.perf_counter()
            loss = model(**batch).loss
            sync()
            t2 = time.perf_counter()
            loss.backward()
            sync()
            t3 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            t4 = time.perf_counter()
            if i == 0:
                continue  # first step: allocator and kernel warm-up
            for key, value in (("collate", t1 - t0), ("forward", t2 - t1), ("backward", t3 - t2),
                               ("optimizer", t4 - t3)):
                st["times"][key].append(value)
            if real_tokens is not None:
                st["tokens"] += int(real_tokens)
            elif "attention_mask" in batch:
                st["tokens"] += int(batch["attention_mask"].sum())
            else:  # as the Trainer counts non-padding tokens without an attention mask
                st["tokens"] += int((batch["input_ids"] != tokenizer.pad_token_id).sum())
            st["positions"] += int(batch["input_ids"].numel())
            st["shape"] = "×".join(str(d) for d in batch["input_ids"].shape)
            linear, attention = step_flops(model.config, *batch["input_ids"].shape)
            st["flops"] += linear + attention
            st["attn_flops"] += attention
    rows = []
    for name, _, _ in layouts:
        st = state[name]
        total = sum(sum(v) for v in st["times"].values())
        tokens, positions = st["tokens"], st["positions"]
        rows.append({
            "layout": name,
            "collator": collator_names[name],
            "shape": st["shape"],
            "tokens_per_batch": tokens / batches,
            "positions_per_batch": positions / batches,
            "padding": 1 - tokens / positions if positions else None,
            **{f"{k}_ms": 1000 * sum(v) / len(v) for k, v in st["times"].items()},
            "step_ms": 1000 * total / batches,
            "tok_s": tokens / total if total else None,
            "gflop_per_step": st["flops"] / batches / 1e9,
            "attention_share": st["attn_flops"] / st["flops"] if st["flops"] else None,
            "gflop_per_ktok": st["flops"] / tokens * 1000 / 1e9 if tokens else None,
        })
    return rows


def _collator_name(collator) -> str:
    name = getattr(collator, "__name__", None) or type(collator).__name__
    return "binpack_collator" if name == "collate" else name


def step_flops(config, rows: int, length: int) -> tuple[float, float]:
    """Model FLOPs of one training step (forward + backward ≈ 3 × forward) on a rows × length
    batch: (linear layers, attention scores and values). Attention is counted over the full
    length² of each row: with a mask (padding, or the block-diagonal mask of a packed row) the
    sdpa kernels available here compute every score, masked or not."""
    d, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    per_position = 2 * layers * (2 * d * heads * head_dim + 2 * d * kv * head_dim + 3 * d * config.intermediate_size)
    per_position += 2 * d * config.vocab_size
    linear = 3 * per_position * rows * length
    attention = 3 * layers * 4 * heads * head_dim * rows * length ** 2
    return float(linear), float(attention)


def binpack_collator(max_len: int, pad_id: int):
    """Rows of at most max_seq_len, for comparison when llmtui puts a micro batch in one
    flattened row: examples packed first-fit-decreasing, position_ids restarting per example (so
    attention stays inside each example, as with DataCollatorWithFlattening), rows padded to the
    longest row with a separate pad segment. Attention then costs Σ rows·len² instead of
    (Σ lengths)² for one flattened row."""
    import torch

    def collate(features):
        rows: list[list[dict]] = []
        for feature in sorted(features, key=lambda f: -len(f["input_ids"])):
            for row in rows:
                if sum(len(f["input_ids"]) for f in row) + len(feature["input_ids"]) <= max_len:
                    row.append(feature)
                    break
            else:
                rows.append([feature])
        width = max(sum(len(f["input_ids"]) for f in row) for row in rows)
        ids, labels, positions = [], [], []
        for row in rows:
            r_ids, r_labels, r_pos = [], [], []
            for f in row:
                n = len(f["input_ids"])
                r_ids += list(f["input_ids"])
                r_labels += [-100] + list(f["labels"][1:])  # as DataCollatorWithFlattening
                r_pos += list(range(n))
            pad = width - len(r_ids)
            ids.append(r_ids + [pad_id] * pad)
            labels.append(r_labels + [-100] * pad)
            positions.append(r_pos + list(range(pad)))
        return {"input_ids": torch.tensor(ids), "labels": torch.tensor(labels),
                "position_ids": torch.tensor(positions),
                "num_tokens": sum(len(f["input_ids"]) for f in features)}

    return collate


def ratio(a, b):
    return a / b if (a is not None and b) else None


def markdown(runs: list[dict], settings: dict) -> str:
    out = []
    model = next((r["model"] for r in runs if r.get("model")), "the bundled tiny model")
    out.append(f"Model: {model} — what trains on a 2-core CPU in seconds, so several repetitions fit in "
               "the budget; at this size per-step framework overhead is as visible as it gets. "
               "One rank per tool (the tiny recipes' `gpus = 1`: a CPU rank without CUDA, GPU 0 with it; "
               "precision auto in both: fp32 on CPU, bf16/fp16 on CUDA), "
               "ZeRO stage 0, micro batch 8, grad accum 1, lr 3e-3 cosine with 3% warmup, seed 42, "
               f"{settings['steps']} optimizer steps, logging every step in both. "
               f"Repetitions: {settings['reps']} per tool, alternating which tool goes first. "
               "Repetition 1 starts with empty caches (both tools tokenize); the others reuse them.")
    out.append("")
    out.append(f"Tokens/s = non-padding tokens per second between step {warmup_steps(settings['steps'])} and the "
               "last step (llmtui: `tokens` of metrics.jsonl; baseline: sum of the attention masks). "
               "Time to first step (TTFS) = from the command's invocation to the end of the first "
               "optimizer step (llmtui: `first_step` event; baseline: a callback). TTFS warm = median of the "
               "repetitions after the first. \"Best of reps per step\": both tools run the same batches in the same "
               "order in every repetition, so each step's time is taken as its fastest over the repetitions — "
               "the least disturbed by other load (equal to the plain ratio on a quiet machine). Rank CPU use = CPU time of the trainer rank process over wall "
               "time in the same window (100% = one core): clearly below 100% × its torch threads means other "
               "processes took the cores, and that tool's tokens/s is then noise.")
    out.append("")
    rows = []
    for run in runs:
        s, task = run["summary"], run["task"]
        if "skipped" in run:
            rows.append([task["name"], run["skipped"], "", "", "", "", "", "", "", ""])
            continue
        a, b = s.get("llmtui", {}), s.get("baseline", {})
        r = ratio(a.get("tok_s"), b.get("tok_s"))
        target = task["target"]
        verdict = "—" if r is None else ("met" if r >= target else "**missed**")
        rows.append([
            f"{task['name']} ({task['file']}, max_seq_len {task['max_seq_len']})",
            fmt(a.get("tok_s"), ",.0f"), fmt(b.get("tok_s"), ",.0f"), fmt(r, ".2f") + "×",
            f"≥ {target:.1f}× {verdict}",
            fmt(ratio(a.get("tok_s_best"), b.get("tok_s_best")), ".2f") + "×",
            f"{fmt(a.get('cpu_util'), '.0f')}% / {fmt(b.get('cpu_util'), '.0f')}%",
            f"{fmt(a.get('ttfs_warm'))} / {fmt(b.get('ttfs_warm'))} ({fmt(ratio(a.get('ttfs_warm'), b.get('ttfs_warm')), '.2f')}×)",
            f"{fmt(a.get('ttfs_cold'))} / {fmt(b.get('ttfs_cold'))}",
            f"{fmt(a.get('wall'))} / {fmt(b.get('wall'))}",
        ])
    out.append(md_table(["task", "llmtui tok/s", "baseline tok/s", "ratio", "target",
                         "ratio, best of reps per step", "rank CPU use (llmtui / base)", "TTFS warm s (llmtui / base)",
                         "TTFS cold s", "wall s"], rows))
    out.append("")

    for run in runs:
        if "skipped" in run:
            continue
        s, task = run["summary"], run["task"]
        a, b = s["llmtui"], s["baseline"]
        out.append(f"### {task['name']}: details")
        out.append("")
        out.append(md_table(["", "llmtui", "baseline"], [
            ["runs ok", f"{a['ok']}/{a['runs']}", f"{b['ok']}/{b['runs']}"],
            ["tokens/s, each repetition", ", ".join(fmt(x, ",.0f") for x in a["tok_s_all"]),
             ", ".join(fmt(x, ",.0f") for x in b["tok_s_all"])],
            ["tokens/s, each step at its fastest over the repetitions", fmt(a["tok_s_best"], ",.0f"),
             fmt(b["tok_s_best"], ",.0f")],
            ["TTFS s, each repetition", ", ".join(fmt(x) for x in a["ttfs_all"]),
             ", ".join(fmt(x) for x in b["ttfs_all"])],
            ["median step time (s)", fmt(a["step_s"], ".3f"), fmt(b["step_s"], ".3f")],
            ["rank CPU ms per 1k non-padding tokens", fmt(a["cpu_ms_per_ktok"], ",.0f"), fmt(b["cpu_ms_per_ktok"], ",.0f")],
            ["rank CPU use in the window (100% = one core)", fmt(a["cpu_util"], ".0f") + "%", fmt(b["cpu_util"], ".0f") + "%"],
            ["non-padding tokens per step", fmt(a["tokens_per_step"], ",.0f"), fmt(b["tokens_per_step"], ",.0f")],
            ["padding (share of positions)", _llmtui_padding(run),
             fmt(None if b["padding"] is None else 100 * b["padding"], ".1f") + "%"],
            ["final loss (mean of the last 5 steps)", fmt(a["final_loss"], ".3f"), fmt(b["final_loss"], ".3f")],
            ["torch threads of the rank", a["threads"] or "?", b["threads"] or "?"],
            ["left in /dev/shm after the run (DeepSpeed CPU all-reduce buffers; removed by the bench)",
             fmt(a.get("shm_left_mb"), ".0f") + " MB", fmt(b.get("shm_left_mb"), ".0f") + " MB"],
        ] + [[f"TTFS phase: {k}", fmt(v, ".2f"), ""] for k, v in a["phases"].items()]
          + [[f"TTFS phase: {k}", "", fmt(v, ".2f")] for k, v in b["phases"].items()]))
        out.append("")
        steps = sorted(set(a["losses"]) | set(b["losses"]))
        if steps:
            picks = sorted({steps[0], *[s_ for s_ in steps if s_ % max(1, len(steps) // 6) == 0], steps[-1]})
            out.append("Loss by step (repetition 1):")
            out.append("")
            out.append(md_table(["step"] + [str(p) for p in picks],
                                [["llmtui"] + [fmt(a["losses"].get(p), ".3f") for p in picks],
                                 ["baseline"] + [fmt(b["losses"].get(p), ".3f") for p in picks]]))
            out.append("")
        if run.get("profile"):
            out.append(f"Profile: {settings['profile_batches']} optimizer steps per data layout (means; the layouts "
                       "take turns batch by batch), same initial model, same example indices, no Trainer, "
                       "DeepSpeed or callbacks, in one process with the rank's torch threads:")
            out.append("")
            prow = [[f"{p['layout']}" + ("" if p["layout"].endswith(")") else f" ({p['collator']})"), p["shape"], fmt(p["tokens_per_batch"], ",.0f"), fmt(p["positions_per_batch"], ",.0f"),
                     fmt(100 * p["padding"], ".1f") + "%", fmt(p["gflop_per_step"], ".1f"),
                     fmt(100 * p["attention_share"], ".0f") + "%", fmt(p["gflop_per_ktok"], ".1f"),
                     fmt(p["collate_ms"], ".1f"), fmt(p["forward_ms"], ".0f"),
                     fmt(p["backward_ms"], ".0f"), fmt(p["optimizer_ms"], ".1f"), fmt(p["step_ms"], ".0f"),
                     fmt(p["tok_s"], ",.0f")] for p in run["profile"]]
            out.append(md_table(["layout", "last batch shape", "tokens/batch", "positions/batch", "padding",
                                 "GFLOP/step", "attention share", "GFLOP per 1k tokens",
                                 "collate ms", "forward ms", "backward ms", "optimizer ms", "step ms",
                                 "compute-only tok/s"], prow))
            out.append("")
            out.append("GFLOP columns are computed from the batch shapes and the model config (training ≈ 3 × "
                       "forward; attention counted over every row's full length², as sdpa computes it with a mask — "
                       "a causal row without a mask, as llmtui's pretrain blocks, can skip about half of it): "
                       "they do not depend on the machine's load, the timings do.")
            out.append("")
            out.append("The layouts run interleaved in one process, one model each: compare the rows "
                       "with each other, not with the step times of the runs above.")
            out.append("")
    out.append("Commands (exactly what ran; RECIPE is written to a temp folder, shown below):")
    out.append("")
    for run in runs:
        if "skipped" in run:
            continue
        s = run["summary"]
        out.append("```")
        out.append(f"# {run['task']['name']}: llmtui (env LLMTUI_CACHE=<bench cache>, HF_DATASETS_CACHE=<bench cache>)")
        out.append(" ".join(_rel(x) for x in s["llmtui"]["argv"]))
        out.append(f"# {run['task']['name']}: baseline")
        out.append(" ".join(_rel(x) for x in s["baseline"]["argv"]))
        out.append("# RECIPE:")
        out.append(s["llmtui"]["recipe"].rstrip())
        out.append("```")
    return "\n".join(out)


def _llmtui_padding(run: dict) -> str:
    ours = next((p for p in run.get("profile") or [] if p["layout"] == "llmtui"), None)
    return "—" if ours is None else f"{100 * ours['padding']:.1f}% (profile)"


def _rel(arg: str) -> str:
    text = str(arg)
    for prefix, name in ((str(common.ROOT) + "/", ""), ("/tmp/", "/tmp/")):
        if text.startswith(prefix):
            return text[len(prefix):] if name == "" else text
    return text


def run_all(quick: bool = False, reps: int | None = None, steps: int | None = None, tasks=None,
            profile: bool = True, log=print) -> dict:
    settings = dict(QUICK if quick else FULL)
    if reps:
        settings["reps"] = reps
    if steps:
        settings["steps"] = steps
    runs = []
    for name in tasks or list(TASKS):
        task = {**TASKS[name], "steps": settings["steps"]}
        skipped = common.missing_data_message(task["file"])
        if skipped:
            log(f"  {name}: {skipped}")
            runs.append({"task": task, "skipped": skipped, "summary": {}})
            continue
        task["data"] = str(common.data_file(task["file"]))
        log(f"training benchmark: {name}, {settings['reps']} repetition(s) × 2 tools, {settings['steps']} steps")
        run = bench_task(task, settings["reps"], log=log)
        work = run.pop("work")
        try:
            run["summary"] = summarize(run)
            if profile:
                log(f"  {name}: profiling one step of each data layout")
                try:
                    run["profile"] = profile_layouts(task, run["model_dir"], work / "cache", settings["profile_batches"])
                except Exception as exc:  # a profile failure must not lose the benchmark
                    log(f"  profile failed: {exc!r}")
        finally:
            common.remove(work)
        runs.append(run)
    return {"settings": settings, "runs": runs, "markdown": markdown(runs, settings)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repetition, 25 steps")
    parser.add_argument("--reps", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--tasks", default="pretrain,sft")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--json-out", help="also write the raw results as JSON here")
    args = parser.parse_args(argv)
    common.exit_on_sigterm()
    result = run_all(args.quick, args.reps, args.steps, [t for t in args.tasks.split(",") if t],
                     profile=not args.no_profile,
                     log=lambda m: print(m, file=sys.stderr, flush=True))
    print(result["markdown"])
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(_jsonable(result), indent=1, default=str))
    return 0


def _jsonable(result: dict) -> dict:
    out = dict(result)
    out.pop("markdown", None)
    return out


if __name__ == "__main__":
    sys.exit(main())
