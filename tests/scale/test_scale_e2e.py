"""Real scale-out runs on CPU: two nodes on this machine, the fsdp and ddp strategies, SLURM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.e2e.helpers import ROOT, kill_group, metrics, only_run, run_info, train_steps, wait_for
from tests.scale.test_slurm import needs_cluster
from tuiapp.core.plan import launcher

pytestmark = pytest.mark.slow

SHORT = ["--set", "train.max_steps=5", "--set", "train.save_steps=5", "--set", "train.eval_steps=0"]


def env_one_thread() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def spawn(runs_dir, *args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs_dir), "run", "recipes/tiny-sft.toml", *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, env=env_one_thread())


@pytest.fixture
def runs_dir(tmp_path):
    yield tmp_path
    for run_dir in tmp_path.iterdir():
        if run_dir.is_dir():
            kill_group(run_dir)
            for record in (run_dir / "nodes").glob("*.json"):
                pgid = json.loads(record.read_text()).get("pgid")
                if pgid:
                    try:
                        os.killpg(pgid, 9)
                    except (ProcessLookupError, PermissionError):
                        pass


def test_two_nodes_on_one_machine_share_one_run(runs_dir):
    port = str(launcher.free_port())
    common = [*SHORT, "--set", "launch.zero_stage=2", "--master-addr", "127.0.0.1", "--run-id", "two-nodes"]
    node0 = spawn(runs_dir, *common, "--node-rank", "0", "--nnodes", "2", "--master-port", port)
    node1 = spawn(runs_dir, *common, "--node-rank", "1")
    deadline = time.monotonic() + 400
    while node0.poll() is None and time.monotonic() < deadline:
        if node1.poll() not in (None, 0):  # node 1 gave up: node 0 would wait for it until the deadline
            node0.kill()
            pytest.fail(f"node 1 left with {node1.returncode}: {node1.communicate()[0]}")
        time.sleep(0.5)
    if node0.poll() is None:
        node0.kill()
        node1.kill()
        pytest.fail(f"node 0 still running after 400 s\nnode 0: {node0.communicate()[0]}\n"
                    f"node 1: {node1.communicate()[0]}")
    out0, _ = node0.communicate()
    out1, _ = node1.communicate(timeout=120)
    run_dir = runs_dir / "two-nodes"
    assert node0.returncode == 0, out0 + (run_dir / "stdout.log").read_text()[-3000:]
    assert node1.returncode == 0, out1 + (run_dir / "nodes" / "1.log").read_text()[-3000:]
    assert "node 1: succeeded" in out1
    info = run_info(run_dir)
    assert info["status"] == "succeeded" and info["world_size"] == 2 and info["nnodes"] == 2
    assert [(n["node_rank"], n["ranks"], n["status"]) for n in info["nodes"]] == [(0, [0], "succeeded"),
                                                                                   (1, [1], "succeeded")]
    assert "--no_ssh" in info["argv"] and info["master_port"] == int(port)
    node1_record = json.loads((run_dir / "nodes" / "1.json").read_text())
    assert node1_record["status"] == "succeeded" and node1_record["node_rank"] == 1
    # metrics written once, by global rank 0, with both ranks' memory and where they ran
    assert train_steps(run_dir) == [1, 2, 3, 4, 5]
    mem = metrics(run_dir)[0]["mem"]
    assert sorted(mem) == ["rank0", "rank1"] and (mem["rank0"]["node"], mem["rank1"]["node"]) == (0, 1)
    assert all(m["host"] for m in mem.values())
    started = [e for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
               if e["event"] == "started"]
    assert len(started) == 1 and started[0]["world_size"] == 2
    # per-node logs; ZeRO-2 optimizer state in two shards
    assert (run_dir / "nodes" / "0.log").resolve() == (run_dir / "stdout.log").resolve()
    assert "node_rank=1" in (run_dir / "nodes" / "1.log").read_text()
    shards = list((run_dir / "checkpoints" / "checkpoint-5").glob("global_step5/*optim_states.pt"))
    assert len(shards) == 2
    assert (run_dir / "final" / "model.safetensors").is_file()
    # what the TUI's run view shows of this run: both nodes, memory per node
    from tuiapp.core.run_folder.metrics import read_jsonl
    from tuiapp.core.run_folder.rundata import RunData
    from tuiapp.core.run_folder.rundir import RunRecord
    from tuiapp.ui.run_panes import memory_text, status_text

    data = RunData()
    data.extend(read_jsonl(run_dir / "metrics.jsonl"))
    status = status_text(RunRecord.from_json(run_info(run_dir)), data, now=0.0)
    assert "node 0 " in status and "node 1 " in status
    memory = memory_text(data, None, monitor=False)
    assert "node 0 rank0" in memory and "node 1 rank1" in memory


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_strategy_on_two_cpu_ranks(runs_dir, strategy):
    process = spawn(runs_dir, *SHORT, "--set", f"launch.strategy='{strategy}'", "--set", "launch.gpus=2")
    out, _ = process.communicate(timeout=400)
    run_dir = only_run(runs_dir)
    assert process.returncode == 0, out + (run_dir / "stdout.log").read_text()[-3000:]
    info = run_info(run_dir)
    assert info["status"] == "succeeded" and info["strategy"] == strategy and info["world_size"] == 2
    assert info["argv"][1:3] == ["-m", "torch.distributed.run"]
    assert train_steps(run_dir) == [1, 2, 3, 4, 5]
    assert sorted(metrics(run_dir)[0]["mem"]) == ["rank0", "rank1"]
    checkpoint = run_dir / "checkpoints" / "checkpoint-5"
    # FSDP saves its sharded-state files; DDP a plain optimizer; neither has DeepSpeed's global_step
    assert (checkpoint / "pytorch_model_fsdp.bin").exists() is (strategy == "fsdp")
    assert not list(checkpoint.glob("global_step*"))
    assert (run_dir / "final" / "model.safetensors").is_file()


@needs_cluster
def test_slurm_run_end_to_end(runs_dir):
    process = spawn(runs_dir, *SHORT, "--set", "launch.gpus=2", "--slurm", "--detach")
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0, out
    run_dir = only_run(runs_dir)
    job = run_info(run_dir)["slurm_job"]
    assert f"submitted SLURM job {job}" in out and (run_dir / "job.sbatch").is_file()
    wait_for(lambda: run_info(run_dir)["status"] in ("succeeded", "failed", "stopped"), timeout=400,
             what="the SLURM run to end")
    info = run_info(run_dir)
    log = (run_dir / "stdout.log").read_text()[-3000:] if (run_dir / "stdout.log").exists() else ""
    assert info["status"] == "succeeded", (info.get("reason"), log)
    assert info["node_mode"] == "slurm" and "--no_ssh" in info["argv"]
    assert train_steps(run_dir) == [1, 2, 3, 4, 5]
    assert (run_dir / f"slurm-{job}.out").is_file()
