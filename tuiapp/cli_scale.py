"""`llmtui run` beyond one DeepSpeed node: node mode, hosts mode, SLURM, fsdp/ddp strategies.

cli.cmd_run hands over here when the recipe or the flags ask for scale-out; the single-node
DeepSpeed path stays in cli.py. See docs/scale-out.md.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

from tuiapp.core import checks, cluster, cluster_checks, launcher, slurm
from tuiapp.core.errors import RunError, UserError
from tuiapp.core.recipe import Recipe
from tuiapp.core.runs import Run, RunStore, process_alive

EXIT_OK, EXIT_BAD_INPUT = 0, 2
SLURM_FLAGS = ("partition", "nodes", "gpus_per_node", "time", "account")


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("multi-node (one launcher per node; see docs/scale-out.md)")
    group.add_argument("--node-rank", type=int, default=None, metavar="K",
                       help="this node's rank, 0 on the master node (runs DeepSpeed --no_ssh / torchrun here)")
    group.add_argument("--nnodes", type=int, default=None, metavar="N", help="number of nodes (default: launch.nodes)")
    group.add_argument("--master-addr", default=None, metavar="HOST", help="address of node 0 as every node sees it")
    group.add_argument("--master-port", type=int, default=None, metavar="P",
                       help="rendezvous port, the same on every node (default: launch.master_port or 29500)")
    group.add_argument("--run-id", default=None, metavar="ID",
                       help="run folder name shared by all nodes (node 0 creates it, the others join it)")
    group = p.add_argument_group("SLURM")
    group.add_argument("--slurm", action="store_true", help="write an sbatch script into the run and submit it")
    group.add_argument("--partition", default=None)
    group.add_argument("--nodes", type=int, default=None, help="nodes to allocate (default: launch.nodes or 1)")
    group.add_argument("--gpus-per-node", type=int, default=None, help="GPUs per node (sbatch --gpus-per-node)")
    group.add_argument("--time", default=None, help="time limit, e.g. 04:00:00")
    group.add_argument("--account", default=None)


def wanted(args, recipe: Recipe) -> bool:
    """Whether this `llmtui run` is a scale-out launch (else cli.cmd_run carries on)."""
    flags = SLURM_FLAGS + ("node_rank", "nnodes", "master_addr", "master_port", "run_id")
    return bool(getattr(args, "slurm", False) or any(getattr(args, f, None) is not None for f in flags)
                or cluster.is_scaled(recipe.launch))


def _check_flags(args) -> None:
    if not args.slurm:
        given = [f"--{f.replace('_', '-')}" for f in SLURM_FLAGS if getattr(args, f) is not None]
        if given:
            raise UserError(message=f"{', '.join(given)} only apply to SLURM runs", fix="add --slurm")
    elif args.node_rank is not None:
        raise UserError(message="--slurm and --node-rank do not go together",
                        fix="--slurm starts every node itself; use --node-rank only when launching by hand")
    if args.node_rank is None:
        given = [f for f, v in (("--nnodes", args.nnodes), ("--master-addr", args.master_addr),
                                ("--run-id", args.run_id)) if v is not None]
        if given:
            raise UserError(message=f"{', '.join(given)} need --node-rank K", fix="add --node-rank 0 on the master node")
    elif args.node_rank < 0:
        raise UserError(message="--node-rank must be 0 or more", fix="0 on the master node, 1..N-1 on the others")


def _print_findings(findings) -> bool:
    text = checks.format_findings(findings)
    if text:
        print(text, file=sys.stderr)
    return checks.has_errors(findings)


def cmd_run(args, recipe: Recipe, model_ref: str, store: RunStore, follow) -> int:
    _check_flags(args)
    if args.slurm:
        return _run_slurm(args, recipe, model_ref, store, follow)
    if args.node_rank is not None:
        return _run_node(args, recipe, model_ref, store, follow)
    return _run_here(args, recipe, model_ref, store, follow)


# ---------------------------------------------------------------- one supervisor here


def _run_here(args, recipe, model_ref, store, follow) -> int:
    """Hosts mode (DeepSpeed reaches every host) or a single node with strategy fsdp/ddp."""
    findings = checks.before_launch(recipe, store, base_dir=Path.cwd())
    findings += cluster_checks.launch_findings(recipe, master_port=args.master_port, base_dir=Path.cwd())
    if _print_findings(findings):
        return EXIT_BAD_INPUT
    cuda = launcher.cuda_device_count()
    port = args.master_port or (cluster.resolve_port(recipe.launch) if cluster.uses_hosts(recipe.launch)
                                else recipe.launch.master_port or launcher.free_port())
    if args.dry_run:
        preview = Path(store.root) / "<run-id>"
        plan = _preview_launch(preview, recipe, cuda, port)
        print("would run: " + " ".join(plan.argv))
        print("dry run: nothing was created")
        return EXIT_OK
    run = store.create(recipe, recipe_file=str(args.recipe))
    if model_ref != recipe.model.name:
        run.update(model_ref=model_ref)
    print(f"run {run.id} in {run.path}")
    launcher.start(run, port=port)
    run.load()
    if run.info.get("argv"):
        print("command: " + " ".join(run.info["argv"]))
    if args.detach:
        print(f"detached; follow with `llmtui show {run.id}`, stop with `llmtui stop {run.id}`")
        return EXIT_OK
    return follow(run, store)


def _preview_launch(run_dir: Path, recipe: Recipe, cuda: int, port: int, node=None) -> cluster.Launch:
    """build_launch without touching disk (hostfile and env files are only written for real)."""
    launch = recipe.launch
    if node is None and cluster.uses_hosts(launch):
        argv = cluster.deepspeed_hosts_argv(run_dir, launch, run_dir / cluster.HOSTFILE_NAME, port)
        return cluster.Launch(argv, 0, None, port)
    if node is not None and launch.strategy == "deepspeed":
        ranks, gpu_ids = launcher.plan_ranks(launch, cuda)
        plan = cluster.plan_node(launch, ranks, node_rank=node.node_rank, nnodes=node.nnodes,
                                 master_addr=node.master_addr, master_port=port, gpu_ids=gpu_ids,
                                 base_dir=Path.cwd())
        argv = cluster.deepspeed_node_argv(run_dir, plan, run_dir / cluster.NODES_DIR / cluster.HOSTFILE_NAME)
        return cluster.Launch(argv, plan.ranks_per_node, gpu_ids, port, node.node_rank, plan)
    return cluster.build_launch(run_dir, launch, cuda, port=port, node=node)


# ---------------------------------------------------------------- node mode


def _start_node_supervisor(run: Run, node_rank: int, nnodes: int, master_addr: str, port: int,
                           wait_s: float = 15.0, resume: bool = False) -> int:
    """Start this node's supervisor detached (its own session); returns its pid."""
    argv = launcher.supervisor_argv(run.path, resume=resume, port=port) + [
        "--node-rank", str(node_rank), "--nnodes", str(nnodes), "--master-addr", master_addr]
    cluster.nodes_dir(run.path).mkdir(parents=True, exist_ok=True)
    with open(cluster.nodes_dir(run.path) / f"{node_rank}.supervisor.log", "ab") as log:
        process = subprocess.Popen(argv, start_new_session=True, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, close_fds=True)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and process.poll() is None:
        if cluster.read_node(run.path, node_rank).get("pid") == process.pid:
            break
        time.sleep(0.05)
    return process.pid


def _wait_for_run(store: RunStore, run_id: str, timeout_s: float) -> Run:
    path = Path(store.root) / run_id
    deadline = time.monotonic() + timeout_s
    said = False
    while not (path / "run.json").is_file() or not (path / "recipe.toml").is_file():
        if time.monotonic() > deadline:
            raise RunError(message=f"run '{run_id}' did not appear in {store.root} within {timeout_s:.0f}s",
                           fix="start node 0 first with the same --run-id, and put the runs folder on "
                           "storage every node shares (--runs-dir or LLMTUI_RUNS_DIR)")
        if not said:
            print(f"waiting for node 0 to create run {run_id} in {store.root}...", flush=True)
            said = True
        time.sleep(0.5)
    return Run(path).load()


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = []
    for key in sorted(set(a) | set(b)):
        left, right = a.get(key), b.get(key)
        if isinstance(left, dict) and isinstance(right, dict):
            keys += _differences(left, right, f"{prefix}{key}.")
        elif left != right:
            keys.append(f"{prefix}{key}")
    return keys


def _run_node(args, recipe, model_ref, store, follow) -> int:
    k = args.node_rank
    launch = recipe.launch
    port = cluster.resolve_port(launch, args.master_port)
    cuda = launcher.cuda_device_count()
    if k == 0:
        nnodes = args.nnodes or launch.nodes or (len(cluster.hosts_of(launch, Path.cwd()))
                                                 if cluster.uses_hosts(launch) else 0)
        node = cluster.NodeArgs(0, nnodes or None, args.master_addr)
        findings = checks.before_launch(recipe, store, base_dir=Path.cwd())
        findings += cluster_checks.launch_findings(recipe, node_rank=0, master_port=port, base_dir=Path.cwd())
        if _print_findings(findings):
            return EXIT_BAD_INPUT
        preview = _preview_launch(Path(store.root) / (args.run_id or "<run-id>"), recipe, cuda, port, node)
        plan = preview.plan
        if args.dry_run:
            print("would run on node 0: " + " ".join(preview.argv))
            print("then on every other node: " + cluster.join_command(args.recipe, args.run_id or "<run-id>", plan,
                                                                        args.runs_dir, args.set))
            print("dry run: nothing was created")
            return EXIT_OK
        run = store.create(recipe, recipe_file=str(args.recipe), run_id=args.run_id)
        run.update(node_mode="nodes", nnodes=plan.nnodes, master_addr=plan.master_addr, master_port=port,
                   strategy=launch.strategy, world_size=plan.world_size, nodes=plan.nodes(),
                   **({"model_ref": model_ref} if model_ref != recipe.model.name else {}))
        print(f"run {run.id} in {run.path} (node 0 of {plan.nnodes}, world size {plan.world_size})")
        print("start the other nodes with: "
              + cluster.join_command(args.recipe, run.id, plan, args.runs_dir, args.set))
        _start_node_supervisor(run, 0, plan.nnodes, plan.master_addr, port)
    else:
        if not args.run_id:
            raise UserError(message=f"node {k} must join node 0's run", fix="pass --run-id ID (node 0 prints it)")
        run = _wait_for_run(store, args.run_id, launch.join_timeout_s)
        frozen = run.recipe()
        different = _differences(frozen.model_dump(mode="json"), recipe.model_dump(mode="json"))
        if different:
            raise UserError(message=f"this recipe differs from the one node 0 started in {', '.join(different[:6])}",
                            fix="run the same recipe with the same --set overrides on every node")
        nnodes = int(run.info.get("nnodes") or 0)
        if args.nnodes and nnodes and args.nnodes != nnodes:
            raise UserError(message=f"mismatched world size: --nnodes {args.nnodes} here, but node 0 started "
                            f"run {run.id} with {nnodes} nodes", fix=f"pass --nnodes {nnodes} (or leave it out)")
        nnodes = nnodes or args.nnodes
        if not nnodes or k >= nnodes:
            raise UserError(message=f"node rank {k} is outside the {nnodes} nodes of run {run.id}",
                            fix=f"use --node-rank 1..{nnodes - 1}")
        master_addr = args.master_addr or run.info.get("master_addr")
        if run.info.get("master_port") and int(run.info["master_port"]) != port and args.master_port:
            raise UserError(message=f"--master-port {port} here, but node 0 listens on {run.info['master_port']}",
                            fix="use the same --master-port on every node (or leave it out)")
        port = int(run.info.get("master_port") or port)
        record = cluster.read_node(run.path, k)
        if record.get("status") == "running" and record.get("host") == _hostname() and \
                process_alive(record.get("pid"), record.get("pid_create_time")):
            raise UserError(message=f"node rank {k} already joined run {run.id} (pid {record.get('pid')})",
                            fix="give each node a distinct --node-rank")
        if run.status not in ("created", "running"):
            raise UserError(message=f"run {run.id} is {run.status}; it cannot be joined",
                            fix="start a new run with a new --run-id")
        findings = checks.static_findings(frozen, store, base_dir=Path.cwd())
        findings += cluster_checks.launch_findings(frozen, node_rank=k, master_addr=master_addr, base_dir=Path.cwd())
        if _print_findings(findings):
            return EXIT_BAD_INPUT
        if args.dry_run:
            node = cluster.NodeArgs(k, nnodes, master_addr)
            print(f"would run on node {k}: " + " ".join(_preview_launch(run.path, frozen, cuda, port, node).argv))
            return EXIT_OK
        print(f"joining run {run.id} as node {k} of {nnodes} (master {master_addr}:{port})")
        _start_node_supervisor(run, k, nnodes, master_addr, port)
    if args.detach:
        print(f"detached; follow with `llmtui show {run.id}`; node logs in {cluster.nodes_dir(run.path)}")
        return EXIT_OK
    code = follow(run, store)
    if k:
        deadline = time.monotonic() + 90  # node 0 records the run; this node's supervisor ends just after
        while cluster.read_node(run.path, k).get("status") in (None, "running") and time.monotonic() < deadline:
            time.sleep(0.5)
        mine = cluster.read_node(run.path, k)
        print(f"node {k}: {mine.get('status', 'unknown')}" + (f" — {mine['reason']}" if mine.get("reason") else ""))
    return code


def _hostname() -> str:
    import socket

    return socket.gethostname()


# ---------------------------------------------------------------- SLURM


def _run_slurm(args, recipe, model_ref, store, follow) -> int:
    recipe = recipe.model_copy(deep=True)
    nodes = args.nodes or recipe.launch.nodes or 1
    recipe.launch.nodes = nodes  # frozen: every node's supervisor reads the same plan
    if args.gpus_per_node:
        recipe.launch.gpus_per_node = args.gpus_per_node
    if cluster.uses_hosts(recipe.launch):
        raise UserError(message="launch.hosts is for runs without a scheduler", key="launch.hosts",
                        fix="remove launch.hosts: SLURM chooses the nodes (use --nodes and --partition)")
    findings = checks.static_findings(recipe, store, base_dir=Path.cwd())
    if _print_findings(findings):
        return EXIT_BAD_INPUT
    options = slurm.SlurmOptions(
        nodes=nodes, partition=args.partition, gpus_per_node=args.gpus_per_node, time=args.time,
        account=args.account, job_name=f"llmtui-{recipe.name}", master_port=args.master_port or recipe.launch.master_port,
    )
    env = cluster.passthrough_env()
    if args.dry_run:
        print(slurm.sbatch_script(Path(store.root).resolve() / "<run-id>", options, env=env), end="")
        print("# dry run: nothing was created or submitted", file=sys.stderr)
        return EXIT_OK
    run = store.create(recipe, recipe_file=str(args.recipe))
    script = run.path / slurm.SCRIPT_NAME
    script.write_text(slurm.sbatch_script(run.path.resolve(), options, env=env), encoding="utf-8")
    script.chmod(0o755)
    run.update(node_mode="slurm", nnodes=nodes, strategy=recipe.launch.strategy,
               slurm={k: v for k, v in vars(options).items() if v not in (None, "")},
               **({"model_ref": model_ref} if model_ref != recipe.model.name else {}))
    try:
        job = slurm.submit(script)
    except UserError as exc:
        run.update(status="failed", ended=time.time(), reason=f"not submitted: {exc.message}")
        raise
    run.update(slurm_job=job, slurm_submitted=time.time())
    print(f"run {run.id} in {run.path}")
    print(f"submitted SLURM job {job}: {shlex.join(slurm.sbatch_argv(script))}")
    if args.detach:
        print(f"detached; follow with `llmtui show {run.id}`, stop with `llmtui stop {run.id}` (scancel)")
        return EXIT_OK
    return follow(run, store)


# ---------------------------------------------------------------- show


def show_lines(run: Run) -> list[str]:
    """`llmtui show` lines for scale-out runs (nothing for a classic single-node run)."""
    info = run.info
    lines = []
    if info.get("strategy") and info["strategy"] != "deepspeed":
        lines.append(f"  strategy  {info['strategy']} (world size {info.get('world_size', '?')})")
    nodes = info.get("nodes") or []
    if len(nodes) > 1 or info.get("node_mode"):
        lines.append(f"  nodes     {len(nodes) or info.get('nnodes', '?')} ({info.get('node_mode', '?')}), "
                     f"world size {info.get('world_size', '?')}")
        for node in nodes:
            ranks = node.get("ranks") or []
            span = f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else ",".join(map(str, ranks))
            lines.append(f"            node {node.get('node_rank')}: {node.get('host') or '?'}  ranks {span}  "
                         f"{node.get('status') or ''}".rstrip())
    if info.get("slurm_job"):
        state = info.get("slurm_state")
        lines.append(f"  slurm     job {info['slurm_job']}" + (f" ({state})" if state else ""))
    return lines


# ---------------------------------------------------------------- resume


def add_resume_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-rank", type=int, default=None, metavar="K",
                   help="multi-node runs started with --node-rank: resume this node (0 first)")
    p.add_argument("--master-addr", default=None, metavar="HOST", help="address of node 0 (default: as before)")


def resume(args, run: Run, store: RunStore, follow) -> int | None:
    """`llmtui resume` of a SLURM or node-mode run; None = a single-supervisor run (cli goes on)."""
    mode = run.info.get("node_mode")
    node_rank = getattr(args, "node_rank", None)
    if mode not in ("slurm", "nodes"):
        if node_rank is not None:
            raise UserError(message=f"{run.id} was not started node by node", fix="leave out --node-rank")
        return None
    if mode == "slurm":
        return _resume_slurm(args, run, store, follow)
    if node_rank is None:
        raise UserError(message=f"{run.id} runs on {run.info.get('nnodes')} nodes started by hand",
                        fix=f"run `llmtui resume {run.id} --node-rank K` on every node, node 0 first")
    nnodes = int(run.info.get("nnodes") or 0)
    if not 0 <= node_rank < nnodes:
        raise UserError(message=f"node rank {node_rank} is outside the {nnodes} nodes of {run.id}",
                        fix=f"use --node-rank 0..{nnodes - 1}")
    master_addr = args.master_addr or run.info.get("master_addr")
    port = int(run.info.get("master_port") or cluster.DEFAULT_PORT)
    if node_rank == 0:
        _check_resumable(run)
        run.recipe()
        for k in cluster.node_records(run.path):
            if k:
                cluster.node_json(run.path, k).unlink(missing_ok=True)  # this attempt's nodes register anew
        run.update(status="created", reason=None, master_addr=master_addr)
        print(f"resuming {run.id} from its last complete checkpoint (node 0 of {nnodes})")
    else:
        deadline = time.monotonic() + run.recipe().launch.join_timeout_s
        while run.load().status not in ("created", "running"):
            if time.monotonic() > deadline:
                raise RunError(message=f"node 0 did not resume {run.id}",
                               fix=f"run `llmtui resume {run.id} --node-rank 0` on node 0 first")
            time.sleep(0.5)
        print(f"resuming {run.id} as node {node_rank} of {nnodes}")
    _start_node_supervisor(run, node_rank, nnodes, master_addr, port, resume=True)
    return EXIT_OK if args.detach else follow(run, store)


def _check_resumable(run: Run) -> None:
    if run.status in ("created", "running"):
        raise UserError(message=f"{run.id} is still {run.status}", fix="stop it first (`llmtui stop`)")
    if run.status == "succeeded":
        raise UserError(message=f"{run.id} already succeeded", fix="start a new run instead")


def _resume_slurm(args, run: Run, store: RunStore, follow) -> int:
    """Resubmit the run's batch script with --resume (e.g. after a TIMEOUT)."""
    _check_resumable(run)
    run.recipe()
    known = {k: v for k, v in (run.info.get("slurm") or {}).items() if k in slurm.SlurmOptions.__dataclass_fields__}
    options = slurm.SlurmOptions(**known)
    script = run.path / slurm.SCRIPT_NAME
    script.write_text(slurm.sbatch_script(run.path.resolve(), options, env=cluster.passthrough_env(), resume=True),
                      encoding="utf-8")
    for k in cluster.node_records(run.path):
        cluster.node_json(run.path, k).unlink(missing_ok=True)
    run.update(status="created", reason=None, ended=None, slurm_job=None, slurm_state=None)
    try:
        job = slurm.submit(script)
    except UserError as exc:
        run.update(status="failed", ended=time.time(), reason=f"not resubmitted: {exc.message}")
        raise
    run.update(slurm_job=job, slurm_submitted=time.time())
    print(f"resuming {run.id}: submitted SLURM job {job} (from the last complete checkpoint)")
    return EXIT_OK if args.detach else follow(run, store)
