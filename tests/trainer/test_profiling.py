"""train.profile_steps: torch.profiler over a few steps after the first 3, through the real launcher and
Trainer; the run folder's profile/ (ops table, summary, Chrome trace) and `llmtui show` reading it; the
rules that refuse or warn before launch."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from tests.e2e.helpers import llmtui, run_info
from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.prelaunch.recipe_rules import recipe_rules
from tuiapp.core.run_folder import events
from tuiapp.core.run_folder.metrics import read_jsonl
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.trainer.loop.profiling import summary


def test_the_summary_ranks_ops_by_their_own_time_and_shares_the_wall_time():
    a = torch.randn(256, 256)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            a @ a
        a.sum()
    figures = summary(prof.key_averages(), wall_s=10.0, steps=2, first_step=4, on_device=False)
    assert figures["steps"] == 2 and figures["step_s"] == 5.0 and figures["clock"] == "cpu"
    assert figures["device_busy"] is None  # a CPU clock says nothing of a device
    names = [op["name"] for op in figures["ops"]]
    assert "aten::mm" in names[:2], names
    mm = figures["ops"][names.index("aten::mm")]
    assert mm["calls"] == 20 and 0 < mm["share"] == pytest.approx(mm["self_us"] / 1e7)
    assert [op["self_us"] for op in figures["ops"]] == sorted((op["self_us"] for op in figures["ops"]), reverse=True)


def test_profile_rules():
    assert recipe_rules(parse_recipe('[method]\nkind = "sft"\n[train]\nprofile_steps = 2\nmax_steps = 10\n')) == []
    short = recipe_rules(parse_recipe('[method]\nkind = "sft"\n[train]\nprofile_steps = 4\nmax_steps = 5\n'))
    assert [(f.level, f.key) for f in short] == [("warning", "train.profile_steps")]
    assert "leaves 2 of the 4 steps" in short[0].message and "max_steps >= 7" in short[0].fix
    piped = recipe_rules(parse_recipe('[method]\nkind = "sft"\n[train]\nprofile_steps = 2\n'
                                      '[launch]\nstrategy = "pipeline"\ngpus = 2\n'))
    assert ("error", "train.profile_steps") in [(f.level, f.key) for f in piped]


@pytest.mark.slow
def test_a_run_records_its_profiled_steps_and_show_prints_them(tmp_path):
    done = llmtui("run", "recipes/tiny-sft.toml", "--set", "train.max_steps=6", "--set", "train.eval_steps=0",
                  "--set", "train.sample_prompts=[]", "--set", "train.profile_steps=2", runs_dir=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert run_info(run)["status"] == "succeeded"
    folder = RunDir(run)
    figures = json.loads(folder.profile_summary.read_text())
    assert (figures["first_step"], figures["steps"]) == (4, 2) and figures["wall_s"] > 0
    assert "aten::mm" in [op["name"] for op in figures["ops"]]  # the model's matmuls
    assert "aten::mm" in folder.profile_ops.read_text()
    trace = json.loads(gzip.open(folder.profile_trace).read())
    assert any(e.get("name") == "aten::mm" for e in trace["traceEvents"])
    (profiled,) = [e for e in read_jsonl(folder.events) if events.kind(e) == events.PROFILED]
    assert (profiled["first_step"], profiled["steps"]) == (4, 2)
    steps = [r["step"] for r in read_jsonl(folder.metrics) if r.get("split", "train") == "train"]
    assert steps == [1, 2, 3, 4, 5, 6]  # every step trained and logged as without the profiler

    shown = llmtui("show", run.name, runs_dir=tmp_path, check=True).stdout
    assert "  profile   steps 4-5: " in shown and "(show --profile: the ops)" in shown
    full = llmtui("show", run.name, "--profile", runs_dir=tmp_path, check=True).stdout
    assert "aten::mm" in full and str(folder.profile_trace) in full
    document = json.loads(llmtui("show", run.name, "--json", runs_dir=tmp_path, check=True).stdout)
    assert document["profile"]["steps"] == 2
