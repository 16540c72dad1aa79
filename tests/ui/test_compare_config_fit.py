"""The compare screen's Config pane at 120x36 and 80x24: run columns and values fitted to the
pane (long ones cut in their middle with …), the highlighted key's whole values under the table."""

from __future__ import annotations

import asyncio

import pytest
from rich.cells import cell_len
from textual.widgets import DataTable
from ui_fixtures import screen_text, test_app, wait_for

from tuiapp.core.store.runs import RunStore
from tuiapp.ui.comparing import abbreviate, fit_columns
from tuiapp.ui.screens.compare import CompareScreen

NAMES = ["baseline", "high-lr", "sft"]


def test_abbreviate_and_fit_columns():
    assert abbreviate("short", 10) == "short"
    cut = abbreviate("/data/corpora/very/long/path/to/train.jsonl", 16)
    assert cell_len(cut) == 16 and cut.startswith("/data/c") and cut.endswith("in.jsonl") and "…" in cut
    assert fit_columns([10, 8, 8], 60) == [10, 8, 8]  # all fit: the widest cells
    widths = fit_columns([40, 60, 5, 60], 80)
    assert sum(widths) + 2 * 4 <= 80 and widths[2] == 8 and widths[1] == widths[3] and widths[0] <= 0.4 * 72


async def open_config(pilot, root) -> CompareScreen:
    app = pilot.app
    await wait_for(pilot, lambda: app.screen.summarized, what="history")
    app.push_screen(CompareScreen([RunStore(root).get(name).id for name in NAMES]))
    await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded, what="compare")
    screen = app.screen
    return screen


@pytest.mark.slow  # over ~1.5 s on 2 cores
@pytest.mark.parametrize("size", [(120, 36), (80, 24)], ids=["120x36", "80x24"])
def test_config_columns_fit_the_pane_and_the_full_value_shows_below(runs_root, tmp_path, size):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_config(pilot, runs_root)
            await pilot.press(str(len(screen.chart_metrics()) + 1))  # the Config pane
            await pilot.pause()
            table = screen.query_one("#cmp-config", DataTable)
            await wait_for(pilot, lambda: table.size.width > 0 and screen._config_fitted == screen._config_room(), what="fitted")
            await pilot.pause()
            widths = [column.get_render_width(table) for column in table.columns.values()]
            assert sum(widths) <= table.size.width, (widths, table.size.width)  # every run's column in view
            labels = [str(column.label) for column in table.columns.values()]
            assert len(labels) == 1 + len(NAMES)
            cut = [(key, values) for key, values in screen._config_full.items()
                   if any("…" in str(table.get_cell(key, column)) for column in list(table.columns)[1:])]
            table.focus()
            for _ in range(table.row_count):  # each value's full text reaches the line under the table
                key = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
                detail = str(screen.query_one("#cmp-config-detail").render())
                assert key in detail
                for run in screen.runs:
                    assert run.label in detail
                await pilot.press("down")
            if size == (80, 24):
                assert cut  # the fixtures' long values (paths, versions) are cut at 80 columns
            text = screen_text(app)
            assert "key" in text

    asyncio.run(scenario())
