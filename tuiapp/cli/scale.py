"""The CLI's scale-out flags (node mode, SLURM) and lines: what they mean for the run service's
LaunchOptions, and what `llmtui show` prints of nodes and jobs. See docs/scale-out.md.
"""

from __future__ import annotations

import argparse
import time

from tuiapp.cli import numbers
from tuiapp.core.lifecycle.service import SLURM_FLAGS, LaunchOptions
from tuiapp.core.plan import cluster
from tuiapp.core.store.runs import Run

NODE_FLAGS = ("node_rank", "nnodes", "master_addr", "master_port", "run_id")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("multi-node (one launcher per node; see docs/scale-out.md)")
    group.add_argument("--node-rank", type=numbers.count(0), default=None, metavar="K",
                       help="this node's rank, 0 on the master node (runs DeepSpeed --no_ssh / torchrun here)")
    group.add_argument("--nnodes", type=numbers.count(), default=None, metavar="N", help="number of nodes (default: launch.nodes)")
    group.add_argument("--master-addr", default=None, metavar="HOST", help="address of node 0 as every node sees it")
    group.add_argument("--master-port", type=numbers.port(), default=None, metavar="P",
                       help="rendezvous port, the same on every node (default: launch.master_port or 29500)")
    group.add_argument("--run-id", default=None, metavar="ID",
                       help="run folder name shared by all nodes (node 0 creates it, the others join it)")
    group = p.add_argument_group("SLURM")
    group.add_argument("--slurm", action="store_true", help="write an sbatch script into the run and submit it")
    group.add_argument("--partition", default=None)
    group.add_argument("--nodes", type=numbers.count(), default=None, help="nodes to allocate (default: launch.nodes or 1)")
    group.add_argument("--gpus-per-node", type=numbers.count(), default=None, help="GPUs per node (sbatch --gpus-per-node)")
    group.add_argument("--time", default=None, help="time limit, e.g. 04:00:00")
    group.add_argument("--account", default=None)


def launch_options(args) -> LaunchOptions:
    """The run service's options from `llmtui run`'s flags."""
    given = {f: getattr(args, f, None) for f in SLURM_FLAGS + NODE_FLAGS}
    return LaunchOptions(recipe_file=str(args.recipe), overrides=list(args.set or []), runs_dir=args.runs_dir,
                         slurm=bool(getattr(args, "slurm", False)), queue=bool(getattr(args, "queue", False)),
                         priority=getattr(args, "priority", 0) or 0, slots=getattr(args, "slots", None), **given)


def resume_options(args) -> LaunchOptions:
    return LaunchOptions(node_rank=getattr(args, "node_rank", None), master_addr=getattr(args, "master_addr", None))


def print_node_outcome(run: Run, node_rank: int, timeout_s: float = 90) -> None:
    """Node K: node 0 records the run; this node's supervisor ends just after. Say how it ended."""
    deadline = time.monotonic() + timeout_s
    while cluster.read_node(run.path, node_rank).status in (None, "starting", "running", "stopping") \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    mine = cluster.read_node(run.path, node_rank)
    print(f"node {node_rank}: {mine.status or 'unknown'}" + (f" — {mine.reason}" if mine.reason else ""))


# ---------------------------------------------------------------- show


def show_lines(run: Run) -> list[str]:
    """`llmtui show` lines for scale-out runs (nothing for a classic single-node run)."""
    record = run.record
    lines = []
    if record.strategy and record.strategy != "deepspeed":
        lines.append(f"  strategy  {record.strategy} (world size {_or(record.world_size, '?')})")
    nodes = record.nodes or []
    if len(nodes) > 1 or record.node_mode:
        lines.append(f"  nodes     {len(nodes) or _or(record.nnodes, '?')} ({_or(record.node_mode, '?')}), "
                     f"world size {_or(record.world_size, '?')}")
        for node in nodes:
            ranks = node.get("ranks") or []
            span = f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else ",".join(map(str, ranks))
            lines.append(f"            node {node.get('node_rank')}: {node.get('host') or '?'}  ranks {span}  "
                         f"{node.get('status') or ''}".rstrip())
    if record.slurm_job:
        state = record.slurm_state
        lines.append(f"  slurm     job {record.slurm_job}" + (f" ({state})" if state else ""))
    return lines


def _or(value, default):
    return default if value is None else value


# ---------------------------------------------------------------- resume


def add_resume_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-rank", type=numbers.count(0), default=None, metavar="K",
                   help="multi-node runs started with --node-rank: resume this node (0 first)")
    p.add_argument("--master-addr", default=None, metavar="HOST", help="address of node 0 (default: as before)")
