"""The compare screen (Pilot) on a real tiny run scored on the demo benchmark at each evaluation
(tests/after_runs.py) and its twin whose provenance.json says another transformers: the Benchmark
chart, a summary column per task, and the changed version among the differing config keys."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest
from textual.widgets import DataTable
from ui_fixtures import test_app, wait_for

from tests.after_runs import bench_run
from tuiapp.ui.screens.compare import CompareScreen
from tuiapp.ui.widgets.charts import CompareChart

pytestmark = pytest.mark.slow
KEY = "bench/llmtui_facts_mc/acc"


def test_benchmark_chart_table_and_provenance_difference(tmp_path_factory, tmp_path):
    source = bench_run(tmp_path_factory)
    root = tmp_path / "runs"
    root.mkdir()
    first = root / source.name
    shutil.copytree(source, first)
    twin = root / (source.name + "-twin")
    shutil.copytree(source, twin)
    record = json.loads((twin / "provenance.json").read_text())
    record["packages"]["transformers"] = "4.0.0"
    (twin / "provenance.json").write_text(json.dumps(record))
    scores = [r[KEY] for r in map(json.loads, (first / "metrics.jsonl").read_text().splitlines())
              if r.get("split") == "eval"]

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="history")
            app.push_screen(CompareScreen([first.name, twin.name]))
            await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded, what="compare")
            await pilot.pause()
            screen = app.screen
            chart = screen.query_one("#cmp-chart-bench", CompareChart)
            assert [list(line.ys) for line in chart.lines] == [scores, scores]
            assert screen.bench_table()[0][1] == {"llmtui_facts_mc": scores[-1]}
            summary = screen.query_one("#cmp-summary", DataTable)
            assert "bench-llmtui_facts_mc" in [str(key.value) for key in summary.columns]
            assert screen.config_keys() == ["provenance.packages.transformers"]

    asyncio.run(scenario())
