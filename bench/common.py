"""Shared pieces of the benchmark scripts: paths, machine info, tables, and the two ways to
train (the real `llmtui run` CLI, and the plain Trainer + DeepSpeed baseline) with timing.

Every run goes to a temporary folder; nothing is written into the repository except
bench/RESULTS.md (by bench/run.py).
"""

from __future__ import annotations

import atexit
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

# This process may load data with `datasets` too (profiles, the data benchmark): keep its cache
# in a private temporary folder, never in ~/.cache, and set before anything imports datasets.
_PROCESS_CACHE = Path(tempfile.mkdtemp(prefix="llmtui-bench-hf-"))
os.environ["HF_DATASETS_CACHE"] = str(_PROCESS_CACHE)
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
atexit.register(shutil.rmtree, _PROCESS_CACHE, True)
# DeepSpeed JIT-builds a CPU communication op in TORCH_EXTENSIONS_DIR (default ~/.cache) at each
# rank start when no matching build is there. That folder is shared by every venv of the machine:
# another venv's build there (a rebuild: different source paths) holds a lock every rank waits on,
# and a rank killed mid-build leaves a stale lock that hangs every later run. The benchmark builds
# the op once into its own folder before anything is timed (prepare_ops), so both tools start warm,
# as on a user's machine after the first run.
TORCH_EXTENSIONS = _PROCESS_CACHE / "torch_extensions"
os.environ["TORCH_EXTENSIONS_DIR"] = str(TORCH_EXTENSIONS)
OPS_BUILD: dict = {}

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
PYTHON = sys.executable
DATA_DIR = Path(os.environ.get("LLMTUI_BENCH_DATA") or ROOT.parent / "shared" / "data")
C4 = "c4_demo.jsonl"
# what the benchmarks install once and keep (the peer's venv): outside the checkout
BENCH_CACHE = Path(os.environ.get("LLMTUI_BENCH_CACHE") or Path.home() / ".cache" / "llmtui-bench")
ALPACA = "alpaca_en_demo.json"


# ------------------------------------------------------------------ small helpers


def data_file(name: str) -> Path | None:
    path = DATA_DIR / name
    return path if path.is_file() else None


def missing_data_message(*names: str) -> str | None:
    missing = [n for n in names if data_file(n) is None]
    if not missing:
        return None
    return (f"skipped: {', '.join(missing)} not found in {DATA_DIR} "
            "(set LLMTUI_BENCH_DATA to the folder of the LLaMA-Factory demo data)")


def llmtui_command() -> list[str]:
    script = Path(PYTHON).parent / "llmtui"
    return [str(script)] if script.exists() else [PYTHON, "-m", "tuiapp.cli"]


def deepspeed_command() -> list[str]:
    script = Path(PYTHON).parent / "deepspeed"
    return [str(script)] if script.exists() else [PYTHON, "-m", "deepspeed.launcher.runner"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, spec: str = ".1f", none: str = "—") -> str:
    if value is None:
        return none
    if isinstance(value, str):
        return value
    return format(value, spec)


def md_table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out


def bench_env(cache: Path, hf_cache: Path) -> dict:
    """The environment of every benchmarked process: bench caches, nothing from ~/.cache."""
    env = dict(os.environ)
    env["LLMTUI_CACHE"] = str(cache)
    env["HF_DATASETS_CACHE"] = str(hf_cache)
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["HF_DATASETS_OFFLINE"] = "1"
    env.pop("LLMTUI_RUNS_DIR", None)
    env["TORCH_EXTENSIONS_DIR"] = str(TORCH_EXTENSIONS)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def prepare_ops() -> dict:
    """Build DeepSpeed's CPU comm op into this session's TORCH_EXTENSIONS_DIR, once, untimed
    by the benchmarks (its build time is reported on its own)."""
    if not OPS_BUILD:
        code = "from deepspeed.comm.torch import build_shm_op; print(build_shm_op() is not None)"
        t0 = time.time()
        out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, capture_output=True, text=True)
        OPS_BUILD.update(seconds=time.time() - t0, ok=out.returncode == 0,
                         built=out.stdout.strip().endswith("True"))
    return OPS_BUILD


def ensure_model(cache: Path) -> Path:
    """Build the bundled tiny model into the bench cache, and DeepSpeed's CPU op (both untimed)."""
    prepare_ops()
    code = "import sys; from tuiapp.trainer.models.tiny import ensure_tiny_model; print(ensure_tiny_model(sys.argv[1]))"
    out = subprocess.run([PYTHON, "-c", code, str(cache)], cwd=ROOT, capture_output=True, text=True,
                         env=bench_env(cache, cache / "hf-datasets"), check=True)
    return Path(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ machine info


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_info() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return "; ".join(line.strip() for line in out.stdout.strip().splitlines())
    except (OSError, subprocess.SubprocessError):
        pass
    return "none (CPU only)"


def package_versions() -> dict:
    code = ("import json, torch, transformers, deepspeed, datasets, accelerate;"
            "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__,"
            "'deepspeed': deepspeed.__version__, 'datasets': datasets.__version__,"
            "'accelerate': accelerate.__version__, 'torch_threads': torch.get_num_threads()}))")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=ROOT)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def machine_info() -> dict:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    info = {
        "date": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cores": f"{psutil.cpu_count(logical=False)} physical / {psutil.cpu_count()} logical "
                 f"({len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else '?'} usable)",
        "ram": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "gpu": gpu_info(),
        "load average at start": " ".join(f"{x:.2f}" for x in load) if load else "?",
    }
    info.update(package_versions())
    return info


def machine_markdown(info: dict) -> str:
    return md_table(["", ""], [[k, v] for k, v in info.items()])


# ------------------------------------------------------------------ process sampling


class CliSampler:
    """Samples one process (the `llmtui run` CLI): CPU time and RSS, and whether torch is mapped."""

    def __init__(self, pid: int):
        self.process = psutil.Process(pid)
        self.rss: list[int] = []
        self.marks: dict[str, tuple[float, float]] = {}  # name -> (wall, cpu seconds)
        self.torch_mapped: bool | None = None
        self.mapped_checked = 0
        self.start_wall = time.time()

    def sample(self) -> tuple[float, float] | None:
        try:
            with self.process.oneshot():
                times = self.process.cpu_times()
                rss = self.process.memory_info().rss
        except psutil.Error:
            return None
        self.rss.append(rss)
        return time.time(), times.user + times.system

    def mark(self, name: str) -> None:
        if name in self.marks:
            return
        point = self.sample()
        if point is not None:
            self.marks[name] = point

    def check_maps(self) -> None:
        """True when libtorch (or any torch/transformers/deepspeed file) is mapped."""
        try:
            text = Path(f"/proc/{self.process.pid}/maps").read_text()
        except OSError:
            return
        hit = any(s in text for s in ("libtorch", "/torch/", "/transformers/", "/deepspeed/", "/textual/"))
        self.torch_mapped = bool(self.torch_mapped) or hit
        self.mapped_checked += 1

    def cpu_percent(self, start: str, end: str) -> float | None:
        if start not in self.marks or end not in self.marks:
            return None
        (w0, c0), (w1, c1) = self.marks[start], self.marks[end]
        return 100.0 * (c1 - c0) / (w1 - w0) if w1 > w0 else None


# ------------------------------------------------------------------ llmtui


def recipe_toml(task: dict, model: str = "tiny") -> str:
    """The recipe of one benchmark task; everything not named here is llmtui's default."""
    lines = [
        f'name = "bench-{task["name"]}"',
        "", "[model]", f'name = "{model}"',
        "", "[dataset]", f'name = "{task["data"]}"', f'format = "{task["format"]}"',
        "", "[method]", f'kind = "{task["method"]}"',
        "", "[train]",
        f"max_steps = {task['steps']}",
        f"micro_batch = {task['micro_batch']}",
        f"learning_rate = {task['lr']}",
        f"max_seq_len = {task['max_seq_len']}",
        f"seed = {task.get('seed', 42)}",
        "", "[launch]", f"gpus = {task.get('ranks', 1)}",
    ]
    return "\n".join(lines) + "\n"


class RankWatch:
    """Follows the trainer rank of a run: its CPU time against the steps and non-padding
    tokens it has logged so far. CPU time per token is far less sensitive than wall time to
    other processes sharing the machine, so it backs up the tokens/s figures."""

    def __init__(self, match, metrics_path: Path | None = None):
        self.match = match
        self.metrics_path = metrics_path
        self.process: psutil.Process | None = None
        self.offset = 0
        self.step = self.tokens = None
        self.samples: list[tuple[float, float | None, int | None, float | None]] = []
        self.threads: str | None = None

    def _find(self) -> None:
        for process in psutil.process_iter(["pid", "cmdline"]):
            cmd = process.info.get("cmdline") or []
            if any(a.startswith("--local_rank") for a in cmd) and not any("deepspeed.launcher" in a for a in cmd) \
                    and self.match(cmd):
                self.process = process
                try:
                    self.threads = process.environ().get("OMP_NUM_THREADS", "unset (torch default)")
                except psutil.Error:
                    pass
                return

    def _read_rows(self) -> None:
        if self.metrics_path is None:
            return
        try:
            with open(self.metrics_path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except OSError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("tokens") is not None and row.get("step") is not None \
                    and row.get("split", "train") == "train":
                self.step, self.tokens = row["step"], row["tokens"]

    def poll(self) -> None:
        if self.process is None:
            self._find()
        self._read_rows()
        cpu = None
        if self.process is not None:
            try:
                times = self.process.cpu_times()
                cpu = times.user + times.system
            except psutil.Error:
                cpu = None
        self.samples.append((time.time(), cpu, self.step, self.tokens))

    def window(self, warmup: int) -> dict:
        """Rank CPU per 1k non-padding tokens and CPU utilisation, from step `warmup` to the last."""
        points = [s for s in self.samples if s[1] is not None and s[2] is not None]
        if not points:
            return {}
        last = max(s[2] for s in points)
        start = next((s for s in points if s[2] >= warmup), None)
        end = next((s for s in points if s[2] == last), None)
        if start is None or end is None or end[3] is None or start[3] is None or end[3] <= start[3]:
            return {}
        cpu, wall = end[1] - start[1], end[0] - start[0]
        return {"cpu_ms_per_ktok": 1e6 * cpu / (end[3] - start[3]),
                "cpu_util": 100 * cpu / wall if wall > 0 else None}


def run_llmtui(task: dict, workdir: Path, env: dict, timeout: float = 900) -> dict:
    """`llmtui run RECIPE --runs-dir DIR` exactly as a user types it, sampled while it runs."""
    workdir.mkdir(parents=True, exist_ok=True)
    recipe = workdir / f"{task['name']}.toml"
    recipe.write_text(recipe_toml(task))
    runs = workdir / "runs"
    argv = [*llmtui_command(), "run", str(recipe), "--runs-dir", str(runs)]
    log = open(workdir / "cli.log", "wb")
    t0 = time.time()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    sampler = CliSampler(proc.pid)
    sampler.mark("invoked")
    run_dir = None
    rank = None
    last_maps = 0.0
    deadline = time.monotonic() + timeout
    completed = False
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                break  # counted as failed below; `completed` stays False, so the run is killed
            sampler.sample()
            if run_dir is None and runs.is_dir():
                dirs = [p for p in runs.iterdir() if p.is_dir()]
                if dirs:
                    run_dir = dirs[0]
                    rank = RankWatch(lambda cmd, d=str(run_dir): d in cmd, run_dir / "metrics.jsonl")
            if run_dir is not None:
                rank.poll()
                names = {e.get("event") for e in read_jsonl(run_dir / "events.jsonl")}
                if "first_step" in names:
                    sampler.mark("first_step")
                    if time.monotonic() - last_maps > 5.0 and "finished" not in names:
                        sampler.check_maps()
                        last_maps = time.monotonic()
                if "finished" in names:
                    sampler.mark("finished")
            time.sleep(0.2)
        completed = proc.poll() is not None
    finally:
        if proc.poll() is None:
            proc.kill()
        if not completed:  # interrupted or timed out: the run lives in its own session, end it too
            kill_run(run_dir)
        log.close()
    wall = time.time() - t0
    if run_dir is None:
        dirs = [p for p in runs.iterdir() if p.is_dir()] if runs.is_dir() else []
        run_dir = dirs[0] if dirs else None
    events = read_jsonl(run_dir / "events.jsonl") if run_dir else []
    metrics = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("split", "train") == "train"] if run_dir else []
    ev = {e.get("event"): e.get("time") for e in events}
    params = next((e.get("params") for e in events if e.get("event") == "started"), None)
    try:
        port = _master_port(json.loads((run_dir / "run.json").read_text()).get("argv")) if run_dir else None
    except (OSError, ValueError):
        port = None
    shm_left = reclaim_shm(port)
    ok = proc.returncode == 0 and "finished" in ev
    rows = [{"step": r["step"], "time": r["time"], "tokens": r.get("tokens"), "loss": r.get("loss")}
            for r in metrics if "step" in r]
    return {
        "tool": "llmtui",
        "ok": ok,
        "returncode": proc.returncode,
        "argv": argv,
        "recipe": recipe.read_text(),
        "t0": t0,
        "wall": wall,
        "ttfs": (ev["first_step"] - t0) if "first_step" in ev else None,
        "phases": {
            "invoke→launched": _diff(ev.get("launched"), t0),
            "launched→started": _diff(ev.get("started"), ev.get("launched")),
            "started→first_step": _diff(ev.get("first_step"), ev.get("started")),
        },
        "rows": rows,
        "params": params,
        "shm_left": shm_left if port else None,
        "rank": rank,
        "threads": rank.threads if rank else None,
        "cli": {
            "cpu_pct_training": sampler.cpu_percent("first_step", "finished"),
            "cpu_pct_whole": sampler.cpu_percent("invoked", "finished"),
            "cpu_s_startup": _diff(sampler.marks.get("first_step", (0, None))[1], sampler.marks.get("invoked", (0, None))[1]),
            "rss_max_mb": max(sampler.rss) / 2**20 if sampler.rss else None,
            "rss_mean_mb": statistics.mean(sampler.rss) / 2**20 if sampler.rss else None,
            "torch_mapped": sampler.torch_mapped,
            "maps_checks": sampler.mapped_checked,
            "training_window_s": _diff(sampler.marks.get("finished", (None,))[0], sampler.marks.get("first_step", (None,))[0]),
        },
        "run_dir": str(run_dir) if run_dir else None,
        "log_tail": _tail(workdir / "cli.log") + ("\n" + _tail(run_dir / "stdout.log") if run_dir else ""),
    }


def reclaim_shm(port: int | str | None) -> int:
    """What a finished run left in /dev/shm, removed; the bytes it had left there (llmtui's own
    supervisor frees its runs' buffers, so this counts what the baseline leaves)."""
    from tuiapp.core.machine import shm

    return shm.reclaim(port)


def _master_port(argv: list) -> str | None:
    from tuiapp.core.plan.launcher import master_port_of

    return master_port_of(argv)


def kill_run(run_dir: Path | None) -> None:
    """SIGKILL the process group of an llmtui run (supervisor, launcher, ranks)."""
    if run_dir is None:
        return
    try:
        info = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return
    pgid = info.get("pgid")
    if pgid and pgid != os.getpgid(0):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        time.sleep(0.5)
    reclaim_shm(_master_port(info.get("argv")))


def exit_on_sigterm() -> None:
    """SIGTERM ends a benchmark like Ctrl-C: `finally` blocks stop its runs and remove its folders."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _diff(a, b):
    return (a - b) if (a is not None and b is not None) else None


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


# ------------------------------------------------------------------ baseline


def baseline_argv(task: dict, model_dir: Path, out: Path, port: int) -> list[str]:
    return [
        *deepspeed_command(), "--num_gpus", str(task.get("ranks", 1)), "--master_port", str(port),
        str(BENCH / "baseline_train.py"),
        "--task", "pretrain" if task["method"] == "pretrain" else "sft",
        "--model", str(model_dir), "--data", task["data"], "--out", str(out),
        "--max-steps", str(task["steps"]), "--micro-batch", str(task["micro_batch"]),
        "--lr", str(task["lr"]), "--max-seq-len", str(task["max_seq_len"]),
        "--seed", str(task.get("seed", 42)),
    ]


def run_baseline(task: dict, model_dir: Path, workdir: Path, env: dict, timeout: float = 900) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / "out"
    port = free_port()
    argv = baseline_argv(task, model_dir, out, port)
    rank = RankWatch(lambda cmd, o=str(out): o in cmd, out / "bench_metrics.jsonl")
    with open(workdir / "baseline.log", "wb") as log:
        t0 = time.time()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    break  # killed below, counted as failed
                rank.poll()
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                reclaim_shm(port)
        code = proc.returncode
        wall = time.time() - t0
    shm_left = reclaim_shm(port)
    events = read_jsonl(out / "bench_events.jsonl")
    ev = {e.get("event"): e for e in events}
    records = read_jsonl(out / "bench_metrics.jsonl")
    losses = {r["step"]: r["loss"] for r in records if r.get("log")}
    rows = [{"step": r["step"], "time": r["time"], "tokens": r["tokens"], "padded": r.get("padded"),
             "loss": losses.get(r["step"])} for r in records if not r.get("log")]
    first = ev.get("first_step", {}).get("time")
    started = ev.get("started", {}).get("time")
    return {
        "tool": "baseline",
        "ok": code == 0 and "finished" in ev,
        "returncode": code,
        "argv": argv,
        "t0": t0,
        "wall": wall,
        "ttfs": (first - t0) if first else None,
        "phases": {
            "invoke→started": _diff(started, t0),
            "started→first_step": _diff(first, started),
        },
        "rows": rows,
        "shm_left": shm_left,
        "rank": rank,
        "threads": ev.get("started", {}).get("threads"),
        "log_tail": _tail(workdir / "baseline.log"),
    }


# ------------------------------------------------------------------ run figures


def throughput(rows: list[dict], warmup: int) -> float | None:
    """Non-padding tokens per second over the steps after `warmup` steps."""
    rows = [r for r in rows if r.get("tokens") is not None and r.get("time") is not None]
    rows.sort(key=lambda r: r["step"])
    start = [r for r in rows if r["step"] == warmup] or rows[:1]
    if not rows or not start or rows[-1]["step"] <= start[0]["step"]:
        return None
    a, b = start[0], rows[-1]
    return (b["tokens"] - a["tokens"]) / (b["time"] - a["time"]) if b["time"] > a["time"] else None


def best_of_reps(runs: list[list[dict]], warmup: int) -> float | None:
    """Non-padding tokens/s with each step's time taken as its fastest over the repetitions.
    Both tools see the same batches in the same order in every repetition (fixed seed), so
    step k is the same work each time: the fastest of N is that work with the least
    interference from other processes."""
    times: dict[int, list[float]] = {}
    tokens: dict[int, float] = {}
    for rows in runs:
        rows = sorted((r for r in rows if r.get("time") is not None and r.get("tokens") is not None),
                      key=lambda r: r["step"])
        for a, b in zip(rows, rows[1:], strict=False):
            if a["step"] >= warmup and b["step"] == a["step"] + 1:
                times.setdefault(b["step"], []).append(b["time"] - a["time"])
                tokens.setdefault(b["step"], b["tokens"] - a["tokens"])
    total = sum(min(v) for v in times.values())
    return sum(tokens[k] for k in times) / total if total > 0 else None


def step_times(rows: list[dict], warmup: int) -> list[float]:
    rows = sorted((r for r in rows if r.get("time") is not None), key=lambda r: r["step"])
    return [b["time"] - a["time"] for a, b in zip(rows, rows[1:], strict=False) if a["step"] >= warmup]


def tokens_per_step(rows: list[dict], warmup: int) -> float | None:
    rows = sorted((r for r in rows if r.get("tokens") is not None), key=lambda r: r["step"])
    rows = [r for r in rows if r["step"] >= warmup]
    if len(rows) < 2:
        return None
    return (rows[-1]["tokens"] - rows[0]["tokens"]) / (rows[-1]["step"] - rows[0]["step"])


def temp_dir(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"llmtui-bench-{prefix}-"))


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
