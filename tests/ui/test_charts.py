"""The run view's charts are compare's charts (tuiapp.ui.widgets.charts): round ticks, the legend
on the title line rather than on the curves, eval losses as marked points, and y limits from
percentiles for grad norm and tokens/s, so one spike does not flatten the curve (Pilot)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from ui_fixtures import screen_text, synthetic_run, test_app, wait_for

from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.screens.run_view import RunViewScreen
from tuiapp.ui.widgets.charts import CompareChart, MetricChart

SPIKE = 402.0


def spiked_run(root):
    """A 40-step run whose grad norm spikes once (step 20), as a bad batch does."""
    run = synthetic_run(root, "spiky", steps=40)
    rows = [json.loads(line) for line in run.metrics_path.read_text(encoding="utf-8").splitlines()]
    for row in rows:
        if row.get("step") == 20 and row.get("split", "train") == "train":
            row["grad_norm"] = SPIKE
    run.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return run


def test_run_view_charts_have_round_ticks_a_legend_beside_marked_evals_and_ignore_one_spike(tmp_path):
    root = tmp_path / "runs"
    run = spiked_run(root)

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="history")
            app.push_screen(RunViewScreen(run.id))
            await wait_for(pilot, lambda: isinstance(app.screen, RunViewScreen) and app.screen.loaded, what="run view")
            view = app.screen
            await pilot.pause(0.2)
            loss, grad = view.query_one("#chart-loss", MetricChart), view.query_one("#chart-grad", MetricChart)
            assert isinstance(loss, CompareChart)  # one chart module for the run view and compare
            await wait_for(pilot, lambda: loss.points_drawn and grad.points_drawn, what="the charts drawn")
            # round ticks: whole steps at an even spacing, not 1.0 10.8 20.5
            ticks = loss.x_ticks
            assert ticks and all(t == int(t) for t in ticks)
            assert len({b - a for a, b in zip(ticks, ticks[1:], strict=False)}) == 1 and (ticks[1] - ticks[0]) % 5 == 0
            text = screen_text(app)
            assert "10.8" not in text and "20.5" not in text
            # the legend is on the title line, beside the plot, not drawn over the curves
            assert "loss  ⠤ train  • eval" in text
            assert "⢕⢕ train" not in text and "⢕⢕ eval" not in text
            eval_line = next(line for line in loss.lines if line.label == "eval")
            assert eval_line.points and eval_line.marker == "•"  # evals are marked points
            # one spike does not set the axis: the curve around 1.0 keeps the chart's height
            low, high = grad.y_limits
            assert high < 10 < SPIKE and low > 0
            assert max(grad.series[0][1].ys) == SPIKE  # the data keeps it; only the view leaves it out

    asyncio.run(scenario())


@pytest.mark.slow  # over ~5 s on 2 cores
def test_compare_shows_as_many_charts_as_stay_readable_and_pages_to_the_others(runs_root, tmp_path):
    from tuiapp.core.store.runs import RunStore
    from tuiapp.ui.screens.compare import CompareScreen
    from tuiapp.ui.widgets.pane_deck import PaneDeck

    ids = [RunStore(runs_root).get(name).id for name in ("sft", "high-lr", "baseline")]

    def shown(screen) -> list[str]:
        return [p.title for p in screen.query_one(PaneDeck).panes if p.display and not p.has_class("-offpage")]

    async def scenario(size, per_page):
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="history")
            app.open_compare(ids)
            await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded, 20, what="compare")
            screen = app.screen
            await pilot.pause(0.3)
            assert shown(screen)[:2] == ["Loss", "Eval loss"][:per_page] and len(shown(screen)) == per_page
            loss = screen.query_one("#cmp-chart-loss", CompareChart)
            assert loss.size.height >= 10  # eight charts at once left each plot 2 rows high at 120x36
            if per_page < len(screen.query_one(PaneDeck).panes):
                if per_page > 1:  # the tabs say what else there is: every pane's key on the tab row
                    row = next(line for line in screen_text(app).splitlines() if " 1 Loss " in line)
                    keys = range(2, len(screen.query_one(PaneDeck).panes) + 1)
                    assert all(re.search(rf"(?<!\d){key}(?!\d)", row) for key in keys), row
                await pilot.press("7")
                await pilot.pause(0.2)
                assert "Summary" in shown(screen) and "Loss" not in shown(screen)  # its page
                await pilot.press("1")
                await pilot.pause(0.2)
                assert shown(screen)[0] == "Loss"

    asyncio.run(scenario((120, 36), 4))  # 2 x 2
    asyncio.run(scenario((160, 48), 5))  # 3 x 2: the five charts; the tables take whole rows, on the next page
    asyncio.run(scenario((80, 24), 1))  # tabs, one at a time
