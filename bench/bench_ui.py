"""Benchmarks of the TUI (headless, Textual's test driver): prints a markdown table.

    .venv/bin/python bench/bench_ui.py [--quick]

- time to the first painted frame of the history with 0, 1,000 and 10,000 runs (and until the
  first rows, every run.json and every metrics file are in)
- metric line written to metrics.jsonl -> the loss chart redrawn with it (latency)
- redraw of a chart of 1,000,000 points (downsampled to its width)
- compare 10 runs x 100,000 points: load, first frame, redraw on switching the x axis
- side by side with an older checkout (--before DIR), each in a fresh process: process start ->
  the history's first rows with 10,000 runs, and the compare load (first open, next open)

Issue 43's round, on one machine in one run (the first launch, compare of long runs without columns,
the form at 0 and 10,000 runs, idle CPU with 10,000 runs):

    .venv/bin/python bench/bench_ui.py --only quickstart --only compare --only form --only idle

Synthetic run folders (a template made by RunStore.create, copied with its own run.json and a
short metrics.jsonl) in a temporary folder, removed at the end. Under ~3 minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuiapp.core.config.recipe import LoraMethod, Recipe  # noqa: E402
from tuiapp.core.run_folder.columns import columns_path  # noqa: E402
from tuiapp.core.run_folder.metrics import JsonlWriter  # noqa: E402
from tuiapp.core.run_folder.rundata import MetricsWriter, Series  # noqa: E402
from tuiapp.core.store.runs import RunStore  # noqa: E402
from tuiapp.ui.app import LlmtuiApp  # noqa: E402
from tuiapp.ui.config import UiConfig  # noqa: E402
from tuiapp.ui.screens.compare import CompareScreen  # noqa: E402
from tuiapp.ui.screens.run_view import RunViewScreen  # noqa: E402
from tuiapp.ui.widgets.charts import CompareChart, MetricChart  # noqa: E402

NOW = time.time()
SIZE = (160, 48)


class TimedApp(LlmtuiApp):
    """Notes when the first frame of the history was handed to the driver."""

    first_frame: float | None = None

    def _display(self, screen, renderable) -> None:
        if self.first_frame is None and renderable is not None and type(screen).__name__ == "HomeScreen":
            self.first_frame = time.perf_counter()
        super()._display(screen, renderable)


def app_for(root: Path, base: Path, **options) -> TimedApp:
    return TimedApp(UiConfig(runs_root=root, base_dir=base, system_monitor=False, hf_cache_dirs=[], **options))


async def until(pilot, predicate, timeout: float = 120.0, step: float = 0.005) -> float:
    deadline = time.perf_counter() + timeout

    def holds() -> bool:
        try:
            return bool(predicate())
        except Exception:  # the screen is still being built
            return False

    while not holds():
        if time.perf_counter() > deadline:
            raise TimeoutError("benchmark condition not reached")
        await pilot.pause(step)
    return time.perf_counter()


# ------------------------------------------------------------------ synthetic runs


def make_runs(root: Path, count: int, metric_rows: int = 20) -> list[Path]:
    store = RunStore(root)
    template = store.create(Recipe(name="bench", method=LoraMethod()))
    recipe_text = (template.path / "recipe.toml").read_text()
    base_info = json.loads(template.record_path.read_text())
    shutil.rmtree(template.path)
    paths = []
    statuses = ["succeeded", "failed", "stopped", "succeeded"]
    for i in range(count):
        path = root / f"20250101-{i:06d}-bench-{i % 97}-{i:04x}"
        path.mkdir(parents=True)
        (path / "recipe.toml").write_text(recipe_text)
        info = dict(base_info, id=path.name, name=f"bench-{i % 97}", status=statuses[i % 4],
                    started=NOW - 86400 + i, ended=NOW - 86000 + i, method=["lora", "sft", "dora"][i % 3])
        (path / "run.json").write_text(json.dumps(info))
        lines = []
        for step in range(1, metric_rows + 1):
            lines.append(json.dumps({"step": step, "max_steps": metric_rows, "time": NOW - 86400 + i + step,
                                     "loss": 3.0 / step + (i % 13) * 0.01, "lr": 1e-4, "tokens": step * 2048,
                                     "tokens_per_s": 1000.0 + i % 50, "mem": {"rank0": {"device": "cpu", "peak": 1e9}}}))
        (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def write_long_metrics(path: Path, points: int, seed: int) -> None:
    rows = []
    for step in range(1, points + 1):
        rows.append(f'{{"step":{step},"time":{NOW + step},"loss":{2.0 + math.sin(step / 500 + seed) / (1 + step / 20000):.5f},'
                    f'"lr":{1e-4 * (1 - step / points):.3e},"tokens":{step * 1024 * (1 + seed % 3)},"tokens_per_s":{1000 + seed * 10 + step % 17}}}')
    (path / "metrics.jsonl").write_text("\n".join(rows) + "\n")


# ------------------------------------------------------------------ benchmarks


async def bench_first_frame(tmp: Path, count: int) -> dict:
    root = tmp / f"runs-{count}"
    make_runs(root, count, metric_rows=10) if count else root.mkdir(parents=True)
    app = app_for(root, tmp, live=False)
    start = time.perf_counter()
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.first_frame is not None)
        home = app.screen
        rows = await until(pilot, lambda: count == 0 or len(home.query_one("RunsTable").rows) > 0)
        loaded = await until(pilot, lambda: home.loaded)
        summarized = await until(pilot, lambda: home.summarized, timeout=300)
        # one live-sized update: a keypress that re-sorts everything
        sort_start = time.perf_counter()
        await pilot.press("s")
        await pilot.pause()
        sort_time = time.perf_counter() - sort_start
    return {"runs": count, "first_frame": app.first_frame - start, "first_rows": rows - start,
            "all_loaded": loaded - start, "all_summarized": summarized - start, "sort": sort_time}


async def bench_latency(tmp: Path, samples: int) -> dict:
    root = tmp / "latency"
    path = make_runs(root, 1, metric_rows=100)[0]
    info = json.loads((path / "run.json").read_text())
    info.update(status="running", ended=None)
    (path / "run.json").write_text(json.dumps(info))
    app = app_for(root, tmp)
    delays = []
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.screen.loaded)
        app.push_screen(RunViewScreen(path.name))
        await until(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded)
        view = app.screen
        chart = view.query_one("#chart-loss", MetricChart)
        drawn = {"n": 0}
        original = chart.render

        def render():
            result = original()
            drawn["n"] = len(view.data.loss)
            return result

        chart.render = render
        with JsonlWriter(path / "metrics.jsonl") as writer:
            for i in range(samples):
                step = 101 + i
                start = time.perf_counter()
                writer.write({"step": step, "max_steps": 1000, "loss": 1.0, "time": NOW + step})
                done = await until(pilot, lambda step=step: drawn["n"] >= step and len(view.data.loss) >= step, step=0.002)
                delays.append(done - start)
                await pilot.pause(0.05)
    delays.sort()
    return {"median": statistics.median(delays), "p95": delays[int(len(delays) * 0.95) - 1], "max": delays[-1], "poll_s": app.config.poll_s}


async def bench_million(tmp: Path, points: int) -> dict:
    root = tmp / "million"
    root.mkdir()
    app = app_for(root, tmp, live=False)
    series = Series()
    for i in range(points):
        series.append(float(i), 2.0 + math.sin(i / 1000) / (1 + i / 100000))
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.screen.loaded)
        chart = MetricChart("1M points", id="bench-chart")
        await app.screen.mount(chart, before=app.screen.query_one("RunsTable"))
        app.screen.query_one("RunsTable").display = False
        await pilot.pause()
        chart.set_series([("loss", series)])
        cold = _timed(chart.render)
        warm = statistics.median(_timed(chart.render) for _ in range(5))
        uncached = statistics.median(_timed(chart._build) for _ in range(5))
        series.append(float(points), 2.0)
        appended = _timed(chart.render)
        start = time.perf_counter()
        chart.refresh()
        await pilot.pause()
        frame = time.perf_counter() - start
    return {"points": points, "cold": cold, "warm": warm, "uncached": uncached, "after_append": appended, "frame": frame, "drawn": chart.points_drawn}


def _timed(func) -> float:
    start = time.perf_counter()
    func()
    return time.perf_counter() - start


async def bench_compare(tmp: Path, runs: int, points: int) -> dict:
    root = tmp / "compare"
    paths = make_runs(root, runs, metric_rows=1)
    for seed, path in enumerate(paths):
        write_long_metrics(path, points, seed)
    app = app_for(root, tmp, live=False)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: app.screen.summarized, timeout=300)
        start = time.perf_counter()
        app.push_screen(CompareScreen([p.name for p in paths]))
        first_curves = await until(pilot, lambda: isinstance(app.screen, CompareScreen) and bool(app.screen.query_one("#cmp-chart-loss").series), timeout=300)
        loaded = await until(pilot, lambda: app.screen.loaded, timeout=300)
        await pilot.pause()
        first = time.perf_counter()
        toggle = time.perf_counter()
        await pilot.press("x")
        await pilot.pause()
        switched = time.perf_counter()
        charts = list(app.screen.query(CompareChart))
        redraw = sum(_timed(c._build) for c in charts)  # uncached: plotext builds every chart
    return {"runs": runs, "points": points, "first_curves": first_curves - start, "load": loaded - start, "first_frame": first - start,
            "toggle_axis": switched - toggle, "redraw_charts": redraw, "charts": len(charts)}


# The compare screen's load (read + parse + summary of every run) in a fresh interpreter of a
# checkout (this one, or an older one with --before): the time from opening the screen to its
# first frame with every run loaded. This checkout keeps columns in runs/.cache/columns: the first open parses, the next
# ones read the columns.
COMPARE_DRIVER = r"""
import asyncio, sys, time
from pathlib import Path
from tuiapp.ui.app import LlmtuiApp
from tuiapp.ui.config import UiConfig
root = Path(sys.argv[1])
ids = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))
app = LlmtuiApp(UiConfig(runs_root=root, base_dir=root.parent, system_monitor=False, hf_cache_dirs=[], live=False))
painted = []
display = app._display
def _display(screen, renderable):  # the first frame handed to the terminal with every run loaded
    display(screen, renderable)
    if renderable is not None and not painted and type(screen).__name__ == "CompareScreen" and screen.loaded:
        painted.append(time.perf_counter())
app._display = _display
async def main():
    async with app.run_test(size=(160, 48)) as pilot:
        while not getattr(app.screen, "summarized", False):
            await pilot.pause(0.05)
        await pilot.pause(1.0)  # a user reads the history before pressing c
        start = time.perf_counter()
        from tuiapp.ui.screens.compare import CompareScreen  # the app imports it on the first open too
        app.push_screen(CompareScreen(ids))
        while not painted:
            await pilot.pause(0.05)  # seldom: a busy poll would take the GIL from the loading thread
        print(painted[0] - start)
asyncio.run(main())
"""


COMPARE_STATES = (
    ("older", "runs of an older llmtui (no columns: every line parsed)"),
    ("running", "running runs (the trainer's columns 1/16 behind: the most its writer leaves)"),
    ("finished", "finished runs (the trainer's columns hold every row)"),
)


def keep_columns(path: Path, behind: float) -> None:
    """The columns the trainer's writer (rundata.MetricsWriter) keeps for a run, its last snapshot
    `behind` (a fraction) of the rows behind metrics.jsonl; 0 removes them (an older llmtui)."""
    metrics, kept = path / "metrics.jsonl", columns_path(path)
    kept.unlink(missing_ok=True)
    if not behind:
        return
    lines = metrics.read_bytes().splitlines(keepends=True)
    cut = len(lines) - int(len(lines) * behind) if behind < 1 else len(lines)
    metrics.write_bytes(b"".join(lines[:cut]))
    MetricsWriter(path).close()  # reads the rows written so far, and leaves its snapshot of them
    with open(metrics, "ab") as handle:  # the rows written since (the same file: appended)
        handle.write(b"".join(lines[cut:]))


def long_runs(tmp: Path, runs: int, points: int, state: str) -> Path:
    """`runs` runs of `points` metric rows, in one of COMPARE_STATES (the TUI's cache removed)."""
    root = tmp / f"compare-load-{runs}-{points}"
    if not root.exists():
        paths = make_runs(root, runs, metric_rows=1)
        for seed, path in enumerate(paths):
            write_long_metrics(path, points, seed)
    shutil.rmtree(root / ".cache", ignore_errors=True)
    made = tmp / f"{root.name}.state"
    if not made.exists() or made.read_text() != state:
        for path in root.iterdir():
            if not path.name.startswith("."):
                keep_columns(path, {"older": 0, "running": 1 / 16, "finished": 1}[state])
        made.write_text(state)
    return root


def bench_compare_load(tmp: Path, runs: int, points: int, code: Path, repeats: int = 5) -> list[list[float]]:
    """Seconds from opening the compare screen (its module's import included, as on a first `c`)
    to every run loaded, each in a fresh process, for each of COMPARE_STATES, `repeats` times
    (the TUI's own cache of the columns, made by a first open of runs that have none, removed
    before each)."""
    import subprocess

    out = []
    for state, _ in COMPARE_STATES:
        times = []
        for _ in range(repeats):
            root = long_runs(tmp, runs, points, state)
            done = subprocess.run([sys.executable, "-c", COMPARE_DRIVER, str(root)], cwd=code, capture_output=True, text=True, check=True)
            times.append(float(done.stdout.split()[-1]))
        out.append(times)
    return out


# A fresh interpreter: from its start (the parent's clock before spawning it) to the first frame
# of the history with rows. Also runs against an older checkout (--before DIR) for a side by side.
START_DRIVER = r"""
import asyncio, sys, time
from pathlib import Path
spawned = float(sys.argv[1])
from tuiapp.ui.app import LlmtuiApp
from tuiapp.ui.config import UiConfig
imported = time.time()
app = LlmtuiApp(UiConfig(runs_root=Path(sys.argv[2]), base_dir=Path(sys.argv[3]), system_monitor=False, hf_cache_dirs=[], live=False))
painted = []
display = app._display
summarized = len(sys.argv) > 4 and sys.argv[4] == "summarized"
def _display(screen, renderable):  # the first frame handed to the terminal with rows in the table
    display(screen, renderable)  # (with every row's metrics summarised, when asked)
    if renderable is not None and not painted and type(screen).__name__ == "HomeScreen":
        try:
            if len(screen.query_one("RunsTable").rows) > 0 and (not summarized or screen.summarized):
                painted.append(time.time())
        except Exception:
            pass
app._display = _display
async def main():
    async with app.run_test(size=(160, 48)) as pilot:
        while not painted:
            await pilot.pause(0.05)  # seldom: a busy poll would take the GIL from the app
        print(imported - spawned, painted[0] - spawned)
asyncio.run(main())
"""


# `n` in a fresh interpreter: from the keypress (the form's module's import included, as on the first
# `n`) to the form's first frame, and to the first frame showing a key typed as soon as the form
# was painted (the name field's "x"): the form takes keys. The history was read, then 1 s passed.
FORM_DRIVER = r"""
import asyncio, sys, time
from pathlib import Path
from textual import events
from tuiapp.ui.app import LlmtuiApp
from tuiapp.ui.config import UiConfig
root = Path(sys.argv[1])
app = LlmtuiApp(UiConfig(runs_root=root, base_dir=root.parent, system_monitor=False, hf_cache_dirs=[], live=False))
painted, usable = [], []
display = app._display
def _display(screen, renderable):
    display(screen, renderable)
    if renderable is None or type(screen).__name__ != "NewExperimentScreen":
        return
    now = (time.perf_counter(), time.process_time())
    if not painted:
        painted.append(now)
        app.post_message(events.Key("x", "x"))  # typed at once, into the focused field (the name)
    elif not usable and screen.query_one("#f-name").value.endswith("x"):
        usable.append(now)
app._display = _display
async def main():
    async with app.run_test(size=(160, 48)) as pilot:
        while not getattr(app.screen, "summarized", False):
            await pilot.pause(0.05)
        await pilot.pause(1.0)
        start, cpu = time.perf_counter(), time.process_time()
        app.post_message(events.Key("n", "n"))
        while not usable:
            await pilot.pause(0.05)
        while not getattr(app.screen, "filled", True):  # the sections filled after the first frame
            await pilot.pause(0.05)
        await pilot.pause()
        print(painted[0][0] - start, usable[0][0] - start, painted[0][1] - cpu, usable[0][1] - cpu)
asyncio.run(main())
"""


def bench_form(tmp: Path, code: Path, repeats: int = 5, runs: int = 20) -> dict:
    """`n` -> the new-experiment form painted, and taking keys, each in a fresh process, with
    `runs` runs in the history (0, 20 or 10,000: the form lists succeeded runs as models)."""
    import subprocess

    root = tmp / f"form-{runs}"
    if not root.exists():
        root.mkdir(parents=True)
        make_runs(root, runs, metric_rows=10)
    painted, usable, cpu = [], [], []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", FORM_DRIVER, str(root)], cwd=code, capture_output=True, text=True, check=True)
        first, second, _, used = map(float, done.stdout.split()[-4:])
        painted.append(first)
        usable.append(second)
        cpu.append(used)
    return {"painted": painted, "usable": usable, "cpu": cpu}


# A fresh interpreter: the history with every run loaded and summarised, then CPU time over a
# window of doing nothing (no key, no run changing): the app's own polling and redraws.
IDLE_DRIVER = r"""
import asyncio, sys, time
from pathlib import Path
from tuiapp.ui.app import LlmtuiApp
from tuiapp.ui.config import UiConfig
root, window = Path(sys.argv[1]), float(sys.argv[2])
app = LlmtuiApp(UiConfig(runs_root=root, base_dir=root.parent, system_monitor=False, hf_cache_dirs=[]))
async def main():
    async with app.run_test(size=(160, 48)) as pilot:
        while not getattr(app.screen, "summarized", False):
            await pilot.pause(0.1)
        await pilot.pause(3.0)  # the last batches painted, the loaders done
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.sleep(window)
        print((time.process_time() - cpu) / (time.perf_counter() - wall))
asyncio.run(main())
"""


def bench_idle(tmp: Path, code: Path, runs: int = 10_000, window_s: float = 20.0, repeats: int = 3) -> list[float]:
    """CPU share of one core used by the app sitting on the history of `runs` runs (live polling
    on, the default), over `window_s` seconds, each in a fresh process."""
    import subprocess

    root = tmp / f"form-{runs}"
    if not root.exists():
        root.mkdir(parents=True)
        make_runs(root, runs, metric_rows=10)
    out = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", IDLE_DRIVER, str(root), str(window_s)], cwd=code,
                              capture_output=True, text=True, check=True)
        out.append(float(done.stdout.split()[-1]))
    return out


def compile_bytecode(code: Path) -> None:
    """Both checkouts start from compiled bytecode, as after `make install` (a shell with
    PYTHONDONTWRITEBYTECODE set would otherwise compile every module in every process)."""
    import subprocess

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(code / "tuiapp")], check=True)


def bench_process_start(tmp: Path, count: int, code: Path, repeats: int = 5) -> dict:
    """Process start -> first rows of the history with `count` runs (each of `repeats` runs)."""
    import subprocess

    root = tmp / f"start-{count}"
    if not root.exists():
        make_runs(root, count, metric_rows=10)
    imports, rows = [], []
    for _ in range(repeats):
        spawned = time.time()
        done = subprocess.run([sys.executable, "-c", START_DRIVER, str(spawned), str(root), str(tmp)], cwd=code,
                              capture_output=True, text=True, check=True)
        first, second = map(float, done.stdout.split()[-2:])
        imports.append(first)
        rows.append(second)
    return {"runs": count, "imports": imports, "first_rows": rows}


def bench_history_long(tmp: Path, runs: int, points: int, code: Path, repeats: int = 5) -> list[list[float]]:
    """Process start -> the history's first frame with every row summarised (step, loss, tokens/s,
    sparkline), for `runs` runs of `points` metric rows in each of COMPARE_STATES."""
    import subprocess

    out = []
    for state, _ in COMPARE_STATES:
        times = []
        for _ in range(repeats):
            root = long_runs(tmp, runs, points, state)
            spawned = time.time()
            done = subprocess.run([sys.executable, "-c", START_DRIVER, str(spawned), str(root), str(tmp), "summarized"],
                                  cwd=code, capture_output=True, text=True, check=True)
            times.append(float(done.stdout.split()[-1]))
        out.append(times)
    return out


# The run view of one long run in a fresh interpreter: from pushing it (its module's import included,
# as on a first enter) to its first frame with every row loaded. The history was read, then 1 s passed.
RUN_VIEW_DRIVER = r"""
import asyncio, sys, time
from pathlib import Path
from tuiapp.ui.app import LlmtuiApp
from tuiapp.ui.config import UiConfig
root, run_id, rows = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
app = LlmtuiApp(UiConfig(runs_root=root, base_dir=root.parent, system_monitor=False, hf_cache_dirs=[], live=False))
painted = []
display = app._display
def _display(screen, renderable):  # the first frame handed to the terminal with every row loaded
    display(screen, renderable)
    if renderable is not None and not painted and type(screen).__name__ == "RunViewScreen" and screen.loaded \
            and len(screen.data.loss) == rows:
        painted.append(time.perf_counter())
app._display = _display
async def main():
    async with app.run_test(size=(160, 48)) as pilot:
        while not getattr(app.screen, "summarized", False):
            await pilot.pause(0.05)
        await pilot.pause(1.0)
        start = time.perf_counter()
        from tuiapp.ui.screens.run_view import RunViewScreen
        app.push_screen(RunViewScreen(run_id))
        while not painted:
            await pilot.pause(0.05)
        print(painted[0] - start)
asyncio.run(main())
"""


def bench_run_view(tmp: Path, points: int, code: Path, repeats: int = 5) -> list[list[float]]:
    """Opening the run view of one of the long runs -> its first frame with every row, in each of
    COMPARE_STATES, each in a fresh process (the TUI's cache of the columns removed before each; the
    history's summary, read first, makes it again for runs without columns)."""
    import subprocess

    out = []
    for state, _ in COMPARE_STATES:
        times = []
        for _ in range(repeats):
            root = long_runs(tmp, 10, points, state)
            run_id = sorted(p.name for p in root.iterdir() if not p.name.startswith("."))[0]
            done = subprocess.run([sys.executable, "-c", RUN_VIEW_DRIVER, str(root), run_id, str(points)], cwd=code,
                                  capture_output=True, text=True, check=True)
            times.append(float(done.stdout.split()[-1]))
        out.append(times)
    return out


def fmt(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


SIDE_BY_SIDE = ("start", "compare", "history", "form", "runview", "idle")
FIRST_LAUNCH = "quickstart"  # bench_first_launch.py's cold `llmtui run recipes/quickstart.toml`: only when asked


def side_by_side(tmp: Path, before: Path | None, quick: bool, only: list[str] | None = None) -> list[str]:
    """Process start -> first rows (10,000 runs), the compare load and the history of long runs
    (10 x 100,000 points), in fresh processes of this checkout and, with --before, of an older one."""
    here = Path(__file__).resolve().parents[1]
    count, points = (1000, 10_000) if quick else (10_000, 100_000)
    trees = [("now", here)] + ([("before", before)] if before else [])
    only = only or list(SIDE_BY_SIDE)
    first_launch = []
    if FIRST_LAUNCH in only:  # first: on a machine as quiet as the rest of the round
        import bench_first_launch

        runs = [bench_first_launch.bench_quickstart(tmp, cold_ops) for cold_ops in (False, True)]
        first_launch = ["", *bench_first_launch.markdown(runs)]
    for _, code in trees:
        compile_bytecode(code)
    head = "| benchmark (fresh process each; median, min-max) | " + " | ".join(name for name, _ in trees) + " |"
    lines = [head, "|---|" + "---|" * len(trees)]
    if "start" in only:
        starts = {name: bench_process_start(tmp, count, code) for name, code in trees}
        lines.append(f"| process start -> history's first frame with rows, {count:,} runs | "
                     + " | ".join(spread(starts[n]["first_rows"]) for n, _ in trees) + " |")
        lines.append("| ... of which imports | " + " | ".join(spread(starts[n]["imports"]) for n, _ in trees) + " |")
    if "compare" in only:
        loads = {name: bench_compare_load(tmp, 10, points, code) for name, code in trees}
        for index, (_, what) in enumerate(COMPARE_STATES):
            lines.append(f"| compare 10 runs x {points:,} points: open -> first frame with every run loaded, {what} | "
                         + " | ".join(spread(loads[n][index]) for n, _ in trees) + " |")
    if "history" in only:
        histories = {name: bench_history_long(tmp, 10, points, code) for name, code in trees}
        for index, (_, what) in enumerate(COMPARE_STATES):
            lines.append(f"| process start -> history's first frame with every row summarised, 10 runs x {points:,} points, {what} | "
                         + " | ".join(spread(histories[n][index]) for n, _ in trees) + " |")
    if "runview" in only:
        views = {name: bench_run_view(tmp, points, code) for name, code in trees}
        for index, (_, what) in enumerate(COMPARE_STATES):
            lines.append(f"| run view of a run of {points:,} points: open -> first frame with every row, {what} | "
                         + " | ".join(spread(views[n][index]) for n, _ in trees) + " |")
    if "form" in only:
        for runs in (0, 1000 if quick else 10_000):
            forms = {name: bench_form(tmp, code, runs=runs) for name, code in trees}
            lines.append(f"| `n` -> new-experiment form, {runs:,} runs: first frame | "
                         + " | ".join(spread(forms[n]["painted"]) for n, _ in trees) + " |")
            lines.append(f"| `n` -> new-experiment form, {runs:,} runs: a key typed at its first frame shown (usable) | "
                         + " | ".join(spread(forms[n]["usable"]) for n, _ in trees) + " |")
            lines.append("| ... CPU time of the process until then (all threads; steadier on a loaded machine) | "
                         + " | ".join(spread(forms[n]["cpu"]) for n, _ in trees) + " |")
    if "idle" in only:
        runs = 1000 if quick else 10_000
        idle = {name: bench_idle(tmp, code, runs=runs) for name, code in trees}
        lines.append(f"| idle CPU of the history with {runs:,} runs (share of one core, 20 s windows) | "
                     + " | ".join(" / ".join(f"{v:.1%}" for v in idle[n]) for n, _ in trees) + " |")
    return lines + first_launch


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}-{fmt(max(values))})"


async def main(quick: bool, before: Path | None, only_side_by_side: bool, only: list[str] | None = None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="llmtui-bench-ui-"))
    started = time.perf_counter()
    try:
        compared = side_by_side(tmp, before, quick, only)
        if only_side_by_side or only:
            print("\n".join(compared))
            return
        counts = [0, 1000] if quick else [0, 1000, 10000]
        frames = [await bench_first_frame(tmp, n) for n in counts]
        latency = await bench_latency(tmp, 10 if quick else 20)
        million = await bench_million(tmp, 1_000_000)
        compare = await bench_compare(tmp, 10, 10_000 if quick else 100_000)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"## TUI benchmarks ({SIZE[0]}x{SIZE[1]}, headless; {time.perf_counter() - started:.0f} s in all)\n")
    print("\n".join(compared) + "\n")
    print("| benchmark | result |")
    print("|---|---|")
    for f in frames:
        print(f"| history, {f['runs']:,} runs: first frame | {fmt(f['first_frame'])} |")
        if f["runs"]:
            print(f"| history, {f['runs']:,} runs: first rows / all run.json / all metrics | "
                  f"{fmt(f['first_rows'])} / {fmt(f['all_loaded'])} / {fmt(f['all_summarized'])} |")
            print(f"| history, {f['runs']:,} runs: re-sort all (keypress to frame) | {fmt(f['sort'])} |")
    print(f"| metric line -> loss chart redrawn (poll {latency['poll_s']} s): median / p95 / max | "
          f"{fmt(latency['median'])} / {fmt(latency['p95'])} / {fmt(latency['max'])} |")
    print(f"| chart of {million['points']:,} points: first render (downsample + plot) | {fmt(million['cold'])} |")
    print(f"| chart of {million['points']:,} points: redraw, cached / rebuilt / after one more point | {fmt(million['warm'])} / {fmt(million['uncached'])} / {fmt(million['after_append'])} |")
    print(f"| chart of {million['points']:,} points: full frame | {fmt(million['frame'])} ({million['drawn']} points drawn) |")
    print(f"| compare {compare['runs']} runs x {compare['points']:,} points: first curves / all loaded (read + parse) / frame | "
          f"{fmt(compare['first_curves'])} / {fmt(compare['load'])} / {fmt(compare['first_frame'])} |")
    print(f"| compare {compare['runs']} runs x {compare['points']:,} points: switch x axis / redraw {compare['charts']} charts | {fmt(compare['toggle_axis'])} / {fmt(compare['redraw_charts'])} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke test")
    parser.add_argument("--before", type=Path, help="an older checkout (git worktree or git archive) to compare start-up and the compare load with")
    parser.add_argument("--side-by-side", action="store_true", help="only the start-up and compare-load comparison")
    parser.add_argument("--only", action="append", choices=(*SIDE_BY_SIDE, FIRST_LAUNCH),
                        help="only this side-by-side benchmark (repeatable)")
    args = parser.parse_args()
    asyncio.run(main(args.quick, args.before, args.side_by_side, args.only))
