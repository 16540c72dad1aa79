"""`llmtui run` scale-out flags: dry runs, joining rules and clear errors (no training)."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.e2e.helpers import ROOT
from tuiapp.cli.main import main
from tuiapp.core.config.recipe import load_recipe
from tuiapp.core.plan import cluster
from tuiapp.core.store.runs import RunStore

RECIPE = str(ROOT / "recipes" / "tiny-sft.toml")


def run_cli(capsys, runs_dir, *args):
    code = main(["--runs-dir", str(runs_dir), "run", RECIPE, *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_node_mode_dry_run_prints_both_commands(capsys, tmp_path):
    code, out, err = run_cli(capsys, tmp_path, "--node-rank", "0", "--nnodes", "2", "--master-addr", "10.1.1.1",
                             "--master-port", "29533", "--run-id", "job1", "--set", "launch.zero_stage=2", "--dry-run")
    assert code == 0, err
    assert "would run on node 0: " in out and "--no_ssh --node_rank 0 --master_addr 10.1.1.1 --master_port 29533" in out
    assert "--node-rank K --nnodes 2 --master-addr 10.1.1.1 --master-port 29533 --run-id job1" in out
    assert not any(tmp_path.iterdir())


def test_slurm_dry_run_prints_the_script(capsys, tmp_path):
    code, out, err = run_cli(capsys, tmp_path, "--slurm", "--nodes", "2", "--partition", "debug", "--time", "1:00:00",
                             "--dry-run")
    assert code == 0, err
    assert out.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2" in out and "#SBATCH --partition=debug" in out
    assert "--node-rank \"$SLURM_NODEID\"" in out
    script = tmp_path / "job.sbatch"
    script.write_text(out)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert [p.name for p in tmp_path.iterdir()] == ["job.sbatch"]


def test_strategy_dry_run_uses_torchrun(capsys, tmp_path):
    code, out, _ = run_cli(capsys, tmp_path, "--set", "launch.strategy='ddp'", "--set", "launch.gpus=2", "--dry-run")
    assert code == 0 and "-m torch.distributed.run --nnodes 1 --node_rank 0 --nproc_per_node 2" in out


@pytest.mark.parametrize(
    "args, words",
    [
        (["--partition", "x"], "--partition only apply to SLURM runs"),
        (["--slurm", "--node-rank", "0"], "do not go together"),
        (["--run-id", "x"], "--run-id need --node-rank"),
        (["--node-rank", "1", "--master-addr", "h"], "must join node 0's run"),
        (["--node-rank", "0", "--master-addr", "h"], "number of nodes is unknown"),
        (["--set", "launch.strategy='ddp'", "--set", "launch.zero_stage=2"], "ZeRO stages are DeepSpeed's"),
    ],
)
def test_bad_flags_are_clear_errors(capsys, tmp_path, args, words):
    code, out, err = run_cli(capsys, tmp_path, *args, "--dry-run")
    assert code == 2 and words in out + err


def test_port_in_use_on_node_0(capsys, tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        sock.listen()
        port = sock.getsockname()[1]
        code, _, err = run_cli(capsys, tmp_path, "--node-rank", "0", "--nnodes", "2", "--master-addr", "127.0.0.1",
                               "--master-port", str(port), "--dry-run")
    assert code == 2 and f"port in use: rendezvous port {port}" in err


@pytest.fixture
def started(tmp_path):
    """A run as node 0 leaves it for the others: frozen recipe, nnodes, master address and port."""
    recipe = load_recipe(RECIPE, ["train.max_steps=5"])
    run = RunStore(tmp_path).create(recipe, run_id="shared")
    run.update(nnodes=2, master_addr="127.0.0.1", master_port=29544, node_mode="nodes")
    return run


def test_join_with_another_recipe_is_refused(capsys, tmp_path, started):
    code, _, err = run_cli(capsys, tmp_path, "--set", "train.max_steps=6", "--node-rank", "1", "--run-id", "shared")
    assert code == 2 and "differs from the one node 0 started in train.max_steps" in err


def test_join_with_another_world_size_is_refused(capsys, tmp_path, started):
    code, _, err = run_cli(capsys, tmp_path, "--set", "train.max_steps=5", "--node-rank", "1", "--nnodes", "3",
                           "--run-id", "shared")
    assert code == 2 and "mismatched world size: --nnodes 3 here, but node 0 started run shared with 2" in err
    code, _, err = run_cli(capsys, tmp_path, "--set", "train.max_steps=5", "--node-rank", "2", "--run-id", "shared")
    assert code == 2 and "node rank 2 is outside the 2 nodes" in err


def test_join_dry_run_takes_master_and_port_from_node_0(capsys, tmp_path, started):
    code, out, err = run_cli(capsys, tmp_path, "--set", "train.max_steps=5", "--node-rank", "1", "--run-id", "shared",
                             "--dry-run")
    assert code == 0, err
    assert "--no_ssh --node_rank 1 --master_addr 127.0.0.1 --master_port 29544" in out


def test_a_node_joining_while_node_0_still_records_its_nodes_waits_for_them(capsys, tmp_path):
    """run.json exists from the moment node 0 makes the folder, before its node count and port: a node that
    read it then took 0 nodes and left, and node 0 waited for it (CI: two nodes on one machine hung)."""
    import threading

    recipe = load_recipe(RECIPE, ["train.max_steps=5"])
    run = RunStore(tmp_path).create(recipe, run_id="shared")  # status created, no node fields yet
    late = threading.Timer(0.7, lambda: run.update(nnodes=2, master_addr="127.0.0.1", master_port=29545,
                                                   node_mode="nodes"))
    late.start()
    try:
        code, out, err = run_cli(capsys, tmp_path, "--set", "train.max_steps=5", "--node-rank", "1",
                                 "--run-id", "shared", "--dry-run")
    finally:
        late.cancel()
    assert code == 0, err
    assert "--no_ssh --node_rank 1 --master_addr 127.0.0.1 --master_port 29545" in out


def test_node0_run_id_must_be_new(capsys, tmp_path, started):
    code, _, err = run_cli(capsys, tmp_path, "--set", "train.max_steps=5", "--node-rank", "0", "--nnodes", "2",
                           "--master-addr", "127.0.0.1", "--master-port", str(cluster.DEFAULT_PORT + 77),
                           "--run-id", "shared")
    assert code == 2 and "run 'shared' already exists" in err


def test_resume_of_a_slurm_run_resubmits_with_resume(capsys, tmp_path, started, monkeypatch):
    from tuiapp.core.plan import slurm

    started.update(node_mode="slurm", status="failed", slurm_job="5", slurm={"nodes": 2, "time": "01:00:00"})
    submitted = []
    monkeypatch.setattr(slurm, "submit", lambda script: submitted.append(script.read_text()) or "6")
    monkeypatch.setattr(slurm, "available", lambda: False)  # no scheduler asked for the truth here
    code = main(["--runs-dir", str(tmp_path), "resume", "shared", "--detach"])
    assert code == 0, capsys.readouterr()
    assert "--slurm --resume'" in submitted[0] and "#SBATCH --nodes=2" in submitted[0]
    record = RunStore(tmp_path).get("shared").record
    assert (record.slurm_job, record.status) == ("6", "created")


def test_resume_of_a_node_by_node_run_needs_each_node(capsys, tmp_path, started):
    started.update(status="stopped")
    code = main(["--runs-dir", str(tmp_path), "resume", "shared"])
    assert code == 2 and "--node-rank K` on every node, node 0 first" in capsys.readouterr().err


@pytest.mark.slow  # over ~5 s on 2 busy cores
def test_hosts_mode_with_an_unreachable_host_fails_clearly(tmp_path):
    """The real DeepSpeed multi-node runner: no sshd here, so its ssh check fails (or, where ssh
    works, the openmpi backend is missing): either way a clear reason, within seconds."""
    import json
    import sys

    hosts = "launch.hosts=['localhost slots=1', '127.0.0.1 slots=1']"
    result = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(tmp_path), "run", RECIPE,
                             "--set", hosts, "--set", "launch.launcher='openmpi'"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 1, result.stdout + result.stderr
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and info["node_mode"] == "hosts" and info["world_size"] == 2
    assert info["reason"].startswith(("unreachable node", "the multi-node launcher is not installed")), info["reason"]
    assert (run_dir / "hostfile").read_text() == "localhost slots=1\n127.0.0.1 slots=1\n"
    assert "--hostfile" in info["argv"] and info["argv"][info["argv"].index("--launcher") + 1] == "openmpi"
