"""Micro-batch by probing: which sizes to try, which one to keep, and what was recorded.

`llmtui probe RECIPE` and a run with `train.micro_batch = "auto"` launch one rank of
`tuiapp.trainer.tools.probe` as a real DeepSpeed rank (with the environment DeepSpeed's launcher gives
one, started without it: `launcher.single_rank_argv`). That rank trains a few steps at each
size (1, 2, 4, ... up to train.max_micro_batch) on the longest examples, and writes one row per
size: peak memory (the CUDA allocator's peak, or the process's peak RSS on CPU) and tokens/s.
This module plans that launch, keeps the largest size whose peak stays under the device's memory
less train.memory_headroom, and records the choice with the estimate's prediction next to what
was measured (probe.json), so that `llmtui estimate` can report its error on past runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from tuiapp.core.common import trainer_tools
from tuiapp.core.common.errors import RecipeError, UserError
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import is_preference
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.machine import shm
from tuiapp.core.plan import estimate, launcher
from tuiapp.core.run_folder import rundir
from tuiapp.core.run_folder.rundir import RunDir

PROBE_FILE = rundir.PROBE_JSON  # the choice, in a run folder or a probe folder
PROBE_DIR = rundir.PROBE_DIR  # the probing rank's rows and log, inside that folder
ROWS_FILE = rundir.PROBE_ROWS_JSONL
PROBES_DIR = ".probes"  # `llmtui probe` keeps its folders here, under the runs folder
DEVICE_MEMORY_ENV = "LLMTUI_DEVICE_MEMORY"  # bytes (or 12GB, 512MiB) the probe takes as the device's memory
STEPS = 3  # steps per size; the first warms up, the others are timed
GB = 1024**3
UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2, "MIB": 1024**2,
         "G": GB, "GB": GB, "GIB": GB, "T": 1024**4, "TB": 1024**4, "TIB": 1024**4}


def is_auto(recipe: Recipe) -> bool:
    return recipe.train.micro_batch == "auto"


def candidate_sizes(max_size: int, min_size: int = 1) -> list[int]:
    """1, 2, 4, ... up to max_size (max_size itself last when it is not a power of two)."""
    sizes, size = [], 1
    while size <= max_size:
        if size >= min_size:
            sizes.append(size)
        size *= 2
    if not sizes or sizes[-1] != max_size:
        sizes.append(max_size)
    return sizes


def parse_bytes(text: str | int | float, what: str = "--memory-limit") -> int:
    """'12GB', '512MiB', '3e9' or a plain count of bytes (units are powers of 1024)."""
    raw = str(text).strip().upper().replace(" ", "")
    number = raw.rstrip("KMGTIB")
    unit = raw[len(number):]
    try:
        value = float(number) * UNITS[unit]
    except (ValueError, KeyError):
        raise UserError(message=f"{what} '{text}' is not a size", fix="write it as bytes or with a unit: 12GB, 512MiB") from None
    if value <= 0:
        raise UserError(message=f"{what} '{text}' must be above 0", fix="give the memory the device may use, e.g. 12GB")
    return int(value)


def rules(recipe: Recipe) -> list[Finding]:
    """What micro_batch 'auto' cannot probe (yet): said before anything launches."""
    if not is_auto(recipe):
        return []
    key, out = "train.micro_batch", []
    if is_preference(recipe.method.kind):
        out.append(Finding("error", key, f"'auto' probes the causal-LM trainer; {recipe.method.kind} pairs "
                           "are not probed", "set train.micro_batch to a number (e.g. 4)"))
    if recipe.launch.strategy != "deepspeed":
        out.append(Finding("error", key, f"'auto' probes one DeepSpeed rank; strategy "
                           f"'{recipe.launch.strategy}' is not probed", "set train.micro_batch to a number, or "
                           "launch.strategy = 'deepspeed'"))
    if recipe.launch.hosts or recipe.launch.nodes > 1:
        out.append(Finding("error", key, "'auto' is probed on this machine only; a multi-node run needs one "
                           "micro_batch on every node", "run `llmtui probe RECIPE` on one node and set "
                           "train.micro_batch to the size it picks"))
    if recipe.launch.zero_stage == 3:
        out.append(Finding("warning", key, "'auto' probes one rank; with ZeRO-3 a rank holds less when more "
                           "ranks share the model, so the pick is on the safe side", None))
    return out


# ---------------------------------------------------------------- the probing rank's launch


def rank_argv(recipe_file: Path, out_dir: Path, sizes: list[int], port: int, *, gpu_id: int | None = None,
              steps: int = STEPS, limit_bytes: int | None = None, headroom: float = 0.1,
              python: str | None = None) -> list[str]:
    """One rank of the probe trainer tool, started as DeepSpeed's launcher would start it (its own port)."""
    argv = launcher.single_rank_argv(trainer_tools.module("probe"), [gpu_id] if gpu_id is not None else None, port,
                                     python=python)
    argv += ["--recipe", str(recipe_file), "--out", str(out_dir),
             "--sizes", ",".join(str(s) for s in sizes), "--steps", str(steps), "--headroom", str(headroom)]
    if limit_bytes:
        argv += ["--limit", str(int(limit_bytes))]
    return argv


def default_limit(recipe: Recipe, cuda: int) -> int | None:
    """The memory one rank may use: $LLMTUI_DEVICE_MEMORY, else on CPU this machine's memory
    shared by the run's ranks; None on CUDA (the probing rank reads its GPU's size)."""
    if os.environ.get(DEVICE_MEMORY_ENV):
        return parse_bytes(os.environ[DEVICE_MEMORY_ENV], DEVICE_MEMORY_ENV)
    if cuda:
        return None
    ranks, _ = launcher.plan_ranks(recipe.launch, 0)
    return psutil.virtual_memory().total // max(1, ranks)


@contextmanager
def running(recipe: Recipe, recipe_file: Path, out_dir: Path, *, gpu_id: int | None = None,
            limit_bytes: int | None = None, max_size: int | None = None, steps: int = STEPS,
            new_session: bool = False) -> Iterator[subprocess.Popen]:
    """The probing rank, on a free port of its own, for the block that waits for it; when the block
    ends (the rank gone), its DeepSpeed all-reduce buffer in /dev/shm is freed."""
    port = launcher.free_port()
    try:
        yield _start(recipe, recipe_file, out_dir, port, gpu_id=gpu_id, limit_bytes=limit_bytes, max_size=max_size,
                     steps=steps, new_session=new_session)
    finally:
        shm.reclaim(port)


def _start(recipe: Recipe, recipe_file: Path, out_dir: Path, port: int, *, gpu_id: int | None,
           limit_bytes: int | None, max_size: int | None, steps: int, new_session: bool) -> subprocess.Popen:
    """Start the probing rank; its output goes to out_dir/probe/launcher.log. A
    supervisor keeps it in its own process group; the CLI gives it a session of its own."""
    probe_dir = RunDir(out_dir).probe_dir
    probe_dir.mkdir(parents=True, exist_ok=True)
    RunDir(out_dir).probe_rows.unlink(missing_ok=True)
    sizes = candidate_sizes(max_size or recipe.train.max_micro_batch)
    argv = rank_argv(recipe_file, probe_dir, sizes, port, gpu_id=gpu_id, steps=steps, limit_bytes=limit_bytes,
                     headroom=recipe.train.memory_headroom)
    log = open(RunDir(out_dir).probe_launcher_log, "ab")
    try:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=launcher.rank_env(), cwd=os.getcwd(), start_new_session=new_session)
    finally:
        log.close()


# ---------------------------------------------------------------- choosing and recording


@dataclass
class ProbeResult:
    chosen: int | None
    rows: list[dict]  # per size: micro_batch, status (ok | over | oom), peak_bytes, measured_bytes, tokens_per_s, predicted_bytes
    limit_bytes: int
    headroom: float
    device: str  # cuda | cpu
    seq_len: int
    started: float = 0.0
    seconds: float = 0.0
    reason: str | None = None  # why nothing was chosen
    notes: list[str] = field(default_factory=list)

    @property
    def budget_bytes(self) -> int:
        return int(self.limit_bytes * (1 - self.headroom))

    def chosen_row(self) -> dict | None:
        return next((r for r in self.rows if r["micro_batch"] == self.chosen), None)

    def to_json(self) -> dict:
        data = asdict(self)
        data["budget_bytes"] = self.budget_bytes
        row = self.chosen_row() or {}
        data["predicted_bytes"] = row.get("predicted_bytes")
        data["measured_bytes"] = row.get("measured_bytes")
        return data


def read_rows(out_dir: Path) -> list[dict]:
    path = RunDir(out_dir).probe_rows
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a kill
    return rows


def choose(rows: list[dict], budget_bytes: int) -> int | None:
    """The largest size that ran and whose peak stayed within the budget."""
    fitting = [r["micro_batch"] for r in rows if r.get("status") == "ok" and r["peak_bytes"] <= budget_bytes]
    return max(fitting) if fitting else None


def predicted_bytes(recipe: Recipe, size: int, cuda: bool, base_dir: Path | None = None) -> int | None:
    """The estimate's memory for one rank at this micro-batch (None when the model's config is unknown)."""
    try:
        config = estimate.load_model_config(recipe.model.name, base_dir)
    except (RecipeError, OSError):
        return None
    sized = recipe.model_copy(deep=True)
    sized.train.micro_batch = size
    return estimate.estimate_recipe(sized, config, n_gpus=1, cuda=cuda).memory.total


def finish(recipe: Recipe, out_dir: Path, code: int, started: float, *, base_dir: Path | None = None,
           limit_bytes: int | None = None) -> ProbeResult:
    """Read the rank's rows, add the estimate's prediction, choose, and write probe.json."""
    rows = read_rows(out_dir)
    header = next((r for r in rows if r.get("kind") == "device"), {})
    sizes = [r for r in rows if "micro_batch" in r]
    device = header.get("device", "cpu")
    limit = int(limit_bytes or header.get("limit_bytes") or 0)
    for row in sizes:
        row["predicted_bytes"] = predicted_bytes(recipe, row["micro_batch"], device == "cuda", base_dir)
    result = ProbeResult(chosen=None, rows=sizes, limit_bytes=limit, headroom=recipe.train.memory_headroom,
                         device=device, seq_len=recipe.train.max_seq_len, started=started,
                         seconds=round(time.time() - started, 1))
    result.chosen = choose(sizes, result.budget_bytes) if limit else None
    if result.chosen is None:
        if code != 0 and not sizes:
            result.reason = f"the probing rank failed (exit code {code}) before its first size; see " \
                            f"{RunDir(out_dir).probe_launcher_log}"
        elif not sizes:
            result.reason = "the probing rank wrote no rows"
        else:
            result.reason = (f"even micro_batch {sizes[0]['micro_batch']} peaks at {fmt_gb(sizes[0]['peak_bytes'])}, "
                             f"over {fmt_gb(result.budget_bytes)} ({fmt_gb(limit)} less "
                             f"{recipe.train.memory_headroom:.0%} headroom)")
    result.notes += [r["note"] for r in rows if r.get("kind") == "note"]
    write(out_dir, result)
    return result


def write(out_dir: Path, result: ProbeResult) -> Path:
    path = RunDir(out_dir).probe
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=1), encoding="utf-8")
    tmp.replace(path)
    return path


def read(folder: Path) -> dict | None:
    try:
        return json.loads(RunDir(folder).probe.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def fix_micro_batch(run_dir: Path, recipe: Recipe, size: int) -> Recipe:
    """The run's frozen recipe.toml with the chosen size, so its ranks and a resume use that size
    (probe.json says it was 'auto')."""
    chosen = recipe.model_copy(deep=True)
    chosen.train.micro_batch = size
    path = RunDir(run_dir).recipe_toml
    tmp = path.with_suffix(".tmp")
    tmp.write_text(chosen.to_toml(), encoding="utf-8")
    tmp.replace(path)
    return chosen


# ---------------------------------------------------------------- the estimate's error on past runs


def past_ratios(runs_root: Path) -> list[float]:
    """measured / predicted memory of the chosen size, for every run folder and `llmtui probe`
    folder that recorded both."""
    root = Path(runs_root)
    folders = [p for p in root.glob("*") if p.is_dir() and not p.name.startswith(".")]
    folders += list((root / PROBES_DIR).glob("*"))
    ratios = []
    for folder in folders:
        data = read(folder)
        if not data:
            continue
        measured, predicted = data.get("measured_bytes"), data.get("predicted_bytes")
        if measured and predicted:
            ratios.append(measured / predicted)
    return ratios


def error_line(runs_root: Path) -> str | None:
    ratios = past_ratios(runs_root)
    if not ratios:
        return None
    return (f"past runs    measured / predicted memory: median {statistics.median(ratios):.2f}x over "
            f"{len(ratios)} probed run{'s' if len(ratios) != 1 else ''} (min {min(ratios):.2f}x, max {max(ratios):.2f}x)")


# ---------------------------------------------------------------- the table


def fmt_gb(n: int | float | None) -> str:
    if n is None:
        return "—"
    return f"{n / GB:.2f} GB" if n >= 0.1 * GB else f"{n / 1024**2:.0f} MB"


def format_table(result: ProbeResult) -> str:
    lines = [f"{'micro_batch':>11}  {'peak':>10}  {'measured':>10}  {'predicted':>10}  {'meas/pred':>9}  "
             f"{'tokens/s':>9}  {'step s':>7}  status"]
    for row in result.rows:
        ratio = (f"{row['measured_bytes'] / row['predicted_bytes']:.2f}x"
                 if row.get("measured_bytes") and row.get("predicted_bytes") else "—")
        tps = f"{row['tokens_per_s']:.0f}" if row.get("tokens_per_s") else "—"
        step = f"{row['step_s']:.2f}" if row.get("step_s") else "—"
        mark = "  <- chosen" if row["micro_batch"] == result.chosen else ""
        lines.append(f"{row['micro_batch']:>11}  {fmt_gb(row.get('peak_bytes')):>10}  "
                     f"{fmt_gb(row.get('measured_bytes')):>10}  {fmt_gb(row.get('predicted_bytes')):>10}  "
                     f"{ratio:>9}  {tps:>9}  {step:>7}  {row.get('status', '?')}{mark}")
    lines.append(f"device {result.device}: {fmt_gb(result.limit_bytes)}, budget {fmt_gb(result.budget_bytes)} "
                 f"({result.headroom:.0%} headroom); peak = {'CUDA allocator peak' if result.device == 'cuda' else 'process peak RSS'}, "
                 f"measured = {'the same' if result.device == 'cuda' else 'peak RSS less the RSS before the model loaded'}")
    lines += result.notes
    if result.chosen is not None:
        lines.append(f"chosen: micro_batch = {result.chosen}")
    else:
        lines.append(f"nothing fits: {result.reason}")
    return "\n".join(lines)
