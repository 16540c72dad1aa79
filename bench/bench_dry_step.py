"""What the dry step adds to preflight (core.prelaunch.door.all_findings) on the tiny presets.

    python bench/bench_dry_step.py [PRESET ...]        (default: tiny-sft tiny-lora tiny-dpo)

For each preset, in this process (core only, as `llmtui run` calls it), on a fresh dry-step cache:
  off   before_launch with LLMTUI_DRY_STEP=0 (the model's profile already cached: what preflight cost before)
  cold  before_launch with the dry step and no cached verdict (one child process: imports + one step)
  warm  the same again: the verdict comes from the cache
Prints a table and one JSON line per preset.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str]) -> int:
    presets = argv or ["tiny-sft", "tiny-lora", "tiny-dpo"]
    from tuiapp.core.config.recipe import parse_recipe
    from tuiapp.core.prelaunch import door, dry_step
    from tuiapp.core.store.runs import RunStore

    os.environ["LLMTUI_DRY_STEP"] = "1"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(Path(tmp) / "runs")
        for name in presets:
            path = ROOT / "recipes" / f"{name}.toml"
            recipe = parse_recipe(path.read_text(), str(path))
            os.environ["LLMTUI_DRY_STEP"] = "0"
            door.all_findings(recipe, store, ROOT)  # the profile and the tiny model made, as before
            started = time.perf_counter()
            door.all_findings(recipe, store, ROOT)
            off = time.perf_counter() - started
            os.environ["LLMTUI_DRY_STEP"] = "1"
            config = dry_step._config_bytes(recipe, ROOT)
            if config is not None:
                dry_step.cache_file(dry_step.cache_key(recipe, config)).unlink(missing_ok=True)
            children = dry_step.CHILD_RUNS["count"]
            started = time.perf_counter()
            cold_findings = door.all_findings(recipe, store, ROOT)
            cold = time.perf_counter() - started
            started = time.perf_counter()
            door.all_findings(recipe, store, ROOT)
            warm = time.perf_counter() - started
            row = {"preset": name, "off_s": round(off, 2), "cold_s": round(cold, 2), "warm_s": round(warm, 2),
                   "cold_added_s": round(cold - off, 2), "warm_added_s": round(warm - off, 2),
                   "children": dry_step.CHILD_RUNS["count"] - children,
                   "errors": [f.message for f in cold_findings if f.level == "error"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"load average {os.getloadavg()}")
    print("| preset | preflight without | cold (added) | warm (added) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['preset']} | {r['off_s']:.2f} s | {r['cold_s']:.2f} s (+{r['cold_added_s']:.2f}) | "
              f"{r['warm_s']:.2f} s (+{r['warm_added_s']:.2f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
