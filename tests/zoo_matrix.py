"""The model zoo × methods: each pair's preflight verdict, and a few real training steps of the
accepted ones in one process (one rank, no launcher: the launcher adds nothing to what is tested).

    python -m tests.zoo_matrix verdicts            # JSON lines: arch, method, verdict, first error
    python -m tests.zoo_matrix train OUT_DIR [ARCH|ARCH:METHOD ...]
                                                   # trains each accepted pair 3 steps (LLMTUI_ZOO_WORKERS
                                                   # processes, default 2); JSON lines. The families of
                                                   # zoo.DRY_DECIDED are left to the dry step (one step each,
                                                   # tests/e2e/test_dry_step.py) unless named
    python -m tests.zoo_matrix table               # the README's support table

The README's support table is generated from `verdicts` (tests/test_zoo.py checks it is current).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
# one recipe per method: the tiny presets' method tables
METHODS = ["sft", "lora", "dora", "prefix", "prompt", "ptuning", "ia3", "adapter", "llama-adapter", "dpo", "kto",
           "reward"]
PRESET = {"sft": "tiny-sft", "lora": "tiny-lora", "dora": "tiny-dora", "prefix": "tiny-prefix",
          "prompt": "tiny-prompt", "ptuning": "tiny-ptuning", "ia3": "tiny-ia3", "adapter": "tiny-adapter",
          "llama-adapter": "tiny-llama-adapter", "dpo": "tiny-dpo", "kto": "tiny-kto", "reward": "tiny-reward"}
STEPS = 3


def zoo_recipe(arch_path: str, method: str):
    """The method's tiny preset on a zoo model, shrunk to a few steps without evals or saves."""
    from tuiapp.core.config.recipe import recipe_from_dict

    data = tomllib.loads((ROOT / "recipes" / f"{PRESET[method]}.toml").read_text())
    data["name"] = f"zoo-{method}"
    data["model"] = {"name": arch_path}
    data["dataset"].pop("eval_split", None)
    data["dataset"]["max_samples"] = 32  # a few batches: the point is each pair's steps, not its data
    data["train"] = {**data.get("train", {}), "max_steps": STEPS, "micro_batch": 2, "eval_steps": 0,
                     "save_steps": 0, "sample_prompts": [], "max_seq_len": 64, "logging_steps": 1}
    data["train"].pop("gradient_accumulation", None)
    data["launch"] = {"gpus": 1}
    data.pop("sweep", None)
    return recipe_from_dict(data)


def verdict(profile, recipe) -> tuple[str, list]:
    """'trains' or 'refused', and the plan's findings (errors first)."""
    from tuiapp.core.plan.model_profile import plan_model

    plan = plan_model(profile, recipe, cuda=False, flash_installed=False, precision="fp32")
    errors = plan.errors()
    return ("refused" if errors else "trains"), errors or plan.findings


def verdicts(archs=None, methods=None):
    """Each pair's verdict, from the zoo models' configs (no weights built)."""
    from tuiapp.core.plan.model_profile import ModelProfile
    from tuiapp.trainer.models.zoo import ZOO, zoo_profile

    for arch in archs or ZOO:
        prof = ModelProfile(zoo_profile(arch))
        for method in methods or METHODS:
            result, findings = verdict(prof, zoo_recipe(f"zoo-{arch}", method))
            yield {"arch": arch, "method": method, "verdict": result,
                   "findings": [{"level": f.level, "key": f.key, "message": f.message, "fix": f.fix}
                                for f in findings]}


TABLE_START, TABLE_END = "<!-- zoo table: python -m tests.zoo_matrix table -->", "<!-- end of zoo table -->"


def table(rows: list[dict]) -> str:
    """The README's architectures × methods table: 'yes', 'yes¹' (a default chosen for it, said at
    preflight) or 'no' (refused before launch, with the fix)."""
    archs = list(dict.fromkeys(r["arch"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {}
    for r in rows:
        chosen = r["verdict"] == "trains" and any(f["key"] != "model.attn_implementation" for f in r["findings"])
        cell[r["arch"], r["method"]] = "no" if r["verdict"] == "refused" else ("yes¹" if chosen else "yes")
    lines = [TABLE_START, "| model_type | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
    for arch in archs:
        lines.append(f"| {arch} | " + " | ".join(cell[arch, m] for m in methods) + " |")
    lines.append(TABLE_END)
    return "\n".join(lines)


def train_pair(arch: str, method: str, out: Path) -> dict:
    """Three real steps of the pair in this process; the run folder's metrics prove them."""
    import traceback

    from tuiapp.trainer.models.zoo import ensure_zoo_model

    recipe = zoo_recipe(str(ensure_zoo_model(arch)), method)
    run_dir = out / f"{arch}-{method}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "recipe.toml").write_text(recipe.to_toml(), encoding="utf-8")
    from accelerate.state import AcceleratorState

    from tuiapp.trainer.run import train

    AcceleratorState._reset_state(reset_partial_state=True)  # each pair's Trainer makes its own Accelerator (DeepSpeed plugin)
    try:
        code = train(run_dir, resume=False)
        error = None
    except BaseException as exc:  # noqa: BLE001 - every failure is a verdict here
        code, error = 1, "".join(traceback.format_exception_only(type(exc), exc)).strip()[-800:]
    steps = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.strip()
                 and json.loads(line).get("split", "train") == "train"]
    plans = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
             if '"model_plan"' in line] if (run_dir / "events.jsonl").exists() else []
    return {"arch": arch, "method": method, "code": code, "steps": steps, "error": error,
            "attention": plans[0]["attention"] if plans else None}


def train_in_workers(pairs: list[tuple[str, str]], out: Path, workers: int) -> list[dict]:
    """The pairs split over `workers` processes of one torch thread each (2 cores: twice the pairs an
    hour of one process), each its own process group port; rows come back in the pairs' order."""
    import socket
    import subprocess

    shares = [pairs[i::workers] for i in range(workers)]
    procs = []
    for share in shares:
        if not share:
            continue
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        env = {**os.environ, "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.zoo_matrix", "train-pairs", str(out),
                                       *[f"{a}:{m}" for a, m in share]], cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stdin=subprocess.DEVNULL))
    rows = {}
    for proc in procs:
        output, _ = proc.communicate()
        for line in output.splitlines():
            if line.startswith('{"arch"'):
                row = json.loads(line)
                rows[row["arch"], row["method"]] = row
    return [rows.get(pair, {"arch": pair[0], "method": pair[1], "code": None, "steps": [],
                            "error": "the worker died before this pair"}) for pair in pairs]


def main(argv: list[str]) -> int:
    from tuiapp.trainer.models.zoo import DRY_DECIDED

    if argv[:1] == ["verdicts"]:
        for row in verdicts(argv[1:2] or None):
            print(json.dumps(row), flush=True)
        return 0
    if argv[:1] == ["table"]:
        print(table(list(verdicts())))
        return 0
    if argv[:1] == ["train"] and len(argv) >= 2:
        out, only = Path(argv[1]), set(argv[2:])
        pairs = [(r["arch"], r["method"]) for r in verdicts(sorted({o.split(":")[0] for o in only}) or None)
                 if r["verdict"] == "trains" and (r["arch"] in only or f"{r['arch']}:{r['method']}" in only
                                                  or (not only and r["arch"] not in DRY_DECIDED))]
        for row in train_in_workers(pairs, out, int(os.environ.get("LLMTUI_ZOO_WORKERS", "2"))):
            print(json.dumps(row), flush=True)
        return 0
    if argv[:1] == ["train-pairs"] and len(argv) >= 3:  # one worker: pairs as ARCH:METHOD
        import gc

        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        for pair in argv[2:]:
            arch, method = pair.split(":", 1)
            print(json.dumps(train_pair(arch, method, Path(argv[1]))), flush=True)
            # what outlives a pair (modules, caches) is left out of later collections: each pair's Trainer
            # runs a full gc.collect (accelerate's free_memory), ~0.25 s per pair over the whole heap
            gc.collect()
            gc.freeze()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
