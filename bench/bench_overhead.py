"""Overhead of llmtui itself: the `llmtui run` CLI process that follows a run.

    .venv/bin/python bench/bench_overhead.py [--quick]

* CPU and memory of the parent CLI process while the run trains (sampled with psutil every
  0.2 s: CPU time over wall time between the `first_step` and `finished` events; RSS max),
  targets < 1% of one core and < 150 MB;
* it never loads torch: /proc/<pid>/maps of the live CLI is searched for libtorch (and any file
  of torch, transformers, deepspeed, textual), and `python -X importtime` of the CLI's run path
  (`llmtui run --dry-run`) lists every module it imports;
* time to first optimizer step of `llmtui run` against the plain Trainer + DeepSpeed script
  (target ≤ 1.1×), with where llmtui's time goes;
* the per-step cost of llmtui's callbacks and Trainer hooks on 2 gloo CPU ranks (stop agreement,
  per-rank memory, token count) against the real step they ride on (target ≤ 0.2%);
  `--callbacks` measures only that.

Standalone it trains the pretrain task of bench_train (tiny model, c4 sample; the bundled demo text
when the sample data is absent) itself; bench/run.py hands it the runs of the training benchmark
instead of training again.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import fmt, md_table, mean, median  # noqa: E402

HEAVY = ("torch", "transformers", "deepspeed", "textual", "datasets", "accelerate", "peft")
CPU_TARGET_PCT, RSS_TARGET_MB, TTFS_TARGET = 1.0, 150.0, 1.1
CALLBACK_TARGET_PCT = 0.2  # llmtui's callbacks and Trainer hooks, share of a training step


def import_profile(argv_tail: list[str], env: dict | None = None) -> dict:
    """Modules a CLI invocation imports (python -X importtime), heavy ones singled out."""
    cmd = [common.PYTHON, "-X", "importtime", "-m", "tuiapp.cli", *argv_tail]
    out = subprocess.run(cmd, cwd=common.ROOT, capture_output=True, text=True, env=env)
    modules, total_us = [], 0
    for line in out.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)", line)
        if not match:
            continue
        self_us, _cum, _indent, name = match.groups()
        modules.append(name)
        total_us += int(self_us)
    heavy = sorted({m.split(".")[0] for m in modules if m.split(".")[0] in HEAVY})
    return {"argv": cmd, "returncode": out.returncode, "modules": len(modules), "import_s": total_us / 1e6,
            "heavy": heavy, "stdout": out.stdout[-500:], "stderr_tail": "\n".join(
                line for line in out.stderr.splitlines()[-3:] if not line.startswith("import time"))}


def import_checks(quick_recipe_dir: Path | None = None) -> list[dict]:
    """`llmtui --help` and `llmtui run RECIPE --dry-run`, under -X importtime."""
    checks = [("llmtui --help", ["--help"])]
    if quick_recipe_dir is not None:
        task = {"name": "overhead", "data": "demo:text", "format": "text", "method": "pretrain",
                "steps": 5, "micro_batch": 8, "lr": 3e-3, "max_seq_len": 128}
        recipe = quick_recipe_dir / "overhead.toml"
        recipe.write_text(common.recipe_toml(task))
        checks.append(("llmtui run RECIPE --dry-run",
                       ["--runs-dir", str(quick_recipe_dir / "runs"), "run", str(recipe), "--dry-run"]))
    results = []
    for label, tail in checks:
        profile = import_profile(tail)
        profile["label"] = label
        results.append(profile)
    return results


def rank_imports(reps: int) -> dict:
    """Wall time of the imports each tool's rank does before its first line of work, interleaved."""
    probes = {
        "llmtui rank (`import tuiapp.trainer.run, tuiapp.trainer.dataset.data`)":
            [common.PYTHON, "-c", "import tuiapp.trainer.run, tuiapp.trainer.dataset.data"],
        "baseline rank (`import baseline_train`: torch, datasets, transformers)":
            [common.PYTHON, "-c", f"import sys; sys.path.insert(0, {str(common.BENCH)!r}); import baseline_train"],
        "CLI (`import tuiapp.cli.main`)": [common.PYTHON, "-c", "import tuiapp.cli.main"],
        "bare interpreter (`python -c pass`)": [common.PYTHON, "-c", "pass"],
    }
    times: dict[str, list[float]] = {k: [] for k in probes}
    for _ in range(reps):
        for label, argv in probes.items():
            t0 = time.perf_counter()
            subprocess.run(argv, cwd=common.ROOT, capture_output=True)
            times[label].append(time.perf_counter() - t0)
    return {k: median(v) for k, v in times.items()}


def _callback_worker(rank: int, world: int, port: int, steps: int, queue, before: bool = True) -> None:
    """One gloo rank: `steps` real training steps of the tiny model (one thread), each followed by
    what llmtui's callbacks and Trainer hooks do at a step with logging_steps = 1: the token count
    per micro batch, the step agreement (stop flag and token sum on one asynchronous all_reduce),
    the per-rank memory file and rank 0's metrics row."""
    import json
    import os
    import tempfile
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, TrainerControl, TrainerState

    from tuiapp.trainer.loop.callbacks import GracefulStop, RunRecorder
    from tuiapp.trainer.models.bundled import resolve_model_path
    from tuiapp.trainer.run import RunTrainerMixin

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    batch = {"input_ids": torch.randint(0, model.config.vocab_size, (8, 128), generator=generator)}
    batch["labels"] = batch["input_ids"]
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    scratch = tempfile.TemporaryDirectory(prefix="llmtui-bench-cb-")
    args = SimpleNamespace(world_size=world, device=torch.device("cpu"), train_batch_size=8)
    state, control = TrainerState(), TrainerControl()
    state.is_world_process_zero, state.max_steps = rank == 0, steps
    stopper = GracefulStop()
    recorder = RunRecorder(Path(scratch.name), "bench", agreement=stopper)
    trainer = SimpleNamespace(args=args, state=state, model=model, processing_class=None, step_agreement=stopper)
    stopper.on_train_begin(args, state, control)
    recorder.on_train_begin(args, state, control, model=model)
    step_s, hooks_s, parts, before_s = [], [], {}, []
    for step in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        for param in model.parameters():  # the gradient all_reduce a data-parallel step does
            dist.all_reduce(param.grad)
        optimizer.step()
        optimizer.zero_grad()
        t1 = time.perf_counter()
        RunTrainerMixin._track_num_input_tokens(trainer, batch)  # per micro batch
        state.global_step = step + 1
        ta = time.perf_counter()
        stopper.on_step_end(args, state, control)
        tb = time.perf_counter()
        recorder.on_step_end(args, state, control)
        recorder.on_log(args, state, control, logs={"loss": loss.item(), "learning_rate": 1e-3, "grad_norm": 1.0})
        t2 = time.perf_counter()
        step_s.append(t2 - t0)
        hooks_s.append(t2 - t1)
        for name, value in (("token count", ta - t1), ("step agreement (stop flag + token sum)", tb - ta),
                            ("memory file + metrics row", t2 - tb)):
            parts.setdefault(name, []).append(value)
        if before:  # what the callbacks did until now, on the same step: three blocking collectives
            t3 = time.perf_counter()
            flag = torch.tensor([0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            flag.item()
            gathered = [None] * world
            dist.all_gather_object(gathered, {"rss": 1, "peak": 2, "host": "bench", "node": 0})
            count = torch.tensor(1024, dtype=torch.int64)
            pieces = [torch.zeros_like(count) for _ in range(world)]
            dist.all_gather(pieces, count)
            int(sum(pieces))
            before_s.append(time.perf_counter() - t3)
    stopper.on_train_end(args, state, control)
    recorder.on_train_end(args, state, control)
    error = None
    if rank == 0:  # every step's row, with every rank's tokens through it
        rows = [json.loads(line) for line in (Path(scratch.name) / "metrics.jsonl").read_text().splitlines()]
        per_step = world * batch["attention_mask"].numel()
        if [(r["step"], r["tokens"]) for r in rows] != [(s + 1, (s + 1) * per_step) for s in range(steps)]:
            error = f"the recorder's rows are off: {[(r['step'], r['tokens']) for r in rows]}"
    dist.barrier()
    queue.put({"rank": rank, "error": error, "step_s": step_s, "hooks_s": hooks_s, "parts": parts, "before_s": before_s})
    dist.destroy_process_group()
    scratch.cleanup()


def callback_cost(world: int = 2, steps: int = 40) -> dict | None:
    """Per-step cost of llmtui's callbacks and Trainer hooks on `world` gloo CPU ranks, against the
    step they ride on, over the steps after 5 warm-up steps, the slower rank's: the hooks' mean
    (the agreement and the memory file come every few steps, so a median would miss them) against
    the median step."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = common.free_port()
    procs = [ctx.Process(target=_callback_worker, args=(r, world, port, steps, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in range(world):
            results.append(queue.get(timeout=600))
    except Exception:
        return None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [r["error"] for r in results if r["error"]]
    if errors:
        raise SystemExit(f"callbacks benchmark: {errors[0]}")
    hooks = max(mean(r["hooks_s"][5:]) for r in results)
    step = max(median(r["step_s"][5:]) for r in results)
    parts = {name: max(mean(r["parts"][name][5:]) for r in results) * 1e6 for name in results[0]["parts"]}
    before = max(median(r["before_s"][5:]) for r in results) if results[0]["before_s"] else None
    return {"world": world, "steps": steps, "hooks_us": hooks * 1e6, "step_ms": step * 1e3,
            "pct": 100 * hooks / step, "parts_us": parts, "before_us": before and before * 1e6,
            "load": os.getloadavg()}


def callback_markdown(cost: dict | None) -> str:
    if not cost:
        return "Callbacks' cost per step: not measured (the ranks did not report)."
    verdict = _verdict(cost["pct"] <= CALLBACK_TARGET_PCT)
    return (f"Callbacks' cost per step ({cost['world']} gloo CPU ranks, logging every step, over "
            f"{cost['steps'] - 5} steps): {cost['hooks_us']:,.0f} µs (mean) on a {cost['step_ms']:,.0f} ms step of the tiny "
            f"model = {cost['pct']:.3f}% (target ≤ {CALLBACK_TARGET_PCT}%: {verdict}); per part (µs, "
            f"slower rank, mean): " + ", ".join(f"{k} {v:,.0f}" for k, v in cost["parts_us"].items()) + "."
            + (f" The earlier callbacks' three blocking collectives (stop all_reduce + item, memory "
               f"all_gather_object, token all_gather), timed on the same steps: {cost['before_us']:,.0f} µs "
               f"({100 * cost['before_us'] / 1e3 / cost['step_ms']:.3f}%)." if cost.get("before_us") else "")
            + f" Load average during the measurement: {' '.join(f'{x:.1f}' for x in cost['load'])} on "
            f"{os.cpu_count()} cores.")


def analyse(train_runs: list[dict]) -> dict:
    """CLI samples and TTFS figures out of bench_train runs (their summaries)."""
    samples, ttfs = [], []
    for run in train_runs:
        summary = run.get("summary") or {}
        if "llmtui" not in summary:
            continue
        a, b = summary["llmtui"], summary["baseline"]
        samples += [dict(c, task=run["task"]["name"]) for c in a.get("cli") or []]
        ttfs.append({"task": run["task"]["name"], "llmtui_warm": a["ttfs_warm"], "baseline_warm": b["ttfs_warm"],
                     "llmtui_cold": a["ttfs_cold"], "baseline_cold": b["ttfs_cold"],
                     "phases_llmtui": a["phases"], "phases_baseline": b["phases"]})
    return {"samples": samples, "ttfs": ttfs}


def markdown(analysis: dict, imports: list[dict], rank_import_s: dict | None = None) -> str:
    out = []
    samples = analysis["samples"]
    if samples:
        cpu = median(s["cpu_pct_training"] for s in samples)
        cpu_max = max((s["cpu_pct_training"] for s in samples if s["cpu_pct_training"] is not None), default=None)
        rss = max((s["rss_max_mb"] for s in samples if s["rss_max_mb"] is not None), default=None)
        mapped = any(s["torch_mapped"] for s in samples)
        checked = all(s["torch_mapped"] is not None for s in samples)
        out.append(md_table(["measure (parent `llmtui run` process, following the run)", "value", "target", ""], [
            ["CPU while training, % of one core (median; max)",
             f"{fmt(cpu, '.2f')}%; {fmt(cpu_max, '.2f')}%", f"< {CPU_TARGET_PCT:.0f}%",
             _verdict(cpu is not None and cpu_max is not None and cpu_max < CPU_TARGET_PCT)],
            ["RSS, max over all samples", f"{fmt(rss, '.0f')} MB", f"< {RSS_TARGET_MB:.0f} MB",
             _verdict(rss is not None and rss < RSS_TARGET_MB)],
            ["CPU seconds from invocation to first step (median)",
             fmt(median(s["cpu_s_startup"] for s in samples), ".2f") + " s", "", ""],
            ["libtorch / torch / transformers / deepspeed / textual mapped (/proc/PID/maps, live)",
             ("yes" if mapped else "no") + ("" if checked else " (not checked in every run)"), "no",
             _verdict(not mapped and checked)],
            ["runs sampled", f"{len(samples)} ({', '.join(sorted({s['task'] for s in samples}))})", "", ""],
        ]))
        out.append("")
    for imp in imports:
        heavy = ", ".join(imp["heavy"]) or "none"
        out.append(f"- `python -X importtime -m tuiapp.cli {imp['label'][7:]}`: {imp['modules']} modules, "
                   f"{imp['import_s']:.2f} s of imports, heavy libraries imported: **{heavy}**"
                   + ("" if imp["returncode"] == 0 else f" (exit {imp['returncode']}: {imp['stderr_tail']})"))
    if imports:
        out.append("")
    if rank_import_s:
        out.append(md_table(["process start-up: python + imports (median wall s)", "s"],
                            [[k, fmt(v, ".2f")] for k, v in rank_import_s.items()]))
        out.append("")
    if analysis["ttfs"]:
        rows = []
        for t in analysis["ttfs"]:
            r_warm = _ratio(t["llmtui_warm"], t["baseline_warm"])
            r_cold = _ratio(t["llmtui_cold"], t["baseline_cold"])
            rows.append([t["task"], f"{fmt(t['llmtui_warm'])} / {fmt(t['baseline_warm'])}", fmt(r_warm, ".2f") + "×",
                         f"≤ {TTFS_TARGET}× " + _verdict(r_warm is not None and r_warm <= TTFS_TARGET),
                         f"{fmt(t['llmtui_cold'])} / {fmt(t['baseline_cold'])} ({fmt(r_cold, '.2f')}×)"])
        out.append(md_table(["task", "TTFS warm s (llmtui / baseline)", "ratio", "target", "TTFS cold s (ratio)"], rows))
        out.append("")
        out.append("Where the time to first step goes (medians of the warm repetitions, seconds):")
        out.append("")
        prow = []
        for t in analysis["ttfs"]:
            pa, pb = t["phases_llmtui"], t["phases_baseline"]
            prow.append([t["task"], "llmtui"] + [fmt(pa.get(k), ".2f") for k in
                        ("invoke→launched", "launched→started", "started→first_step")])
            prow.append([t["task"], "baseline", "—", fmt(pb.get("invoke→started"), ".2f") + " (invoke→started)",
                         fmt(pb.get("started→first_step"), ".2f")])
        out.append(md_table(["task", "tool", "CLI + supervisor (invoke→launched)",
                             "launcher + rank start-up, data, model, DeepSpeed init (→ Trainer started)",
                             "first step (started→first_step)"], prow))
        out.append("")
    return "\n".join(out)


def _ratio(a, b):
    return a / b if (a is not None and b) else None


def _verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def own_runs(quick: bool, work: Path, log=print) -> list[dict]:
    """The pretrain task of bench_train, on the c4 sample when present, else on the bundled demo
    text (written to a temporary .jsonl so that the baseline script can read it too)."""
    import json

    import bench_train

    c4 = common.data_file(common.C4)
    task = dict(bench_train.TASKS["pretrain"], steps=25 if quick else 40)
    if c4 is not None:
        task["data"] = str(c4)
    else:
        from tuiapp.core.data.demo_data import text_records

        demo = work / "demo_text.jsonl"
        demo.write_text("".join(json.dumps({"text": r["text"]}) + "\n" for r in text_records()))
        task.update(name="pretrain-demo", file="demo:text (bundled; sample data absent)", data=str(demo),
                    max_seq_len=256)
    run = bench_train.bench_task(task, 1 if quick else 2, log=log)
    try:
        run["summary"] = bench_train.summarize(run)
    finally:
        common.remove(run.pop("work"))
    return [run]


def run_all(quick: bool = False, train_runs: list[dict] | None = None, log=print) -> dict:
    work = common.temp_dir("overhead")
    try:
        log("overhead benchmark: import checks")
        imports = import_checks(work)
        rank_import_s = rank_imports(1 if quick else 3)
        if not any("llmtui" in (r.get("summary") or {}) for r in train_runs or []):
            log("overhead benchmark: training a pretrain task to sample the CLI")
            train_runs = own_runs(quick, work, log)
        analysis = analyse(train_runs)
        log("overhead benchmark: callbacks' cost per step on 2 CPU ranks")
        callbacks = callback_cost(steps=20 if quick else 40)
    finally:
        common.remove(work)
    return {"imports": imports, "analysis": analysis, "rank_imports": rank_import_s, "callbacks": callbacks,
            "markdown": markdown(analysis, imports, rank_import_s) + "\n" + callback_markdown(callbacks) + "\n"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--callbacks", action="store_true", help="only the callbacks' cost per step (2 CPU ranks)")
    args = parser.parse_args(argv)
    common.exit_on_sigterm()
    if args.callbacks:
        print(callback_markdown(callback_cost()))
        return 0
    result = run_all(args.quick, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(result["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
