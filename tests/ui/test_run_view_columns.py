"""The run view opens a long run from its columns (metrics.columns, kept by the trainer's writer)
and reads only the lines of metrics.jsonl written after them: never the whole file again."""

from __future__ import annotations

import asyncio

from ui_fixtures import synthetic_run, test_app, wait_for

from tuiapp.core.run_folder.metrics import JsonlReader, JsonlWriter, read_jsonl
from tuiapp.core.run_folder.rundata import MetricsWriter, RunData
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.run_view import RunViewScreen
from tuiapp.ui.widgets.charts import MetricChart

ROWS, TAIL = 3000, 7


def row(step: int) -> dict:
    return {"step": step, "max_steps": ROWS + TAIL, "time": 1e9 + step, "loss": 2.0 - step / (2 * ROWS),
            "lr": 1e-4, "tokens": 64 * step, "tokens_per_s": 900.0 + step % 5,
            "mem": {"rank0": {"device": "cpu", "peak": 1e9 + step}}}


def long_run(root):
    run = synthetic_run(root, "long", steps=2, eval_every=0)
    run.metrics_path.unlink()
    with MetricsWriter(run.path) as writer:  # its columns hold these rows once it closes
        for step in range(1, ROWS + 1):
            writer.write(row(step))
    with JsonlWriter(run.metrics_path) as writer:  # written after the columns' last snapshot
        for step in range(ROWS + 1, ROWS + TAIL + 1):
            writer.write(row(step))
    return run


def bytes_read_opening(run, tmp_path, monkeypatch) -> tuple[int, RunData]:
    """Bytes of metrics.jsonl the run view's reads went through (JsonlReader, the only reader of
    it), counted from the moment the view is pushed, and the view's data."""
    read = []
    real = JsonlReader.read_new

    def counted(self):
        before = self.offset
        records = real(self)
        if self.path == run.metrics_path:
            read.append(self.offset - before)
        return records

    async def scenario():
        app = test_app(run.path.parent, tmp_path, live=False)
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.summarized, what="home")
            monkeypatch.setattr(JsonlReader, "read_new", counted)
            app.push_screen(RunViewScreen(run.id))
            await wait_for(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded, what="run view")
            await pilot.pause(0.2)
            screen = app.screen
            assert screen.query_one("#chart-loss", MetricChart).series[0][1] is screen.data.loss
            assert [label for label, _ in screen.query_one("#chart-mem", MetricChart).series] == ["rank0"]
            return sum(read), screen.data

    return asyncio.run(scenario())


def test_a_long_run_opens_from_its_columns_and_reads_only_the_tail(tmp_path, monkeypatch):
    run = long_run(tmp_path / "runs")
    tail = sum(len(line) + 1 for line in run.metrics_path.read_bytes().splitlines()[-TAIL:])
    read, data = bytes_read_opening(run, tmp_path, monkeypatch)
    assert read == tail
    whole = RunData()
    whole.extend(read_jsonl(run.metrics_path))
    assert data.records == whole.records == ROWS + TAIL
    assert list(data.steps) == list(whole.steps)
    for key, series in whole.series.items():
        assert (list(data.series[key].xs), list(data.series[key].ys)) == (list(series.xs), list(series.ys)), key
    assert list(data.memory["rank0"].ys) == list(whole.memory["rank0"].ys)
    assert data.last_train == whole.last_train


def test_without_columns_the_run_view_reads_the_whole_file(tmp_path, monkeypatch):
    run = long_run(tmp_path / "runs")
    (run.path / "metrics.columns").unlink()
    read, data = bytes_read_opening(run, tmp_path, monkeypatch)
    assert read == run.metrics_path.stat().st_size
    assert data.records == ROWS + TAIL
