"""Micro-batch by probing on the real launcher: the tiny model on CPU, long examples.

`llmtui probe` picks a micro-batch and records the estimate's prediction beside the measured
peak; a run with micro_batch = "auto" under a memory cap that falls between two sizes' peaks
probes first, keeps the smaller size and trains with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e.helpers import ROOT, llmtui, metrics, only_run, run_info
from tuiapp.core.machine import shm
from tuiapp.core.plan import launcher, probe

pytestmark = pytest.mark.slow


def probe_buffers(folder) -> list:
    """The probing rank's DeepSpeed all-reduce buffers still in /dev/shm (its port is in its log's command)."""
    command = (folder / probe.PROBE_DIR / "launcher.log").read_text().splitlines()[0].split()
    port = launcher.master_port_of(command)
    assert port, command
    return shm.buffers(port)
WORDS = "the quick brown fox jumps over a lazy dog while seven tall trees sway in warm wind".split()


def long_records(path, count: int = 32) -> None:
    """Alpaca records far longer than max_seq_len, so every sequence is cut to the full length."""
    with open(path, "w") as out:
        for i in range(count):
            text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(700))
            out.write(json.dumps({"instruction": f"Tell story {i}.", "output": text}) + "\n")


def recipe_text(data, micro_batch: str) -> str:
    return (f'name = "probe"\n[model]\nname = "tiny"\n[dataset]\nname = "{data}"\nformat = "alpaca"\n'
            f'[method]\nkind = "lora"\n[train]\nmicro_batch = {micro_batch}\nmax_micro_batch = 8\n'
            "max_seq_len = 256\npacking = false\nmax_steps = 3\nmemory_headroom = 0.0\n")


def test_probe_picks_a_micro_batch_and_an_auto_run_trains_with_it(tmp_path, runs_dir):
    data = tmp_path / "long.jsonl"
    long_records(data)
    fixed = tmp_path / "fixed.toml"
    fixed.write_text(recipe_text(data, "2"))

    done = llmtui("probe", str(fixed), "--steps", "2", "--json", runs_dir=runs_dir, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(done.stdout)
    rows = {r["micro_batch"]: r for r in found["rows"]}
    assert sorted(rows) == [1, 2, 4, 8] and all(r["status"] == "ok" for r in rows.values())
    assert found["chosen"] == 8 and found["device"] == "cpu"  # this machine's memory holds every size
    for row in rows.values():
        assert row["measured_bytes"] > 0 and row["predicted_bytes"] > 0 and row["tokens_per_s"] > 0
    assert rows[8]["peak_bytes"] > rows[4]["peak_bytes"] > rows[1]["peak_bytes"]
    assert rows[8]["predicted_bytes"] > rows[4]["predicted_bytes"]
    folders = list((runs_dir / ".probes").iterdir())
    assert len(folders) == 1 and json.loads((folders[0] / "probe.json").read_text())["chosen"] == 8
    assert not probe_buffers(folders[0])

    # a cap halfway between the peaks of 4 and 8: the run keeps 4 and trains with it
    cap = (rows[4]["peak_bytes"] + rows[8]["peak_bytes"]) // 2
    auto = tmp_path / "auto.toml"
    auto.write_text(recipe_text(data, '"auto"'))
    env = {**os.environ, "LLMTUI_DEVICE_MEMORY": str(cap)}
    ran = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs_dir), "run", str(auto)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    run_dir = only_run(runs_dir)
    assert ran.returncode == 0, ran.stdout + ran.stderr + (run_dir / "stdout.log").read_text(errors="replace")[-3000:]
    assert run_info(run_dir)["status"] == "succeeded"
    probed = json.loads((run_dir / "probe.json").read_text())
    assert probed["chosen"] == 4 and probed["limit_bytes"] == cap, probed
    assert probed["predicted_bytes"] > 0 and probed["measured_bytes"] > 0
    assert 'micro_batch = 4' in (run_dir / "recipe.toml").read_text()
    assert not probe_buffers(run_dir)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "probed" and e["micro_batch"] == 4 for e in events)
    steps = [r for r in metrics(run_dir) if r.get("split", "train") == "train" and r.get("samples_per_s")]
    assert steps and all(round(r["samples_per_s"] * r["step_time"]) == 4 for r in steps), steps

    estimate = llmtui("estimate", str(auto), runs_dir=runs_dir, check=True)
    assert "micro_batch auto (" in estimate.stdout
    assert "measured / predicted memory: median" in estimate.stdout and "over 2 probed runs" in estimate.stdout
