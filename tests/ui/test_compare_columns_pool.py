"""Long runs without columns (an older llmtui's, a deleted cache): their columns are made in
worker processes in parallel (tuiapp.ui.columns_pool, core's rundata.build_columns), the
compare screen and the history show each run's state meanwhile, and the compare title fits
its width with the loading state first."""

from __future__ import annotations

import shutil

import pytest
from rich.text import Text
from ui_fixtures import screen_text, synthetic_run, test_app, wait_for

from tuiapp.core.run_folder import columns
from tuiapp.core.run_folder.metrics import read_jsonl
from tuiapp.core.run_folder.rundata import SUMMARISE_MIN_BYTES, RunData, build_columns, needs_columns, read_run_data
from tuiapp.ui.screens.compare import CompareScreen, fit_title


def long_run(root, name: str, index: int):
    run = synthetic_run(root, name, index=index, steps=4000, eval_every=0, seed=index)
    columns.columns_path(run.path).unlink(missing_ok=True)  # an older llmtui: metrics.jsonl only
    assert run.metrics_path.stat().st_size >= SUMMARISE_MIN_BYTES
    return run


def test_build_columns_makes_the_cache_that_read_run_data_then_loads(tmp_path):
    run = long_run(tmp_path, "old", 0)
    assert needs_columns(run.path)
    assert build_columns(run.path)
    cache = columns.columns_cache(run.path)
    assert cache.exists() and columns.holds(cache, run.metrics_path) and not needs_columns(run.path)
    data, _ = read_run_data(run.metrics_path, cache)
    exact = RunData()
    exact.extend(read_jsonl(run.metrics_path))
    assert list(data.loss.ys) == list(exact.loss.ys) and list(data.steps) == list(exact.steps)
    with open(run.metrics_path, "ab") as handle:  # rewritten from the covered offset: it no longer holds
        handle.truncate(run.metrics_path.stat().st_size - 10)
    assert not columns.holds(cache, run.metrics_path) and needs_columns(run.path)


def test_fit_title_keeps_the_loading_state_whole_and_cuts_names_last():
    parts = ["10 runs by [b]step[/]", "smooth ▯▯▯▯▯▯ 0", "y linear", "config: differing keys"]
    names = ", ".join(f"run-with-a-long-name-{i}" for i in range(10))
    for width in (78, 118):
        title = fit_title("loading 3/10 runs (2 reading metrics.jsonl, 7 left)…", parts, names, width)
        text = Text.from_markup(title).plain
        assert text.startswith("loading 3/10 runs (2 reading") and Text(text).cell_len <= width
        assert "10 runs by step" in text
    assert "y linear" in Text.from_markup(fit_title("", parts, names, 118)).plain


@pytest.mark.slow  # two spawned worker processes parse 1 MB each (~4 s on 2 busy cores)
@pytest.mark.parametrize("size", [(80, 24), (120, 36)], ids=["80x24", "120x36"])
def test_history_and_compare_read_long_runs_without_columns_in_worker_processes(tmp_path, size):
    root = tmp_path / "runs"
    runs = [long_run(root, f"old-{i}", i) for i in range(2)]

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=size) as pilot:
            statuses = set()
            while not getattr(app.screen, "summarized", False):
                try:
                    statuses.add(str(app.screen.query_one("#home-status").render()))
                except Exception:  # the screen is still being built
                    pass
                await pilot.pause(0.02)
            assert any("reading metrics of 2 long runs" in status for status in statuses), statuses
            rows = app.screen.model.rows
            assert all(rows[run.path.name].step == 4000 and rows[run.path.name].summarized for run in runs)
            # the history made their columns (in worker processes): remove them, as a deleted cache
            assert all(not needs_columns(run.path) for run in runs)
            shutil.rmtree(root / ".cache")
            assert all(needs_columns(run.path) for run in runs)
            app.push_screen(CompareScreen([run.path.name for run in runs]))
            seen, titles = set(), []
            await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), what="compare")
            screen = app.screen
            while not screen.loaded:
                seen.update(screen.reading.values())
                try:
                    titles.append(screen_text(app).splitlines()[1])
                except Exception:  # the screen is still being built
                    pass
                await pilot.pause(0.02)
            loading = [t for t in titles if "loading" in t]
            # each run's state, or the title's loading count, was shown while they loaded (on a busy machine the
            # worker processes can finish both runs before the first look at their states)
            assert "reading" in seen or "queued" in seen or loading, (seen, titles[:3])
            assert all(t.strip().startswith("loading") for t in loading)
            for line in titles:
                assert Text(line).cell_len <= size[0]
            await pilot.pause()
            exact = RunData()
            exact.extend(read_jsonl(runs[0].metrics_path))
            assert list(screen.runs[0].data.loss.ys) == list(exact.loss.ys)
            assert all(columns.columns_cache(run.path).exists() for run in runs)  # made by the processes
            # the title drops its loading state on the next repaint after the last run loads (not at once)
            await wait_for(pilot, lambda: "loading" not in screen_text(app).splitlines()[1], what="the loaded title")

    import asyncio

    asyncio.run(scenario())
