"""Make the SVG screenshots of docs/tui.md from the real-run fixtures.

    .venv/bin/python docs/screenshots/make.py [--size 120x36] [--only NAME ...]

The app runs headless (Textual's run_test) on a copy of tests/fixtures/runs (real runs of the
trainer on the bundled tiny model, made by tests/fixtures/make_runs.py), with the fixtures'
frozen clock, TZ=UTC and no GPU/host monitor, so the pictures are the same on every machine.
Writes home.svg, new-experiment.svg, new-experiment-open.svg, run-view.svg, run-view-log.svg, help.svg, compare.svg and compare-config.svg
next to this file; sweep.svg and sweep-group.svg add a 2x2 sweep to the runs (built by the real
core, as the tests build it: tests/ui/manager_fixtures.py) and show it in the history and on
its group screen. `--only` writes just the named ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FIXTURES = REPO / "tests" / "fixtures"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "ui"))  # the sweep the tests use (manager_fixtures.make_sweep)

os.environ["TZ"] = "UTC"  # start times show in local time
time.tzset()

from tuiapp.ui.app import create_app  # noqa: E402
from tuiapp.ui.screens.compare import CompareScreen  # noqa: E402
from tuiapp.ui.screens.group import GroupScreen  # noqa: E402
from tuiapp.ui.screens.help import HelpScreen  # noqa: E402
from tuiapp.ui.screens.new_experiment import NewExperimentScreen  # noqa: E402
from tuiapp.ui.screens.run_view import RunViewScreen  # noqa: E402


async def until(pilot, predicate, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except Exception:
            pass
        await pilot.pause(0.05)
    raise SystemExit(f"timed out waiting for {what}")


async def shoot(root: Path, work: Path, now: float, ids: dict[str, str], size: tuple[int, int]) -> dict[str, str]:
    app = create_app(root, clock=lambda: now, base_dir=work, system_monitor=False, hf_cache_dirs=[], live=False)
    shots = {}
    async with app.run_test(size=size) as pilot:
        home = app.screen
        await until(pilot, lambda: home.summarized, "the history")
        await pilot.press("down", "down", "down", "space", "space")  # mark sft and high-lr (space moves down)
        await pilot.pause()
        shots["home"] = app.export_screenshot(title="llmtui: run history")

        await pilot.press("n")
        form = app.screen
        assert isinstance(form, NewExperimentScreen)
        await until(pilot, lambda: form.last_check is not None, "the form's check")
        prompts = form.query_one("#f-train--sample-prompts")
        prompts.cursor_blink = False
        prompts.focus()
        await pilot.press(*"What is the capital of France?", "enter", *"What sound does a cow make?")
        await until(pilot, lambda: "held out" in str(form.query_one("#ne-verdict").render()), "the form's check")
        await pilot.pause(0.3)
        shots["new-experiment"] = app.export_screenshot(title="llmtui: new experiment (a list field focused)")
        await pilot.press("ctrl+o", *"dpo")
        await until(pilot, lambda: app.screen.query_one("CommandList").option_count > 0, "the recipe picker")
        await pilot.pause(0.5)
        shots["new-experiment-open"] = app.export_screenshot(title="llmtui: new experiment, ctrl+o opens a recipe")
        await pilot.press("escape", "escape", "y")  # close the picker, leave the form: drop the edits

        app.push_screen(RunViewScreen(ids["sft"]))
        await until(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded, "the run view")
        view = app.screen
        await until(pilot, lambda: len(view.query_one("#rv-log").lines) > 0, "the log")
        await pilot.pause(0.3)
        shots["run-view"] = app.export_screenshot(title="llmtui: run view")
        await pilot.press("5", "slash", *"eval_loss", "enter", "z")  # the log, searched, full screen
        await pilot.pause(0.3)
        shots["run-view-log"] = app.export_screenshot(title="llmtui: run view, rank 0's log searched (/ then n, N)")
        await pilot.press("z", "1")

        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "help")
        await pilot.pause(0.2)
        shots["help"] = app.export_screenshot(title="llmtui: help (?)")
        await pilot.press("escape", "escape")

        app.push_screen(CompareScreen([ids["baseline"], ids["high-lr"], ids["sft"]]))
        await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded, "compare")
        await pilot.press("s", "s", *["left"] * 10)  # EMA 0.6, the cursor at step 30
        await pilot.pause(0.3)
        shots["compare"] = app.export_screenshot(title="llmtui: compare (smoothed, cursor at step 30)")
        await pilot.press("escape")

        app.push_screen(CompareScreen([ids["baseline"], ids["high-lr"]]))
        await until(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded, "compare")
        await pilot.press("6", "z")  # the config pane, zoomed: the keys that differ
        await pilot.pause(0.3)
        shots["compare-config"] = app.export_screenshot(title="llmtui: compare, config keys that differ")
    return shots


async def shoot_sweep(root: Path, work: Path, now: float, size: tuple[int, int]) -> dict[str, str]:
    from manager_fixtures import make_sweep

    make_sweep(root)
    app = create_app(root, clock=lambda: now, base_dir=work, system_monitor=False, hf_cache_dirs=[], live=False)
    shots = {}
    async with app.run_test(size=size) as pilot:
        home = app.screen
        await until(pilot, lambda: home.summarized and home.model.group_records, "the history and its sweep")
        await pilot.press("f")  # unfold the sweep
        await pilot.pause(0.3)
        shots["sweep"] = app.export_screenshot(title="llmtui: a sweep in the history")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, GroupScreen) and app.screen.loaded, "the group screen")
        await pilot.pause(0.3)
        shots["sweep-group"] = app.export_screenshot(title="llmtui: a sweep's group screen")
    return shots


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="120x36", help="terminal size, COLSxROWS")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="write only these (e.g. sweep sweep-group)")
    args = parser.parse_args()
    size = tuple(int(v) for v in args.size.lower().split("x"))
    manifest = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))
    ids = {name: run["id"] for name, run in manifest["runs"].items()}
    work = Path(tempfile.mkdtemp(prefix="llmtui-shots-"))
    try:
        root = work / "runs"
        shutil.copytree(FIXTURES / "runs", root)
        shots = {}
        if not args.only or set(args.only) - {"sweep", "sweep-group"}:
            shots.update(asyncio.run(shoot(root, work, manifest["now"], ids, size)))
        if not args.only or set(args.only) & {"sweep", "sweep-group"}:
            shots.update(asyncio.run(shoot_sweep(root, work, manifest["now"], size)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, svg in shots.items():
        if args.only and name not in args.only:
            continue
        (HERE / f"{name}.svg").write_text(svg, encoding="utf-8")
        print(f"docs/screenshots/{name}.svg  {len(svg) // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
