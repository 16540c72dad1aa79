"""The device queue, sweeps, run notes and notifications, on real files, locks and processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.e2e.helpers import llmtui
from tuiapp.core.common.errors import RecipeError, RunError, UserError
from tuiapp.core.config import sweep
from tuiapp.core.config.recipe import NotifySpec, recipe_from_dict
from tuiapp.core.machine import notify, runlock
from tuiapp.core.machine.gpus import GpuInfo, GpuProcess
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store import meta, queue
from tuiapp.core.store.runs import RunStore

HOLD = "import sys, time; time.sleep(60)"


class Holder:
    """A live 'supervisor': a process holding a run's lock."""

    def __init__(self, run_dir):
        fd = runlock.acquire(rundir.lock_path(run_dir))
        self.process = subprocess.Popen([sys.executable, "-c", HOLD], pass_fds=(fd,))
        os.close(fd)

    def stop(self):
        self.process.kill()
        self.process.wait()


@pytest.fixture
def holders():
    made = []
    yield lambda run_dir: made.append(Holder(run_dir)) or made[-1]
    for holder in made:
        holder.stop()


def test_waiting_order_priority_then_fifo_then_moves(tmp_path, holders):
    for name, priority, at in (("a", 0, 1.0), ("b", 0, 2.0), ("c", 5, 3.0), ("d", 0, 4.0)):
        holders(tmp_path / name)
        queue.enqueue(tmp_path, name, priority=priority, now=at)
    assert [w.run_id for w in queue.waiting(tmp_path)] == ["c", "a", "b", "d"]
    assert [w.run_id for w in queue.move(tmp_path, "d", "top")] == ["c", "d", "a", "b"]
    assert [w.run_id for w in queue.move(tmp_path, "a", "down")] == ["c", "d", "b", "a"]
    assert [w.run_id for w in queue.move(tmp_path, "a", "up")] == ["c", "d", "a", "b"]
    assert queue.position(tmp_path, "b") == 4 and queue.position(tmp_path, "zz") is None
    with pytest.raises(KeyError):
        queue.move(tmp_path, "zz", "top")


def test_a_waiting_entry_whose_supervisor_died_is_dropped(tmp_path, holders):
    holder = holders(tmp_path / "a")
    queue.enqueue(tmp_path, "a")
    queue.enqueue(tmp_path, "ghost")  # nobody holds its lock
    assert [w.run_id for w in queue.waiting(tmp_path, prune=True)] == ["a"]
    assert not queue.waiting_path(tmp_path, "ghost").exists()
    holder.stop()
    assert queue.waiting(tmp_path) == []


def test_only_the_head_starts_and_slots_bound_the_runs_at_once(tmp_path, holders):
    me = os.getpid()
    created = __import__("psutil").Process(me).create_time()
    for name, at in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        holders(tmp_path / name)
        queue.enqueue(tmp_path, name, slots=2, now=at)
    start = dict(want=1, slots=2, queued=True, cuda_gpus=[], pid=me, pid_create_time=created)
    assert queue.try_start(tmp_path, "b", **start) is None  # a is ahead
    assert queue.try_start(tmp_path, "a", **start) == []
    assert queue.try_start(tmp_path, "b", **start) == []  # the second slot
    assert queue.try_start(tmp_path, "c", **start) is None  # both slots taken
    queue.release(tmp_path, "a")
    assert queue.try_start(tmp_path, "c", **start) == []


def test_claims_of_dead_processes_free_their_devices(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    queue.write_claim(tmp_path, "old", [0], dead.pid, time.time())
    assert queue.claims(tmp_path) == {} and not queue.claim_path(tmp_path, "old").exists()


def test_gpu_fit_respects_other_runs_and_foreign_processes():
    gpus = [GpuInfo(0, "A", 80 << 30, 0), GpuInfo(1, "A", 80 << 30, 0, [GpuProcess(7, 30 << 30)]),
            GpuInfo(2, "A", 80 << 30, 0), GpuInfo(3, "A", 80 << 30, 0)]
    live = {"other": {"devices": [0]}}
    assert queue.fit(2, cuda_gpus=gpus, live=live, slots=1, foreign_bytes=1 << 30) == [2, 3]
    assert queue.fit(3, cuda_gpus=gpus, live=live, slots=1, foreign_bytes=1 << 30) is None
    assert queue.fit([1, 2], cuda_gpus=gpus, live=live, slots=1, foreign_bytes=1 << 30) is None
    assert queue.fit([1, 2], cuda_gpus=gpus, live=live, slots=1, foreign_bytes=64 << 30) == [1, 2]


def _data(**extra) -> dict:
    return {"name": "s", "model": {"name": "tiny"}, "method": {"kind": "lora"}, **extra}


def test_sweep_expands_every_combination_with_names_and_values():
    plan = sweep.plan_sweep(_data(), "", "r.toml", sweep.parse_grid(
        ["train.learning_rate=1e-4,3e-4", "method.rank=8,16"]))
    assert plan.keys == ["train.learning_rate", "method.rank"] and len(plan.combinations) == 4
    values = [c.values for c in plan.combinations]
    assert values[0] == {"train.learning_rate": 1e-4, "method.rank": 8}
    assert {(c.recipe.train.learning_rate, c.recipe.method.rank) for c in plan.combinations} == \
        {(1e-4, 8), (1e-4, 16), (3e-4, 8), (3e-4, 16)}
    assert len({c.recipe.name for c in plan.combinations}) == 4
    assert plan.table()[0].split()[:3] == ["#", "run", "name"]


def test_sweep_table_in_the_recipe_and_random_draws():
    data = _data(sweep={"grid": {"train.learning_rate": [1e-4, 2e-4, 3e-4], "method.rank": [4, 8, 16]},
                        "random": 4, "seed": 3})
    one = sweep.plan_sweep(data, "", "r.toml", {})
    two = sweep.plan_sweep(data, "", "r.toml", {})
    assert len(one.combinations) == 4 and one.total == 9
    assert [c.values for c in one.combinations] == [c.values for c in two.combinations]
    assert all(c.recipe.sweep.grid == {} for c in one.combinations)  # children do not sweep again


def test_invalid_sweep_values_name_the_combination_key_and_value():
    with pytest.raises(RecipeError) as info:
        sweep.plan_sweep(_data(), "", "r.toml", sweep.parse_grid(["train.learning_rate=1e-4,-5", "method.rank=8"]))
    text = str(info.value)
    assert "combination 2" in text and "train.learning_rate=-5" in text and "1 of 2" in text
    with pytest.raises(UserError, match="nothing to sweep"):
        sweep.plan_sweep(_data(), "", "r.toml", {})
    with pytest.raises(UserError, match="bad --grid"):
        sweep.parse_grid(["train.learning_rate"])
    assert sweep.split_values('1,[2, 3],"a,b"') == ["1", "[2, 3]", '"a,b"']


def test_halving_keeps_the_better_half():
    assert sweep.in_worse_half(3.0, {"a": 1.0}) == (False, None)
    assert sweep.in_worse_half(3.0, {"a": 1.0, "b": 3.0})[0] is True
    assert sweep.in_worse_half(1.0, {"a": 1.0, "b": 3.0})[0] is False
    worse, median = sweep.in_worse_half(2.0, {"a": 1.0, "b": 2.0, "c": 3.0})
    assert worse is False and median == 2.0  # of 3, the better 2 go on


def test_halving_ranks_rl_runs_by_their_primary_reward_not_their_loss():
    """grpo/rloo's loss is ~0 whatever the run learned: the halving rule takes the primary reward's mean over
    the last steps up to the halving step (higher better, kept as its negative); other runs their loss."""
    grpo = {"method": {"kind": "grpo", "rewards": [{"kind": "format", "pattern": "x"},
                                                   {"kind": "answer", "column": "answer", "primary": True}]}}
    rows = [{"step": s, "loss": 0.0, "rewards/answer/mean": s / 10, "rewards/format/mean": 1.0} for s in range(1, 9)]
    rows.insert(3, {"step": 3, "split": "eval", "eval_rewards/answer/mean": 0.9})  # an eval row counts for nothing
    assert sweep.halving_value(rows, 7, grpo) == pytest.approx(-(0.3 + 0.4 + 0.5 + 0.6 + 0.7) / 5)
    assert sweep.halving_value(rows, 2, grpo) == pytest.approx(-(0.1 + 0.2) / 2)
    assert sweep.halving_value(rows, 9, grpo) is None  # not there yet
    better = sweep.halving_value([{**r, "rewards/answer/mean": 0.9} for r in rows if "loss" in r], 7, grpo)
    assert sweep.in_worse_half(sweep.halving_value(rows, 7, grpo), {"a": better, "b": -0.5})[0] is True
    assert sweep.halving_text(-0.5, grpo) == "answer reward 0.5000 (mean of its last 5 steps)"
    sft = {"method": {"kind": "sft"}}
    assert sweep.halving_value(rows, 7, sft) == 0.0 and sweep.halving_text(1.25, sft) == "loss 1.2500"
    assert sweep.halving_value([{"step": 7, "loss": 2.5}, {"step": 8, "loss": 1.0}], 7, sft) == 2.5


def test_sweep_cli_refuses_bad_values_before_anything_exists(tmp_path):
    result = llmtui("sweep", "recipes/tiny-lora.toml", "--grid", "train.learning_rate=1e-3,abc",
                    "--grid", "method.rank=4", runs_dir=tmp_path / "runs")
    assert result.returncode == 2
    assert "train.learning_rate" in result.stderr and '"abc"' in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    dry = llmtui("sweep", "recipes/tiny-lora.toml", "--grid", "train.learning_rate=1e-3,3e-3", "--grid",
                 "method.rank=4,8", "--dry-run", runs_dir=tmp_path / "runs", check=True)
    assert "4 runs" in dry.stdout and "dry run: nothing was created" in dry.stdout
    assert len([line for line in dry.stdout.splitlines() if line.strip()[:1].isdigit()]) == 4
    assert not (tmp_path / "runs").exists() or not any(p for p in (tmp_path / "runs").iterdir()
                                                       if not p.name.startswith("."))


def test_tags_notes_names_archive_and_trash(tmp_path):
    store = RunStore(tmp_path)
    run = store.create(recipe_from_dict({"name": "m", "method": {"kind": "lora"}}))
    run.update(status="succeeded")
    assert meta.change_tags(run.path, ["+baseline", "+lr-3e-4", "-missing"]) == ["baseline", "lr-3e-4"]
    assert meta.change_tags(run.path, ["-baseline"]) == ["lr-3e-4"]
    with pytest.raises(UserError, match="not a valid tag"):
        meta.change_tags(run.path, ["+bad tag"])
    meta.set_note(run.path, "  first try  ")
    meta.set_display_name(run.path, "shown")
    meta.set_archived(run.path, True)
    assert meta.read_meta(run.path) == {"tags": ["lr-3e-4"], "note": "first try", "display_name": "shown",
                                        "archived": True}
    target = meta.delete(store.get(run.id), tmp_path)
    assert not run.path.exists() and target.parent == meta.trash_dir(tmp_path)
    assert [p.name for p, _ in meta.trashed(tmp_path)] == [run.id]
    assert meta.purge(tmp_path, older_than_days=30) == []
    assert meta.purge(tmp_path, older_than_days=30, now=time.time() + 31 * 86400) == [run.id]


def test_a_live_run_cannot_be_deleted(tmp_path, holders):
    store = RunStore(tmp_path)
    run = store.create(recipe_from_dict({"name": "m", "method": {"kind": "lora"}}))
    run.update(status="running")
    holders(run.path)
    with pytest.raises(RunError, match="live run cannot be deleted"):
        meta.delete(store.get(run.id), tmp_path)
    assert run.path.is_dir()


@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_cli_tags_notes_archive_delete(tmp_path):
    store = RunStore(tmp_path)
    run = store.create(recipe_from_dict({"name": "m", "method": {"kind": "lora"}}))
    run.update(status="failed")
    llmtui("tag", run.id, "+baseline", runs_dir=tmp_path, check=True)
    llmtui("note", run.id, "bad", "lr", runs_dir=tmp_path, check=True)
    rows = json.loads(llmtui("runs", "--json", "--tag", "baseline", runs_dir=tmp_path, check=True).stdout)
    assert [(r["id"], r["tags"], r["note"]) for r in rows] == [(run.id, ["baseline"], "bad lr")]
    llmtui("archive", run.id, runs_dir=tmp_path, check=True)
    assert json.loads(llmtui("runs", "--json", runs_dir=tmp_path, check=True).stdout) == []
    assert len(json.loads(llmtui("runs", "--json", "--archived", runs_dir=tmp_path, check=True).stdout)) == 1
    refused = llmtui("delete", run.id, runs_dir=tmp_path)
    assert refused.returncode == 2 and "--yes" in refused.stderr and run.path.exists()
    llmtui("delete", run.id, "--yes", runs_dir=tmp_path, check=True)
    assert not run.path.exists() and run.id in llmtui("trash", runs_dir=tmp_path, check=True).stdout
    llmtui("trash", "--restore", run.id, runs_dir=tmp_path, check=True)
    assert run.path.is_dir()
    llmtui("delete", run.id, "--yes", runs_dir=tmp_path, check=True)
    purged = llmtui("trash", "--purge", "--older-than", "0", runs_dir=tmp_path, check=True)
    assert purged.stdout.strip() == "purged 1 run"  # not '1 run(s)'


def test_cli_tag_removes_a_tag_given_as_minus_name(tmp_path):
    # `llmtui tag RUN -old` was taken for an unknown option (exit 2, the tag kept)
    store = RunStore(tmp_path)
    run = store.create(recipe_from_dict({"name": "m", "method": {"kind": "lora"}}))
    run.update(status="failed")
    meta.change_tags(run.path, ["+old", "+keep"])
    done = llmtui("tag", run.id, "-old", "+new", runs_dir=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{run.id}: keep new"
    refused = llmtui("tag", run.id, runs_dir=tmp_path)
    assert refused.returncode == 2 and "say which tags" in refused.stderr and "Traceback" not in refused.stderr


def test_cli_runs_says_a_filter_matched_nothing_not_that_there_are_no_runs(tmp_path):
    # `llmtui runs --tag typo` said "no runs in DIR" over a folder full of runs
    run = RunStore(tmp_path).create(recipe_from_dict({"name": "m", "method": {"kind": "lora"}}))
    run.update(status="failed")
    listed = llmtui("runs", "--tag", "typo", runs_dir=tmp_path, check=True).stdout.strip()
    assert listed == f"no run in {tmp_path} matches --tag typo (1 run in all: `llmtui runs --all`)"
    llmtui("archive", run.id, runs_dir=tmp_path, check=True)
    listed = llmtui("runs", runs_dir=tmp_path, check=True).stdout.strip()
    assert listed == f"no runs to show in {tmp_path}: 1 archived run (`llmtui runs --archived`)"


def test_notify_command_runs_without_a_shell_with_the_event(tmp_path):
    out = tmp_path / "got.txt"
    script = f"import os, sys; open({str(out)!r}, 'w').write(os.environ['LLMTUI_EVENT'] + '|' + sys.stdin.read())"
    spec = NotifySpec(command=f"{sys.executable} -c \"{script}\"", on=["failed"])
    assert notify.send(spec, "succeeded", tmp_path, "r1", "n", "succeeded") is False
    assert notify.send(spec, "failed", tmp_path, "r1", "n", "failed", "rank 0: OSError: x") is True
    deadline = time.time() + 10
    while not out.exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    assert out.read_text() == "failed|llmtui: n (r1) failed: rank 0: OSError: x\n"
    # its output goes to the log its caller names: the supervisor names the run's notify.log
    log = RunDir(tmp_path).notify_log
    said = NotifySpec(command=f"{sys.executable} -c \"print('sent')\"", on=["failed"])
    assert notify.send(said, "failed", tmp_path, "r1", "n", "failed", log=log) is True
    deadline = time.time() + 10
    while "sent" not in (log.read_text() if log.exists() else "") and time.time() < deadline:
        time.sleep(0.05)
    assert log.read_text() == "sent\n" and log.name == "notify.log"
