"""Scale-out: hosts and hostfiles, node plans, multi-node and torchrun argv, node records.

Pure Python (core layer): no torch, no deepspeed. Three ways a run spans machines:

- hosts mode: `launch.hosts` is set and `llmtui run` runs on the head node; DeepSpeed's own
  multi-node runner (`deepspeed.launcher.runner --hostfile ...`, pdsh/ssh by default) starts
  the ranks on every host. One supervisor, on the head node.
- node mode: the same `llmtui run RECIPE --node-rank K --master-addr HOST --run-id ID` on every
  node (`--no_ssh` for DeepSpeed, torchrun `--node_rank` for fsdp/ddp). One supervisor per
  node; node 0 creates the run folder and owns run.json, node K records itself in
  nodes/K.json and logs to nodes/K.log.
- SLURM (tuiapp.core.plan.slurm): an sbatch script runs node mode on every allocated node.

The run folder must be on a file system every node sees (NFS, Lustre...).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.common.secrets import is_secret_name
from tuiapp.core.config.hosts import Host, host_fix, parse_host_entries, parse_hostfile_text, read_hostfile  # noqa: F401
from tuiapp.core.plan import launcher
from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.rundir import (
    ACTIVE,
    NODE_KEYS,
    STDOUT_LOG,
    RunDir,
    RunRecord,
    check_keys,
    read_record,
)
from tuiapp.core.run_folder.tail import tail_lines

if TYPE_CHECKING:
    from tuiapp.core.config.recipe import LaunchSpec

DEFAULT_PORT = 29500  # TORCH_DISTRIBUTED_DEFAULT_PORT: every node must agree on it
HOSTFILE_NAME = "hostfile"
DS_ENV_NAME = ".deepspeed_env"
PASS_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "TORCHELASTIC_", "PYTORCH_", "HF_", "TRANSFORMERS_",
                 "LLMTUI_", "TOKENIZERS_", "FI_", "UCX_", "CUDA_LAUNCH_BLOCKING", "DS_")
PASS_SKIP = {"DS_ENV_FILE", "LLMTUI_RUN_DIR"}


# ---------------------------------------------------------------- hosts


def hosts_of(launch: "LaunchSpec", base_dir: Path | None = None) -> list[Host]:
    """The recipe's hosts ([] = single machine)."""
    hosts = launch.hosts
    if isinstance(hosts, str):
        if not hosts.strip():
            return []
        path = Path(hosts).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        return read_hostfile(path)
    try:
        return parse_host_entries(list(hosts))
    except ValueError as exc:
        raise RecipeError(message=str(exc), key="launch.hosts", fix=host_fix()) from None


def hostfile_text(hosts: list[Host]) -> str:
    return "".join(f"{h.name} slots={h.slots}\n" for h in hosts)


def uses_hosts(launch: "LaunchSpec") -> bool:
    return bool(launch.hosts.strip() if isinstance(launch.hosts, str) else launch.hosts)


# strategies whose ranks DeepSpeed's launcher starts (pipeline ranks only need RANK / WORLD_SIZE / MASTER_ADDR)
DEEPSPEED_LAUNCHED = ("deepspeed", "pipeline")


def is_scaled(launch: "LaunchSpec") -> bool:
    """Anything beyond the classic single-node DeepSpeed launch."""
    return uses_hosts(launch) or launch.strategy not in DEEPSPEED_LAUNCHED or launch.nodes > 1


# ---------------------------------------------------------------- node plans


@dataclass
class NodePlan:
    """Where this node sits in the run."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    ranks_per_node: int
    gpu_ids: list[int] | None = None
    names: list[str] = field(default_factory=list)  # one name per node (hosts or node0..)
    named: bool = False  # names are real host names (from launch.hosts), not node0, node1...

    @property
    def world_size(self) -> int:
        return self.nnodes * self.ranks_per_node

    def global_ranks(self, node_rank: int | None = None) -> list[int]:
        k = self.node_rank if node_rank is None else node_rank
        return list(range(k * self.ranks_per_node, (k + 1) * self.ranks_per_node))

    def nodes(self) -> list[dict]:
        """run.json's `nodes`: one {node_rank, host, ranks} per node (host known for this one)."""
        out = []
        for k in range(self.nnodes):
            host = self.names[k] if self.named and k < len(self.names) else None
            out.append({"node_rank": k, "host": host, "ranks": self.global_ranks(k)})
        return out


def resolve_port(launch: "LaunchSpec", explicit: int | None = None) -> int:
    """The rendezvous port every node agrees on without talking: explicit, recipe, or 29500."""
    return explicit or launch.master_port or DEFAULT_PORT


def plan_node(launch: "LaunchSpec", local_ranks: int, *, node_rank: int, nnodes: int | None,
              master_addr: str | None, master_port: int | None, gpu_ids: list[int] | None = None,
              base_dir: Path | None = None) -> NodePlan:
    """The plan of one node in node mode. `local_ranks` comes from launcher.plan_ranks."""
    hosts = hosts_of(launch, base_dir) if uses_hosts(launch) else []
    count = nnodes or launch.nodes or len(hosts)
    if not count:
        raise RecipeError(message="the number of nodes is unknown", key="launch.nodes",
                          fix="pass --nnodes N, or set launch.nodes = N in the recipe")
    if hosts and count > len(hosts):
        raise RecipeError(message=f"{count} nodes requested but launch.hosts lists {len(hosts)}",
                          key="launch.nodes", fix=f"use at most {len(hosts)} nodes, or add hosts")
    if not 0 <= node_rank < count:
        raise RecipeError(message=f"node rank {node_rank} is outside the {count} nodes of this run",
                          key="launch.nodes", fix=f"use --node-rank 0..{count - 1} (0 on the master node)")
    addr = master_addr or (hosts[0].name if hosts else None)
    if not addr:
        raise RecipeError(message="the master address is unknown", key="launch.hosts",
                          fix="pass --master-addr HOST (the address of node 0), or set launch.hosts")
    ranks = launch.gpus_per_node or local_ranks
    names = [h.name for h in hosts[:count]] or [f"node{k}" for k in range(count)]
    return NodePlan(count, node_rank, addr, resolve_port(launch, master_port), ranks, gpu_ids, names, bool(hosts))


def node_hostfile_text(plan: NodePlan) -> str:
    """The hostfile DeepSpeed's runner reads in --no_ssh mode: the same text on every node."""
    return "".join(f"{name} slots={plan.ranks_per_node}\n" for name in plan.names)


# ---------------------------------------------------------------- argv (pure, golden-tested)


def _trainer_args(run_dir: Path, resume: bool) -> list[str]:
    return ["--run-dir", str(run_dir)] + (["--resume"] if resume else [])


def deepspeed_node_argv(run_dir: Path, plan: NodePlan, hostfile: Path, resume: bool = False,
                        python: str | None = None) -> list[str]:
    """DeepSpeed's runner for one node of a run started node by node (`--no_ssh`)."""
    argv = [python or sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile),
            "--no_ssh", "--node_rank", str(plan.node_rank), "--master_addr", plan.master_addr,
            "--master_port", str(plan.master_port)]
    if plan.gpu_ids is not None:
        ids = ",".join(str(i) for i in plan.gpu_ids)
        argv += ["--include", "@".join(f"{name}:{ids}" for name in plan.names)]
    return argv + ["--module", "tuiapp.trainer"] + _trainer_args(run_dir, resume)


def deepspeed_hosts_argv(run_dir: Path, launch: "LaunchSpec", hostfile: Path, master_port: int,
                         master_addr: str | None = None, resume: bool = False,
                         python: str | None = None) -> list[str]:
    """DeepSpeed's multi-node runner on the head node: it reaches the hosts itself (pdsh...)."""
    argv = [python or sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile),
            "--master_port", str(master_port), "--launcher", launch.launcher]
    if master_addr:
        argv += ["--master_addr", master_addr]
    if launch.include:
        argv += ["--include", launch.include]
    if launch.exclude:
        argv += ["--exclude", launch.exclude]
    if launch.nodes:
        argv += ["--num_nodes", str(launch.nodes)]
    if launch.gpus_per_node:
        argv += ["--num_gpus", str(launch.gpus_per_node)]
    return argv + ["--module", "tuiapp.trainer"] + _trainer_args(run_dir, resume)


def torchrun_argv(run_dir: Path, plan: NodePlan, resume: bool = False, python: str | None = None) -> list[str]:
    """torchrun for the fsdp and ddp strategies (one node of the plan; 1 node = single machine)."""
    return [python or sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(plan.nnodes), "--node_rank", str(plan.node_rank),
            "--nproc_per_node", str(plan.ranks_per_node),
            "--master_addr", plan.master_addr, "--master_port", str(plan.master_port),
            "-m", "tuiapp.trainer"] + _trainer_args(run_dir, resume)


def join_command(recipe_file: str, run_id: str, plan: NodePlan, runs_dir: str | None = None,
                 overrides: list[str] | None = None) -> str:
    """What to type on node K to join a run that node 0 started."""
    parts = ["llmtui"] + (["--runs-dir", runs_dir] if runs_dir else [])
    parts += ["run", recipe_file]
    for override in overrides or []:
        parts += ["--set", override]
    parts += ["--node-rank", "K", "--nnodes", str(plan.nnodes), "--master-addr", plan.master_addr,
              "--master-port", str(plan.master_port), "--run-id", run_id]
    return " ".join(shlex.quote(p) if p != "K" else p for p in parts)


# ---------------------------------------------------------------- environment


def passthrough_env(environ: dict | None = None) -> dict[str, str]:
    """NCCL_*, GLOO_*, HF_*, LLMTUI_* ... that every node must see; secrets are left out."""
    environ = os.environ if environ is None else environ
    return {
        k: v for k, v in sorted(environ.items())
        if k.startswith(PASS_PREFIXES) and k not in PASS_SKIP and not is_secret_name(k)
        and "\n" not in v and v.strip() == v and v
    }


def deepspeed_env_text(environ: dict | None = None, home: Path | None = None) -> str:
    """The .deepspeed_env DeepSpeed's runner exports on every host (DS_ENV_FILE points to it).
    The user's own ~/.deepspeed_env lines come first, since DS_ENV_FILE replaces it."""
    lines = []
    user = (home or Path.home()) / DS_ENV_NAME
    try:
        lines += [line for line in user.read_text(encoding="utf-8").splitlines() if "=" in line]
    except (OSError, UnicodeDecodeError):
        pass
    lines += [f"{k}={v}" for k, v in passthrough_env(environ).items()]
    return "".join(line + "\n" for line in lines)


# ---------------------------------------------------------------- node records


def nodes_dir(run_dir: Path) -> Path:
    return RunDir(run_dir).nodes


def node_json(run_dir: Path, node_rank: int) -> Path:
    return RunDir(run_dir).node_record(node_rank)


def node_log(run_dir: Path, node_rank: int) -> Path:
    return RunDir(run_dir).node_log(node_rank)


def read_node(run_dir: Path, node_rank: int) -> RunRecord:
    """nodes/<k>.json (lenient: an empty record when missing or unreadable)."""
    return read_record(node_json(run_dir, node_rank))


def write_node(run_dir: Path, node_rank: int, /, **values) -> RunRecord:
    """Merge values into nodes/<k>.json (written atomically) and return the record."""
    check_keys(values, NODE_KEYS)
    record = read_node(run_dir, node_rank)
    record.set(**{**values, "node_rank": node_rank})  # a caller may pass node_rank too: the file's own wins
    nodes_dir(run_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_text(node_json(run_dir, node_rank),
                      json.dumps(record.to_json(), indent=2, sort_keys=True, default=str))
    return record


def node_records(run_dir: Path) -> dict[int, RunRecord]:
    out = {}
    folder = nodes_dir(run_dir)
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return {}
    for name in names:
        stem, _, ext = name.partition(".")
        if ext == "json" and stem.isdigit():
            out[int(stem)] = read_node(run_dir, int(stem))
    return out


def link_node0_log(run_dir: Path) -> None:
    """nodes/0.log is stdout.log (node 0 logs where single-node runs do)."""
    link = node_log(run_dir, 0)
    try:
        nodes_dir(run_dir).mkdir(parents=True, exist_ok=True)
        if not link.exists() and not link.is_symlink():
            link.symlink_to(Path("..") / STDOUT_LOG)
    except OSError:
        pass


class NodeWatch:
    """Node 0's supervisor: merges the other nodes' records into run.json's `nodes`, and gives
    a reason to end the run when a node does not join in time or has failed."""

    def __init__(self, run, plan: NodePlan, join_timeout_s: float, started: float | None = None):
        self.run = run
        self.plan = plan
        self.join_timeout_s = join_timeout_s
        self.started = time.monotonic() if started is None else started
        self._last: list | None = None

    def poll(self, own_status: str = "running") -> str | None:
        records = node_records(self.run.path)
        nodes = self.plan.nodes()
        nodes[0]["host"] = socket.gethostname()
        nodes[0]["status"] = own_status
        for k, node in enumerate(nodes[1:], start=1):
            record = records.get(k)
            node["status"] = (record.status if record else None) or "waiting"  # waiting = not joined
            if record and record.host is not None:
                node["host"] = record.host
        if nodes != self._last:
            self.run.update(nodes=nodes)
            self._last = nodes
        failed = [(k, r) for k, r in records.items() if k and r.status == "failed"]
        if failed:
            k, record = failed[0]
            return f"node {k} ({record.host or '?'}) failed: {record.reason or 'see nodes/%d.log' % k}"
        missing = [k for k in range(1, self.plan.nnodes) if k not in records]
        if missing and time.monotonic() - self.started > self.join_timeout_s:
            names = ", ".join(str(k) for k in missing)
            return (f"rendezvous timeout: node(s) {names} did not join within {self.join_timeout_s:.0f}s. "
                    f"Start each with `llmtui run RECIPE --node-rank K --nnodes {self.plan.nnodes} "
                    f"--master-addr {self.plan.master_addr} --master-port {self.plan.master_port} "
                    f"--run-id {self.run.id}` (same recipe), or raise launch.join_timeout_s")
        return None


    def settle(self, timeout_s: float = 30.0) -> None:
        """After node 0's ranks end: give the other nodes' supervisors a moment to record theirs."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            records = node_records(self.run.path)
            if all(r.status not in ACTIVE for k, r in records.items() if k):
                return
            time.sleep(0.25)


# ---------------------------------------------------------------- errors in logs


KNOWN_FAILURES: list[tuple[re.Pattern, str]] = [
    (re.compile(r"address already in use|EADDRINUSE|errno: 98", re.I),
     "port in use: the rendezvous port {port} is already taken on node 0. Set launch.master_port "
     "(or --master-port) to a free port on every node, or stop what holds it"),
    (re.compile(r"was not reachable via ssh|Permission denied \(publickey|ssh: connect to host", re.I),
     "unreachable node: the head node cannot ssh to a host. Set up passwordless ssh to every host "
     "(ssh HOST hostname must work), or start each node with `llmtui run --node-rank K`"),
    (re.compile(r"No such file or directory: '(ssh|pdsh|mpirun)'", re.I),
     "unreachable node: the head node has no ssh/pdsh/mpirun client. Install it, or start each node "
     "with `llmtui run --node-rank K`"),
    (re.compile(r"launcher '(\w+)' not installed", re.I),
     "the multi-node launcher is not installed on the head node: install it (apt install pdsh) "
     "or choose another launch.launcher"),
    (re.compile(r"Name or service not known|Temporary failure in name resolution|nodename nor servname|"
                r"getaddrinfo failed|Unknown host", re.I),
     "unreachable node: a host name does not resolve. Check launch.hosts / --master-addr "
     "(use an address every node can resolve, or an IP)"),
    (re.compile(r"No route to host|Network is unreachable|Connection refused|connect\(\) timed out|"
                r"Connection timed out", re.I),
     "unreachable node: ranks could not connect to the master {addr}:{port}. Check that node 0 "
     "runs, that --master-addr is its address as the other nodes see it, and that the port is open "
     "between nodes"),
    (re.compile(r"node_rank is not set correctly|outside the \d+ nodes", re.I),
     "mismatched world size: a node rank is outside the number of nodes. Start every node with "
     "the same --nnodes and a distinct --node-rank 0..N-1"),
    (re.compile(r"world.?size.*(mismatch|expected|does not match|!=)|(mismatch|expected).*world.?size|"
                r"rank \d+ is out of range|Rank \d+ .*invalid", re.I),
     "mismatched world size: the nodes do not agree on how many ranks there are. Use the same "
     "recipe (launch.gpus / gpus_per_node) and --nnodes on every node"),
    (re.compile(r"Timed out after \d+ seconds waiting for clients|DistStoreError|wait timeout|"
                r"Socket Timeout|timed out.*(rendezvous|store|init_process_group)|"
                r"RendezvousTimeoutError", re.I),
     "rendezvous timeout: not every rank joined in time. Start all nodes (same recipe, --nnodes, "
     "--master-addr, --master-port) within launch.join_timeout_s of each other"),
    (re.compile(r"Connection reset by peer|Connection closed by peer|peer closed|"
                r"ProcessGroupGloo.*(closed|reset)", re.I),
     "a rank on another node stopped: the connection to it was lost. See that node's log under nodes/"),
]


def explain_failure(text: str, addr: str = "?", port: int | str = "?") -> str | None:
    """A clear reason for a multi-node failure found in log text, or None."""
    for pattern, reason in KNOWN_FAILURES:
        if pattern.search(text or ""):
            return reason.format(addr=addr, port=port)
    return None


def explain_log(path: Path, addr: str = "?", port: int | str = "?", lines: int = 200) -> str | None:
    return explain_failure("\n".join(tail_lines(Path(path), lines)), addr, port)


# ---------------------------------------------------------------- what a supervisor launches


@dataclass
class NodeArgs:
    """A supervisor started for one node of a run (node mode or SLURM)."""

    node_rank: int
    nnodes: int | None = None
    master_addr: str | None = None
    slurm: bool = False


@dataclass
class Launch:
    """The command one supervisor runs, and what it records about it."""

    argv: list[str]
    ranks: int  # ranks started by this supervisor (on this node; every host in hosts mode)
    gpu_ids: list[int] | None
    port: int
    node_rank: int | None = None  # None = the only supervisor of the run
    plan: NodePlan | None = None
    env: dict = field(default_factory=dict)
    fields: dict = field(default_factory=dict)  # for run.json (node 0) or nodes/<k>.json
    files: dict = field(default_factory=dict)  # path -> (text, mode or None): written by write_files
    rank_log: Path | None = None  # the command is the one rank itself (no launcher); its output goes here

    @property
    def owner(self) -> bool:
        """Only this supervisor writes run.json's status."""
        return not self.node_rank

    def log_path(self, run_dir: Path) -> Path:
        return RunDir(run_dir).stdout_log if self.owner else node_log(run_dir, self.node_rank)


def active_hosts(launch: "LaunchSpec", hosts: list[Host]) -> list[tuple[str, int]]:
    """(host, ranks) DeepSpeed will use: include/exclude, then nodes and gpus_per_node."""

    def spec(text: str) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for part in filter(None, text.split("@")):
            name, _, slots = part.partition(":")
            out.setdefault(name, []).extend(int(s) for s in slots.split(",") if s.strip().isdigit())
        return out

    pool = {h.name: list(range(h.slots)) for h in hosts}
    if launch.include:
        chosen = spec(launch.include)
        pool = {n: (sorted(set(chosen[n])) or s) for n, s in pool.items() if n in chosen}
    elif launch.exclude:
        dropped = spec(launch.exclude)
        pool = {n: ([] if n in dropped and not dropped[n] else [i for i in s if i not in dropped.get(n, [])])
                for n, s in pool.items()}
        pool = {n: s for n, s in pool.items() if s}
    items = list(pool.items())[: launch.nodes or None]
    return [(n, launch.gpus_per_node or len(s)) for n, s in items]


def build_launch(run_dir: Path, launch: "LaunchSpec", cuda: int, *, resume: bool = False,
                 port: int | None = None, node: NodeArgs | None = None,
                 base_dir: Path | None = None, python: str | None = None,
                 gpu_ids: list[int] | None = None) -> Launch:
    """The command of one supervisor: single node, hosts mode (head), or one node of many.
    `gpu_ids`: the GPUs the queue gave this run (else the recipe's). Pure: the hostfile /
    .deepspeed_env it needs are in `files`, written by write_files()."""
    run_dir = Path(run_dir)
    base_dir = base_dir or Path.cwd()
    ranks, planned = launcher.plan_ranks(launch, cuda)
    if gpu_ids:
        ranks = len(gpu_ids)
    else:
        gpu_ids = planned
    if node is not None:
        return _node_launch(run_dir, launch, node, ranks, gpu_ids, port, base_dir, resume, python)
    if uses_hosts(launch):
        return _hosts_launch(run_dir, launch, ranks, gpu_ids, port, base_dir, resume, python)
    strategy = launch.strategy
    env: dict[str, str] = {}
    master_port = port or launch.master_port or launcher.free_port()
    if strategy in DEEPSPEED_LAUNCHED:
        argv = launcher.deepspeed_argv(run_dir, ranks, gpu_ids, master_port, resume=resume, python=python)
        return Launch(argv, ranks, gpu_ids, master_port,
                      rank_log=launcher.rank_log_path(run_dir) if launcher.starts_rank_directly(ranks) else None)
    plan = NodePlan(1, 0, "127.0.0.1", master_port, ranks, gpu_ids, [socket.gethostname()], True)
    if gpu_ids is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
    fields = {"strategy": strategy, "world_size": ranks, "nodes": plan.nodes()}
    return Launch(torchrun_argv(run_dir, plan, resume, python), ranks, gpu_ids, master_port, None, plan, env, fields)


def _node_launch(run_dir: Path, launch: "LaunchSpec", node: NodeArgs, ranks: int, gpu_ids: list[int] | None,
                 port: int | None, base_dir: Path, resume: bool, python: str | None) -> Launch:
    """One node of many (`llmtui join`, SLURM): DeepSpeed's node launcher or torchrun."""
    strategy = launch.strategy
    env: dict[str, str] = {}
    plan = plan_node(launch, ranks, node_rank=node.node_rank, nnodes=node.nnodes,
                     master_addr=node.master_addr, master_port=port, gpu_ids=gpu_ids, base_dir=base_dir)
    if strategy in DEEPSPEED_LAUNCHED:
        hostfile = nodes_dir(run_dir) / HOSTFILE_NAME
        files = {hostfile: (node_hostfile_text(plan), None)}
        argv = deepspeed_node_argv(run_dir, plan, hostfile, resume, python)
    else:
        argv = torchrun_argv(run_dir, plan, resume, python)
        if gpu_ids is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpu_ids)
    nodes = plan.nodes()
    nodes[node.node_rank]["host"] = socket.gethostname()
    fields = {"strategy": strategy, "nnodes": plan.nnodes, "world_size": plan.world_size,
              "master_addr": plan.master_addr, "master_port": plan.master_port,
              "node_mode": "slurm" if node.slurm else "nodes", "nodes": nodes,
              "node_rank": node.node_rank}
    return Launch(argv, plan.ranks_per_node, gpu_ids, plan.master_port, node.node_rank, plan, env, fields,
                  files if strategy in DEEPSPEED_LAUNCHED else {})


def _hosts_launch(run_dir: Path, launch: "LaunchSpec", ranks: int, gpu_ids: list[int] | None, port: int | None,
                  base_dir: Path, resume: bool, python: str | None) -> Launch:
    """launch.hosts: DeepSpeed's multi-node launcher from the head node, over its hostfile."""
    strategy = launch.strategy
    env: dict[str, str] = {}
    hosts = hosts_of(launch, base_dir)
    hostfile = run_dir / HOSTFILE_NAME
    ds_env = run_dir / DS_ENV_NAME
    files = {hostfile: (hostfile_text(hosts), None), ds_env: (deepspeed_env_text(), 0o600)}
    env["DS_ENV_FILE"] = str(ds_env.resolve())
    master_port = resolve_port(launch, port)
    argv = deepspeed_hosts_argv(run_dir, launch, hostfile, master_port, resume=resume, python=python)
    used = active_hosts(launch, hosts)
    nodes, first = [], 0
    for k, (name, count) in enumerate(used):
        nodes.append({"node_rank": k, "host": name, "ranks": list(range(first, first + count))})
        first += count
    fields = {"strategy": strategy, "nnodes": len(nodes), "world_size": first, "master_port": master_port,
              "node_mode": "hosts", "launcher": launch.launcher, "nodes": nodes}
    here = used[0][1] if used else ranks  # ranks on the head node (DeepSpeed puts rank 0 there)
    return Launch(argv, here, gpu_ids, master_port, None, None, env, fields, files)


def write_files(launch: Launch) -> None:
    """Write what a launch needs on disk (hostfile, .deepspeed_env made private to the user)."""
    for path, (text, mode) in launch.files.items():
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
        if mode is not None:
            os.chmod(path, mode)


def node_gone_reason(run_dir: Path, node_rank: int) -> str | None:
    """For node K's supervisor: why it should stop because node 0 has ended the run."""
    status = read_record(RunDir(run_dir).record).status
    if status in ("succeeded", "failed", "stopped"):
        return f"node 0 recorded the run as {status}"
    return None


def explain_run(run_dir: Path, launch: Launch) -> str | None:
    """A clear reason from this node's log, then the other nodes' records and logs."""
    addr = launch.plan.master_addr if launch.plan else "?"
    found = explain_log(launch.log_path(run_dir), addr, launch.port)
    if launch.owner and launch.plan and launch.plan.nnodes > 1:
        for k, record in sorted(node_records(run_dir).items()):
            if k and record.status == "failed":
                other = explain_log(node_log(run_dir, k), addr, launch.port)
                lost = found is None or found.startswith("a rank on another node stopped")
                if lost:
                    found = f"node {k} ({record.host or '?'}) failed: " + (other or record.reason or "")
                break
    return found
