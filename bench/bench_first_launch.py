"""The first launch as a new user meets it: `llmtui run recipes/quickstart.toml` from a folder with no
runs, an empty llmtui cache (the tiny model, the tokenized data) and an empty HF_HOME; DeepSpeed's CPU
comm op either as `make install` left it (built) or not built yet (--cold-ops). Each line the command
prints is stamped as it arrives; the result is each start-up phase with its time, the time to the
first step and to the end, and the longest silence before the first step (every wait is to say what
it waits for: a phase line repeats every 10 s in a pipe).

    python bench/bench_first_launch.py [--cold-ops]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASE = re.compile(r"^(checking|starting): ([a-z ,]+?)(?: \d+:\d\d)")
FIRST_STEP = re.compile(r"^step 1/")


def stamped_run(argv: list[str], cwd: Path, env: dict) -> tuple[list[tuple[float, str]], int, float]:
    """(seconds since start, line) of each line of stdout and stderr, the exit code, the wall time."""
    started = time.monotonic()
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [(time.monotonic() - started, line.rstrip("\n")) for line in child.stdout]
    return lines, child.wait(), time.monotonic() - started


def phases(lines: list[tuple[float, str]]) -> dict:
    """Each phase's first and last line (checking before launch, then the ranks' phases), the first
    step, and the longest gap between two lines before it."""
    order: list[str] = []
    first: dict[str, float] = {}
    step = None
    gap, previous = 0.0, 0.0
    for at, line in lines:
        if step is None:
            gap, previous = max(gap, at - previous), at
        matched = PHASE.match(line)
        if matched:
            name = "checks before launch" if matched.group(1) == "checking" else matched.group(2)
            if name not in first:
                order.append(name)
                first[name] = at
        elif FIRST_STEP.match(line) and step is None:
            step = at
    ends = [first[name] for name in order[1:]] + [step if step is not None else lines[-1][0]]
    return {"phases": [(name, end - first[name]) for name, end in zip(order, ends, strict=True)],
            "first_step": step, "silence": gap}


def bench_quickstart(tmp: Path, cold_ops: bool) -> dict:
    from tuiapp.core.plan.launcher import torch_extensions_dir

    folder = tmp / ("quickstart-cold-ops" if cold_ops else "quickstart")
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(ROOT / "recipes", folder / "recipes")
    env = dict(os.environ, LLMTUI_CACHE=str(folder / "cache"), HF_HOME=str(folder / "hf"),
               TORCH_EXTENSIONS_DIR=str(folder / "ops") if cold_ops else torch_extensions_dir())
    env.pop("LLMTUI_DRY_STEP", None)  # as a user has it: the dry step on
    llmtui = [sys.executable, "-m", "tuiapp.cli"]
    lines, code, wall = stamped_run([*llmtui, "run", "recipes/quickstart.toml"], folder, env)
    result = phases(lines)
    last_loss = next((line for _, line in reversed(lines) if line.startswith("step ")), "")
    return {"cold_ops": cold_ops, "exit": code, "wall": wall, "last_step": last_loss, **result,
            "tail": [line for _, line in lines[-3:]]}


def markdown(results: list[dict]) -> list[str]:
    out = ["| first launch of recipes/quickstart.toml | " + " | ".join(
        "op not built yet" if r["cold_ops"] else "op built by `make install`" for r in results) + " |",
           "|---|" + "---|" * len(results)]
    names = list(dict.fromkeys(name for r in results for name, _ in r["phases"]))
    for name in names:
        cells = [next((f"{s:.1f} s" for n, s in r["phases"] if n == name), "-") for r in results]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out.append("| command start -> first step | " + " | ".join(
        f"{r['first_step']:.1f} s" if r["first_step"] is not None else "never" for r in results) + " |")
    out.append("| command start -> end (exit code) | " + " | ".join(f"{r['wall']:.1f} s ({r['exit']})" for r in results) + " |")
    out.append("| longest silence before the first step | " + " | ".join(f"{r['silence']:.1f} s" for r in results) + " |")
    out.append("| last step line | " + " | ".join(f"`{r['last_step'][:48]}`" for r in results) + " |")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold-ops", action="store_true", help="also with DeepSpeed's CPU op not built yet")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="llmtui-bench-first-"))
    try:
        results = [bench_quickstart(tmp, False)] + ([bench_quickstart(tmp, True)] if args.cold_ops else [])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\n".join(markdown(results)))
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
