"""Hosts, hostfiles, node plans and the multi-node argv builders (pure, golden)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.config.recipe import LaunchSpec, recipe_from_dict
from tuiapp.core.plan import cluster
from tuiapp.core.prelaunch import cluster_checks
from tuiapp.core.store.runs import Run, RunStore


def launch(**values) -> LaunchSpec:
    return LaunchSpec(**values)


# ---------------------------------------------------------------- hostfiles


def test_hostfile_parses_comments_and_blank_lines():
    hosts = cluster.parse_hostfile_text("# pool\nnode1 slots=8\n\nnode2  slots = 4  # half\n", "hf")
    assert hosts == [cluster.Host("node1", 8, 2), cluster.Host("node2", 4, 4)]
    assert cluster.hostfile_text(hosts) == "node1 slots=8\nnode2 slots=4\n"


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("node1 slots=8\nnode2\n", 2, "'node2 slots=N'"),
        ("node1 slots=8\nnode1 slots=8\n", 2, "list each host once"),
        ("node1 slots=0\n", 1, "at least 1"),
        ("node1 gpus=8\n", 1, "HOSTNAME slots=N"),
    ],
)
def test_hostfile_errors_name_file_line_and_fix(text, line, words):
    with pytest.raises(RecipeError) as info:
        cluster.parse_hostfile_text(text, "/etc/hosts.mpi")
    error = info.value
    assert error.file == "/etc/hosts.mpi" and error.line == line and error.key == "launch.hosts"
    assert words in str(error)


def test_empty_and_missing_hostfile(tmp_path):
    with pytest.raises(RecipeError, match="lists no hosts"):
        cluster.parse_hostfile_text("# nothing\n", "hf")
    with pytest.raises(RecipeError) as info:
        cluster.read_hostfile(tmp_path / "nope")
    assert info.value.file.endswith("nope") and "hosts = [" in info.value.fix


def test_inline_hosts_are_validated_by_the_schema():
    assert recipe_from_dict({"method": {"kind": "lora"}, "launch": {"hosts": ["a slots=2", "b slots=2"]}}).launch.hosts == ["a slots=2", "b slots=2"]
    with pytest.raises(RecipeError) as info:
        recipe_from_dict({"method": {"kind": "lora"}, "launch": {"hosts": ["a slots=2", "b"]}})
    assert info.value.key == "launch.hosts" and "hosts entry 2 'b'" in info.value.message


def test_hosts_from_a_relative_hostfile(tmp_path):
    (tmp_path / "hostfile").write_text("w0 slots=2\nw1 slots=2\n")
    hosts = cluster.hosts_of(launch(hosts="hostfile"), base_dir=tmp_path)
    assert [h.name for h in hosts] == ["w0", "w1"]


@pytest.mark.parametrize(
    "values, expected",
    [
        ({}, [("a", 4), ("b", 4), ("c", 2)]),
        ({"include": "a@c:1"}, [("a", 4), ("c", 1)]),
        ({"exclude": "b@a:0,1"}, [("a", 2), ("c", 2)]),
        ({"nodes": 2, "gpus_per_node": 1}, [("a", 1), ("b", 1)]),
    ],
)
def test_active_hosts_follow_deepspeed_filters(values, expected):
    hosts = [cluster.Host("a", 4), cluster.Host("b", 4), cluster.Host("c", 2)]
    assert cluster.active_hosts(launch(**values), hosts) == expected


# ---------------------------------------------------------------- plans and argv


def test_node_plan_and_deepspeed_no_ssh_argv_golden():
    plan = cluster.plan_node(launch(gpus=2), 2, node_rank=1, nnodes=2, master_addr="10.0.0.1", master_port=None)
    assert (plan.world_size, plan.master_port, plan.global_ranks()) == (4, 29500, [2, 3])
    assert plan.nodes() == [{"node_rank": 0, "host": None, "ranks": [0, 1]},
                            {"node_rank": 1, "host": None, "ranks": [2, 3]}]
    assert cluster.node_hostfile_text(plan) == "node0 slots=2\nnode1 slots=2\n"
    argv = cluster.deepspeed_node_argv(Path("/r/x"), plan, Path("/r/x/nodes/hostfile"), python="/py")
    assert argv == ["/py", "-m", "deepspeed.launcher.runner", "--hostfile", "/r/x/nodes/hostfile", "--no_ssh",
                    "--node_rank", "1", "--master_addr", "10.0.0.1", "--master_port", "29500",
                    "--module", "tuiapp.trainer", "--run-dir", "/r/x"]
    plan.gpu_ids = [1, 3]
    assert "node0:1,3@node1:1,3" in cluster.deepspeed_node_argv(Path("/r"), plan, Path("/h"), resume=True)


def test_node_plan_takes_names_and_master_from_hosts():
    plan = cluster.plan_node(launch(hosts=["g1 slots=8", "g2 slots=8", "g3 slots=8"], nodes=2), 8,
                             node_rank=0, nnodes=None, master_addr=None, master_port=29600)
    assert (plan.nnodes, plan.master_addr, plan.names) == (2, "g1", ["g1", "g2"])
    assert plan.nodes()[1] == {"node_rank": 1, "host": "g2", "ranks": list(range(8, 16))}


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"node_rank": 2, "nnodes": 2, "master_addr": "h"}, "outside the 2 nodes"),
        ({"node_rank": 0, "nnodes": None, "master_addr": "h"}, "number of nodes is unknown"),
        ({"node_rank": 0, "nnodes": 2, "master_addr": None}, "master address is unknown"),
    ],
)
def test_node_plan_errors(kwargs, words):
    with pytest.raises(RecipeError, match=words):
        cluster.plan_node(launch(), 1, master_port=None, **kwargs)


def test_torchrun_argv_golden():
    plan = cluster.NodePlan(2, 1, "head", 29501, 4)
    assert cluster.torchrun_argv(Path("/r/x"), plan, resume=True, python="/py") == [
        "/py", "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "4",
        "--master_addr", "head", "--master_port", "29501", "-m", "tuiapp.trainer", "--run-dir", "/r/x", "--resume"]


def test_deepspeed_hosts_argv_golden():
    spec = launch(hosts=["a slots=8", "b slots=8"], launcher="openmpi", include="a@b:0,1")
    argv = cluster.deepspeed_hosts_argv(Path("/r/x"), spec, Path("/r/x/hostfile"), 29500, python="/py")
    assert argv == ["/py", "-m", "deepspeed.launcher.runner", "--hostfile", "/r/x/hostfile", "--master_port",
                    "29500", "--launcher", "openmpi", "--include", "a@b:0,1", "--module", "tuiapp.trainer",
                    "--run-dir", "/r/x"]
    spec = launch(hosts=["a slots=8", "b slots=8"], nodes=1, gpus_per_node=2)
    argv = cluster.deepspeed_hosts_argv(Path("/r"), spec, Path("/h"), 1, master_addr="a", python="/py")
    assert argv[5:] == ["--master_port", "1", "--launcher", "pdsh", "--master_addr", "a", "--num_nodes", "1",
                        "--num_gpus", "2", "--module", "tuiapp.trainer", "--run-dir", "/r"]


def test_build_launch_hosts_mode_plans_hostfile_and_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("HF_TOKEN", "secret")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".deepspeed_env").write_text("MY_VAR=1\n")
    spec = launch(hosts=["a slots=2", "b slots=2"])
    plan = cluster.build_launch(tmp_path, spec, 0, port=29555, python="/py")
    assert not (tmp_path / "hostfile").exists()  # planning writes nothing
    cluster.write_files(plan)
    assert (tmp_path / "hostfile").read_text() == "a slots=2\nb slots=2\n"
    assert (tmp_path / ".deepspeed_env").stat().st_mode & 0o777 == 0o600
    ds_env = (tmp_path / ".deepspeed_env").read_text()
    assert "MY_VAR=1" in ds_env and "NCCL_SOCKET_IFNAME=eth0" in ds_env and "GLOO_SOCKET_IFNAME=eth0" in ds_env
    assert "HF_TOKEN" not in ds_env
    assert plan.env["DS_ENV_FILE"] == str((tmp_path / ".deepspeed_env").resolve())
    assert plan.owner and plan.fields["nodes"][1] == {"node_rank": 1, "host": "b", "ranks": [2, 3]}
    assert plan.fields["world_size"] == 4 and plan.ranks == 2


def test_build_launch_single_node_strategies(tmp_path):
    ds = cluster.build_launch(tmp_path, launch(gpus=2), 0, port=1234, python="/py")
    assert ds.argv[3] == "deepspeed.launcher.launch" and ds.fields == {}
    ddp = cluster.build_launch(tmp_path, launch(gpus=2, strategy="ddp"), 0, port=1234, python="/py")
    assert ddp.argv[2] == "torch.distributed.run" and ddp.fields["world_size"] == 2
    node = cluster.build_launch(tmp_path, launch(strategy="fsdp"), 0, port=1234,
                                node=cluster.NodeArgs(1, 2, "127.0.0.1"), python="/py")
    assert not node.owner and node.log_path(tmp_path) == tmp_path / "nodes" / "1.log"
    assert node.argv[2] == "torch.distributed.run" and "--node_rank" in node.argv


def test_join_command():
    plan = cluster.NodePlan(2, 0, "10.0.0.1", 29500, 1)
    text = cluster.join_command("r.toml", "run-1", plan, "/shared/runs", ["train.max_steps=5"])
    assert text == ("llmtui --runs-dir /shared/runs run r.toml --set train.max_steps=5 --node-rank K --nnodes 2 "
                    "--master-addr 10.0.0.1 --master-port 29500 --run-id run-1")


# ---------------------------------------------------------------- errors and checks


@pytest.mark.parametrize(
    "log, words",
    [
        ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
         "address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
         "port in use"),
        ("RuntimeError: Using hostfile at /r/hostfile but host=node2 was not reachable via ssh.", "unreachable node"),
        ("socket.gaierror: [Errno -2] Name or service not known", "does not resolve"),
        ("[W socket.cpp:752] [c10d] The client socket has failed to connect to [head]:29500 (errno: 111 - "
         "Connection refused).", "could not connect to the master 10.0.0.1:29500"),
        ("AssertionError: Launching training without ssh, but --node_rank is not set correctly.",
         "mismatched world size"),
        ("torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
         "rendezvous timeout"),
        ("RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:26537: Connection reset by peer",
         "a rank on another node stopped"),
    ],
)
def test_known_failures_get_a_clear_reason(log, words):
    reason = cluster.explain_failure("noise\n" + log + "\nmore noise", "10.0.0.1", 29500)
    assert reason and words in reason


def test_unknown_failure_is_left_alone():
    assert cluster.explain_failure("ValueError: something else") is None


def test_port_in_use_is_found_before_launch():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        sock.listen()
        port = sock.getsockname()[1]
        recipe = recipe_from_dict({"method": {"kind": "lora"}, "launch": {"master_port": port}})
        findings = cluster_checks.launch_findings(recipe, node_rank=0)
        assert [f.key for f in findings] == ["launch.master_port"] and "port in use" in findings[0].message
        assert cluster_checks.launch_findings(recipe, node_rank=1, master_addr="localhost") == []  # node 0's port
    bad = cluster_checks.launch_findings(recipe_from_dict({"method": {"kind": "lora"}}), node_rank=1, master_addr="no-such-host.invalid")
    assert bad and "unreachable node" in bad[0].message


def test_hosts_that_do_not_resolve_are_errors():
    recipe = recipe_from_dict({"method": {"kind": "lora"}, "launch": {"hosts": ["no-such-host.invalid slots=1"], "launcher": "openmpi"}})
    findings = cluster_checks.launch_findings(recipe)
    assert [f.key for f in findings] == ["launch.hosts"] and "does not resolve" in findings[0].message


# ---------------------------------------------------------------- node records and the watch


def test_node_records_and_watch(tmp_path):
    run = RunStore(tmp_path).create(recipe_from_dict({"method": {"kind": "lora"}, "name": "n"}), run_id="shared-1")
    plan = cluster.NodePlan(3, 0, "h", 29500, 1)
    watch = cluster.NodeWatch(run, plan, join_timeout_s=60, started=time.monotonic())
    cluster.write_node(run.path, 1, status="running", host="b")
    assert watch.poll() is None
    nodes = Run(run.path).load().record.nodes
    assert nodes[1] == {"node_rank": 1, "host": "b", "ranks": [1], "status": "running"}
    assert nodes[2]["status"] == "waiting"
    watch.started -= 61
    reason = watch.poll()
    assert reason.startswith("rendezvous timeout: node(s) 2 did not join within 60s")
    assert "--run-id shared-1" in reason
    cluster.write_node(run.path, 2, status="failed", host="c", reason="boom")
    assert watch.poll() == "node 2 (c) failed: boom"
    assert sorted(cluster.node_records(run.path)) == [1, 2]


def test_run_id_is_shared_and_unique(tmp_path):
    store = RunStore(tmp_path)
    recipe = recipe_from_dict({"method": {"kind": "lora"}})
    assert store.create(recipe, run_id="job-7").id == "job-7"
    with pytest.raises(Exception, match="already exists"):
        store.create(recipe, run_id="job-7")
    with pytest.raises(Exception, match="not a valid run id"):
        store.create(recipe, run_id="../x")


def test_runs_of_another_host_are_not_judged_by_pid(tmp_path):
    run = RunStore(tmp_path).create(recipe_from_dict({"method": {"kind": "lora"}}))
    run.update(status="running", pid=999999, host="some-other-node")
    assert Run(run.path).load().refresh_truth().status == "running"
    run.update(host=socket.gethostname())
    assert Run(run.path).load().refresh_truth().status == "failed"


def test_stop_refuses_a_run_supervised_on_another_host(tmp_path):
    from tuiapp.core.lifecycle import service

    run = RunStore(tmp_path).create(recipe_from_dict({"method": {"kind": "lora"}}))
    run.update(status="running", pid=999999, pgid=999999, host="some-other-node")
    with pytest.raises(Exception, match="supervised on some-other-node"):
        service.stop(Run(run.path).load(), grace_s=1)
