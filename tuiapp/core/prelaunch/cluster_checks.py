"""Checks before a scale-out launch: strategy x method x ZeRO x hosts rules (part of
recipe_rules.recipe_rules), and machine checks (hosts resolve, launcher installed, port free).

Each problem is a Finding naming the recipe key and the fix; the door (door.py) calls
launch_findings in its machine phase. See docs/scale-out.md.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import is_quantized
from tuiapp.core.machine.gpus import cuda_available
from tuiapp.core.plan.cluster import DEEPSPEED_LAUNCHED, hosts_of, resolve_port, uses_hosts

if TYPE_CHECKING:
    from tuiapp.core.config.recipe import Recipe

# each tried on CPU FSDP2: they fail in the forward ("mixed torch.Tensor and DTensor");
# llama-adapter, lora, dora, ia3, adapter, sft and pretrain train and save
FSDP_UNSUPPORTED = {"prefix": "prefix tuning", "prompt": "prompt tuning", "ptuning": "p-tuning"}


def port_free(port: int, host: str = "") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except (OSError, UnicodeError):
        return False


def is_local(host: str) -> bool:
    if host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addrs = {a[4][0] for a in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return False
    return any(a.startswith("127.") or a == "::1" for a in addrs)


def scale_rules(recipe: "Recipe", base_dir: Path | None = None) -> list[Finding]:
    """Strategy x method x ZeRO x hosts rules (called from recipe_rules.recipe_rules)."""

    out: list[Finding] = []
    launch, kind = recipe.launch, recipe.method.kind
    strategy = launch.strategy
    if strategy != "deepspeed":
        use = "or launch.strategy = 'deepspeed'"
        if launch.zero_stage and strategy != "pipeline":  # pipeline_plan.rules explains it for the pipeline
            out.append(Finding("error", "launch.zero_stage", f"ZeRO stages are DeepSpeed's; strategy "
                               f"'{strategy}' does not use them", f"set launch.zero_stage = 0, {use}"))
        for key in ("offload_optimizer", "offload_params"):
            if getattr(launch, key) != "none":
                fix = ("set launch.fsdp_cpu_offload = true instead" if strategy == "fsdp"
                       else "remove it (DDP and the pipeline keep everything on the device)")
                out.append(Finding("error", f"launch.{key}", f"{key} is a DeepSpeed ZeRO setting; "
                                   f"strategy '{strategy}' ignores it", f"{fix}, {use}"))
    if launch.fsdp_cpu_offload and strategy != "fsdp":
        out.append(Finding("error", "launch.fsdp_cpu_offload", f"fsdp_cpu_offload needs strategy "
                           f"'fsdp'; strategy is '{strategy}'",
                           "set launch.strategy = 'fsdp', or launch.fsdp_cpu_offload = false"))
    if strategy == "fsdp":
        if kind in FSDP_UNSUPPORTED:
            out.append(Finding("error", "launch.strategy", f"{FSDP_UNSUPPORTED[kind]} does not work with "
                               "FSDP: its learned prompt lives outside the sharded layers and meets them "
                               "as a plain tensor (torch: 'mixed torch.Tensor and DTensor')",
                               "use launch.strategy = 'deepspeed' or 'ddp' for this method"))
        if is_quantized(kind):
            out.append(Finding("error", "launch.strategy", "qlora with FSDP needs bitsandbytes quant "
                               "storage tuned for sharding, which llmtui does not set up",
                               "use launch.strategy = 'deepspeed' (ZeRO-2) or 'ddp' for qlora"))
    if launch.include and launch.exclude:
        out.append(Finding("error", "launch.exclude", "include and exclude cannot be used together",
                           "keep one of launch.include / launch.exclude"))
    if (launch.include or launch.exclude) and (launch.nodes or launch.gpus_per_node) and uses_hosts(launch):
        out.append(Finding("error", "launch.include" if launch.include else "launch.exclude",
                           "DeepSpeed cannot combine include/exclude with nodes/gpus_per_node",
                           "use either the filter or launch.nodes / launch.gpus_per_node"))
    if (launch.include or launch.exclude) and not uses_hosts(launch):
        out.append(Finding("error", "launch.include" if launch.include else "launch.exclude",
                           "include/exclude filter launch.hosts, which is empty",
                           "set launch.hosts, or choose GPUs with launch.gpus = [0, 1]"))
    if uses_hosts(launch):
        try:
            hosts = hosts_of(launch, base_dir)
        except RecipeError as exc:
            return out + [Finding("error", "launch.hosts", exc.message if not exc.file else
                                  f"{exc.file}{':' + str(exc.line) if exc.line else ''}: {exc.message}", exc.fix)]
        if launch.nodes > len(hosts):
            out.append(Finding("error", "launch.nodes", f"nodes = {launch.nodes} but launch.hosts lists "
                               f"{len(hosts)}", f"set launch.nodes to at most {len(hosts)} (0 = all)"))
        if strategy not in DEEPSPEED_LAUNCHED:
            out.append(Finding("error", "launch.hosts", f"strategy '{strategy}' runs torchrun, which "
                               "cannot reach other hosts by itself",
                               "start each node with `llmtui run RECIPE --node-rank K --master-addr "
                               "HOST`, or submit with `llmtui run RECIPE --slurm`"))
    return out


def launch_findings(recipe: "Recipe", *, node_rank: int | None = None, master_port: int | None = None,
                    master_addr: str | None = None, base_dir: Path | None = None) -> list[Finding]:
    """Machine checks before a multi-node launch: hosts resolve, launcher installed, port free."""

    launch = recipe.launch
    out: list[Finding] = []
    port = resolve_port(launch, master_port)
    if uses_hosts(launch) and node_rank is None:
        try:
            hosts = hosts_of(launch, base_dir)
        except RecipeError:
            return out  # reported by scale_rules
        for host in hosts:
            if not resolves(host.name):
                where = f" (hostfile line {host.line})" if isinstance(launch.hosts, str) else ""
                out.append(Finding("error", "launch.hosts", f"host '{host.name}'{where} does not resolve "
                                   "from this machine", "fix the name, add it to /etc/hosts, or use its IP"))
        if launch.launcher == "pdsh" and not shutil.which("pdsh"):
            out.append(Finding("error", "launch.launcher", "DeepSpeed's multi-node launcher 'pdsh' is "
                               "not installed on this (head) node",
                               "install pdsh (apt install pdsh), or start each node with --node-rank K"))
        if hosts and is_local(hosts[0].name) and launch.master_port and not port_free(port):
            out.append(Finding("error", "launch.master_port", f"port {port} is in use on this machine",
                               "choose a free launch.master_port, or 0 for DeepSpeed's default"))
    if node_rank == 0 and not port_free(port):
        out.append(Finding("error", "launch.master_port", f"port in use: rendezvous port {port} is "
                           "already taken on this node (node 0)",
                           "pass --master-port P (the same on every node) with a free port, "
                           "or stop what holds it"))
    if launch.strategy == "fsdp" and launch.fsdp_cpu_offload:
        if not cuda_available():
            out.append(Finding("warning", "launch.fsdp_cpu_offload", "fsdp_cpu_offload is ignored without "
                               "CUDA: the ranks already keep everything in CPU memory",
                               "set launch.fsdp_cpu_offload = false on CPU machines"))
    if node_rank and master_addr and not resolves(master_addr):
        out.append(Finding("error", None, f"unreachable node: the master address '{master_addr}' does not "
                           "resolve from this node", "pass --master-addr with node 0's IP or a name this "
                           "node can resolve"))
    return out
