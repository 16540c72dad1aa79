"""Peak memory per rank of a long sequence split over 2 CPU ranks (train.sequence_parallel = 2)
against the same sequence on one rank, and what the estimate predicts for both.

    PYTHONPATH=. python bench/bench_long_context.py [--seq 8192] [--steps 3]

Both runs are recipes/tiny-long-context.toml (pretraining blocks of demo:text) at --seq tokens, RoPE
stretched to them, tiled MLP off (one CPU rank at ZeRO-0 cannot run it); the degree-2 run on 2 ranks, the degree-1 run on 1. The measured figure is the
peak resident memory of each rank's process over the run (ranks/memory-N.json, written at each rank's
end, and metrics.jsonl's mem.rankN.peak); the prediction is `llmtui estimate`'s RAM per rank on CPU (the
rank's runtime, the model states and activations of the estimate, and what glibc's heap keeps of the
activations). Prints a Markdown table for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MB = 1e6


def overrides(seq: int, degree: int, steps: int) -> list[str]:
    factor = max(2.0, seq / 1024)
    return ["--set", f"train.max_seq_len={seq}", "--set", f"model.max_position_embeddings={seq}",
            "--set", f"model.rope_scaling={{type = \"linear\", factor = {factor}}}",
            "--set", f"train.sequence_parallel={degree}", "--set", f"launch.gpus={degree}",
            "--set", f"train.max_steps={steps}", "--set", "train.tiled_mlp=false"]


def run(seq: int, degree: int, steps: int, runs: Path) -> dict:
    cmd = [sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs), "run", "recipes/tiny-long-context.toml",
           *overrides(seq, degree, steps)]
    # no dry step: it trains the recipe's first 8 samples at 256 tokens, fewer than one block of demo:text
    env = {**os.environ, "LLMTUI_DRY_STEP": "0"}
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir() and not p.name.startswith(".")]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    if result.returncode != 0 or not rows:
        raise SystemExit(result.stdout[-3000:] + result.stderr[-3000:])
    peaks = {rank: max(r["mem"][rank]["peak"] for r in rows if rank in r.get("mem", {})) for rank in rows[-1]["mem"]}
    for path in (run_dir / "ranks").glob("memory-*.json"):  # each rank's peak at its end (the rows lag it)
        rank = "rank" + path.stem.split("-")[1]
        peaks[rank] = max(peaks.get(rank, 0), json.loads(path.read_text())["peak"])
    return {"peaks": peaks, "loss": [round(r["loss"], 4) for r in rows], "tokens_per_s": rows[-1].get("tokens_per_s")}


def predicted(seq: int, degree: int) -> tuple[int, int]:
    from tuiapp.core.config.recipe import load_recipe
    from tuiapp.core.plan import estimate

    recipe = load_recipe(ROOT / "recipes/tiny-long-context.toml")
    train = recipe.train.model_copy(update={"max_seq_len": seq, "sequence_parallel": degree, "tiled_mlp": False})
    recipe = recipe.model_copy(update={"train": train})
    est = estimate.estimate_recipe(recipe, estimate.TINY_CONFIG, degree, cuda=False)
    return est.ram_per_rank, est.memory.activations


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    rows = []
    load = os.getloadavg()
    for degree in (1, 2):
        with tempfile.TemporaryDirectory(prefix="llmtui-bench-lc-") as runs:
            measured = run(args.seq, degree, args.steps, Path(runs))
        ram, acts = predicted(args.seq, degree)
        peak = max(measured["peaks"].values())
        rows.append((degree, measured, peak, ram, acts))
    print(f"load average before: {load}, after: {os.getloadavg()}")
    print("| degree | ranks | sequence | per-rank tokens | measured peak RSS per rank | estimate RAM per rank "
          "| estimate / measured | estimate activations | losses |")
    print("|---|---|---|---|---|---|---|---|---|")
    for degree, measured, peak, ram, acts in rows:
        per = ", ".join(f"{v / MB:,.0f}" for v in measured["peaks"].values())
        print(f"| {degree} | {degree} | {args.seq:,} | {args.seq // degree:,} | {per} MB | {ram / MB:,.0f} MB "
              f"| {ram / peak:.2f} | {acts / MB:,.0f} MB | {measured['loss']} |")


if __name__ == "__main__":
    main()
