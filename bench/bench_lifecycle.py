"""How fast the status tells the truth: latencies of the run lifecycle, from the real CLI.

    .venv/bin/python bench/bench_lifecycle.py [--repeat N] [--out bench/LIFECYCLE.md]

For each repetition, on the bundled tiny model (CPU ranks, the real deepspeed launcher):
* launch → first start-up phase in run.json (`llmtui run --detach` returned → phase != launching);
* `llmtui stop` started → `stopping` in run.json (the CLI's own start-up included), and → `stopped`
  (checkpoint written);
* resume returned → `starting` (the supervisor holds the run's lock before resume returns);
* a rank raising an exception → its type and message as run.json's reason, and → status failed (the
  launcher ends the other ranks first) (2 ranks, broken weights).
Targets: stopping within 1 s, the rank's error as the reason within 5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import fmt, md_table, median  # noqa: E402

LONG = ["--set", "train.max_steps=100000", "--set", "train.save_steps=0", "--set", "train.eval_steps=0",
        "--set", "dataset.eval_split=0"]


def llmtui(runs: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run([common.PYTHON, "-m", "tuiapp.cli", "--runs-dir", str(runs), *args], cwd=common.ROOT,
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"llmtui {' '.join(args)} -> {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def info(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


def wait(predicate, timeout: float = 600, interval: float = 0.01) -> float:
    """Seconds until predicate() holds (polled every `interval`)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(interval)
    raise TimeoutError


def one_cycle(runs: Path, env: dict) -> dict:
    out = {}
    t0 = time.monotonic()
    llmtui(runs, "run", "recipes/tiny-sft.toml", *LONG, "--detach", env=env)
    run_dir = next(p for p in runs.iterdir() if p.is_dir() and not p.name.startswith("."))
    out["detach returned (s)"] = time.monotonic() - t0
    out["→ first rank phase (s)"] = wait(lambda: info(run_dir).get("phase") not in (None, "launching"))
    out["→ running (s)"] = wait(lambda: info(run_dir).get("status") == "running")
    stopper = subprocess.Popen([common.PYTHON, "-m", "tuiapp.cli", "--runs-dir", str(runs), "stop", run_dir.name],
                               cwd=common.ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t1 = time.monotonic()
    out["stop → stopping (s)"] = wait(lambda: info(run_dir).get("status") == "stopping")
    wait(lambda: info(run_dir).get("status") == "stopped")
    out["stop → stopped (s)"] = time.monotonic() - t1
    stopper.wait()
    t2 = time.monotonic()
    llmtui(runs, "resume", run_dir.name, "--detach", env=env)
    out["resume returned (s)"] = time.monotonic() - t2
    out["status after resume returned"] = info(run_dir).get("status")
    llmtui(runs, "stop", run_dir.name, "--grace", "30", env=env)
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def error_latency(runs: Path, env: dict, cache: Path) -> dict:
    code = "import sys; from tuiapp.trainer.models.tiny import ensure_tiny_model; print(ensure_tiny_model(sys.argv[1]))"
    tiny = Path(subprocess.run([common.PYTHON, "-c", code, str(cache)], cwd=common.ROOT, capture_output=True,
                               text=True, env=env, check=True).stdout.strip().splitlines()[-1])
    broken = runs.parent / "broken-model"
    shutil.copytree(tiny, broken, dirs_exist_ok=True)
    next(broken.glob("*.safetensors")).write_bytes(b"\x10\0\0\0\0\0\0\0{not json at all}" + b"\0" * 64)
    llmtui(runs, "run", "recipes/tiny-sft.toml", "--set", f"model.name={broken}", "--set", "launch.gpus=2",
           "--detach", env=env)
    run_dir = next(p for p in runs.iterdir() if p.is_dir() and not p.name.startswith("."))
    wait(lambda: "Error" in (info(run_dir).get("reason") or ""), timeout=600, interval=0.02)
    reason_seen = time.time()
    wait(lambda: info(run_dir).get("status") == "failed", timeout=600, interval=0.05)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    raised = min(e["time"] for e in events if e.get("event") == "error")
    recorded = info(run_dir)["ended"]
    reason = info(run_dir).get("reason") or ""
    return {"rank error → its error as run.json's reason (s)": reason_seen - raised,
            "rank error → status failed (s)": recorded - raised, "reason": reason.splitlines()[0]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="llmtui-bench-lifecycle-"))
    cache = work / "cache"
    env = common.bench_env(cache, cache / "hf-datasets")
    common.prepare_ops()
    cycles = [one_cycle(work / f"runs{i}", env) for i in range(args.repeat)]
    error = error_latency(work / "runs-error", env, cache)
    keys = [k for k in cycles[0] if k.endswith("(s)")]
    rows = [[k, fmt(median(c[k] for c in cycles), ".2f"), fmt(max(c[k] for c in cycles), ".2f")] for k in keys]
    rows.append(["status when `llmtui resume` returns", ", ".join(sorted({c["status after resume returned"]
                                                                          for c in cycles})), ""])
    rows += [[key, fmt(error[key], ".2f"), ""] for key in error if key.endswith("(s)")]
    text = "\n".join([
        f"# Lifecycle latencies ({args.repeat} cycles, {time.strftime('%Y-%m-%d %H:%M')}, load {' '.join(f'{x:.2f}' for x in os.getloadavg())})",
        "", md_table(["what", "median", "max"], rows), "", f"The failed run's reason: `{error['reason']}`", ""])
    print(text)
    if args.out:
        args.out.write_text(text)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
