"""Compare screen (Pilot, at 80x24 and 120x36) on the real-run fixtures: smoothing, log scale,
x axes, zoom, the cursor's side table, hiding a run, a run followed live, the legend beside the
plot, the default range of runs of different lengths; and the pure helpers behind them."""

from __future__ import annotations

import asyncio
import math

import pytest
from textual.widgets import DataTable
from ui_fixtures import FIXED_NOW, real_rows, screen_text, test_app, wait_for

from tuiapp.core.run_folder.metrics import JsonlWriter, read_jsonl
from tuiapp.core.store.runs import Run, RunStore
from tuiapp.ui.comparing import default_x_range, ema, nice_ticks, robust_limits, sample_rows, tick_label, value_at
from tuiapp.ui.screens.compare import CompareScreen
from tuiapp.ui.widgets.charts import CompareChart
from tuiapp.ui.widgets.pane_deck import tab_labels

SIZES = [(80, 24), (120, 36)]
SIZE_IDS = ["80x24", "120x36"]
SLOW = pytest.mark.slow  # Pilot tests of a few seconds each on 2 busy cores: the fast tier keeps one


async def open_compare(pilot, root, names: list[str]) -> CompareScreen:
    app = pilot.app
    await wait_for(pilot, lambda: app.screen.loaded, what="history")
    app.push_screen(CompareScreen([RunStore(root).get(name).id for name in names]))
    await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded, what="compare")
    await pilot.pause()
    return app.screen


def loss_chart(screen) -> CompareChart:
    return screen.query_one("#cmp-chart-loss", CompareChart)


@pytest.mark.parametrize("size", [SIZES[0], pytest.param(SIZES[1], marks=SLOW)], ids=SIZE_IDS)
def test_smoothing_log_scale_axes_zoom_and_cursor(runs_root, tmp_path, size):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_compare(pilot, runs_root, ["baseline", "high-lr"])
            chart = loss_chart(screen)
            losses = [r["loss"] for r in real_rows("baseline")]
            assert [line.label for line in chart.lines] == ["baseline", "high-lr"]
            assert list(chart.lines[0].ys) == losses and list(chart.lines[0].xs) == list(range(1, 41))
            assert chart.lines[0].marker != chart.lines[1].marker  # a glyph of its own per run
            # smoothing: s steps the EMA weight up, S down; the plotted series is the debiased EMA
            await pilot.press("s", "s")
            assert screen.smoothing_weight == 0.6 and chart.lines[0].ys == pytest.approx(ema(losses, 0.6))
            assert chart.lines[0].ys[0] == pytest.approx(losses[0])  # debiased: no pull towards 0
            assert "0.6" in screen_text(app)
            await pilot.press("S", "S")
            assert list(chart.lines[0].ys) == losses
            # log scale
            await pilot.press("l")
            assert chart.view.log_y and chart.y_limits is None
            await pilot.press("l")
            assert not chart.view.log_y
            # round, whole-number ticks by step
            await pilot.pause()
            assert chart.x_ticks and all(t == int(t) for t in chart.x_ticks) and chart.x_ticks[-1] == 40
            # x axes: tokens, wall time, percent of each run, back to step
            tokens = [r["tokens"] for r in real_rows("baseline")]
            await pilot.press("x")
            assert screen.axis == "tokens" and list(chart.lines[0].xs) == tokens and chart.x_label == "tokens"
            await pilot.press("x")
            times = [r["time"] for r in real_rows("baseline")]
            assert screen.axis == "time" and chart.x_label.startswith("wall time")
            unit = 60.0 if chart.x_label.endswith("(min)") else 1.0
            assert chart.lines[0].xs == pytest.approx([(t - times[0]) / unit for t in times])
            await pilot.press("x")
            assert screen.axis == "relative" and chart.lines[0].xs[-1] == 100.0
            await pilot.press("x")
            assert screen.axis == "step"
            # the cursor: left moves it; the side table reads each run's value there
            assert screen.cursor_x() == 40  # at the end until moved
            await pilot.press("left", "left", "left")
            assert screen.cursor_x() == 37  # one step a key
            values = screen.cursor_values("loss")
            assert values["baseline"] == losses[36] and values["high-lr"] == real_rows("high-lr")[36]["loss"]
            assert f"{losses[36]:.4g}" in screen_text(app)  # in the side table
            # zoom in around the cursor, then reset
            await pilot.press("plus")
            low, high = chart.view.x_range
            assert high - low == pytest.approx(20) and low <= 37 <= high
            await pilot.press("plus")
            assert chart.view.x_range[1] - chart.view.x_range[0] == pytest.approx(10)
            await pilot.press("0")
            assert chart.view.x_range == (0.0, 40)

    asyncio.run(scenario())


@SLOW
@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_hide_show_legend_beside_the_plot_and_short_runs_not_squeezed(runs_root, tmp_path, size):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_compare(pilot, runs_root, ["stuck", "baseline", "sft"])  # 400-step run (26 rows written) and two 40-step runs
            chart = loss_chart(screen)
            legend = screen.query_one("#cmp-legend")
            assert legend.region.x >= chart.region.right  # the legend is outside the plot
            text = screen_text(app)
            for run in screen.runs:
                assert f"{run.marker} {run.label}" in text
            assert len({run.marker for run in screen.runs}) == 3
            # hide the second run (down picks it), show it again
            await pilot.press("down", "h")
            assert [line.label for line in chart.lines] == ["stuck", "sft"]
            assert "hidden" in screen_text(app)
            await pilot.press("h")
            assert [line.label for line in chart.lines] == ["stuck", "baseline", "sft"]

    asyncio.run(scenario())


@pytest.mark.parametrize("size", [SIZES[0], pytest.param(SIZES[1], marks=SLOW)], ids=SIZE_IDS)
def test_a_zoomed_chart_keeps_its_legend_beside_the_plot(runs_root, tmp_path, size):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_compare(pilot, runs_root, ["baseline", "high-lr"])
            chart = loss_chart(screen)
            before = chart.region
            await pilot.press("z")  # the loss chart fills the screen
            await pilot.pause()
            assert screen.maximized is not None and chart.region.height > before.height
            legend = screen.query_one("#cmp-zoom-legend")
            assert legend.display and legend.region.width and legend.region.x >= chart.region.right
            text = screen_text(app)
            values = screen.cursor_values()
            for run in screen.runs:  # each run's glyph, name and value at the cursor
                assert f"{run.marker} {run.label}" in text and f"{values[run.label]:.4g}" in text
            assert "Loss at step 40" in text
            await pilot.press("left")
            assert "Loss at step 39" in screen_text(app)  # it follows the cursor while zoomed
            await pilot.press("z")
            await pilot.pause()
            assert screen.maximized is None and not legend.display
            await pilot.press("6", "z")  # a table zoomed: no chart legend beside it
            await pilot.pause()
            assert screen.maximized is not None and not legend.display

    asyncio.run(scenario())


@SLOW
def test_default_range_clips_a_much_longer_run_and_zoom_out_shows_it_whole(tmp_path):
    from ui_fixtures import synthetic_run

    root = tmp_path / "runs"
    synthetic_run(root, "long", index=1, steps=400)
    synthetic_run(root, "short", index=2, steps=40)

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_compare(pilot, root, ["long", "short"])
            chart = loss_chart(screen)
            assert chart.view.x_range == (0.0, 40)  # the 40-step run keeps the chart's width
            assert "of 400" in chart.view.note
            await pilot.press("minus", "minus", "minus", "minus")
            assert chart.view.x_range == (0.0, 400)
            await pilot.press("0")
            assert chart.view.x_range == (0.0, 40)

    asyncio.run(scenario())


@SLOW
def test_a_running_run_grows_and_finishes_while_compared(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path)  # live: the screen follows the runs
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_compare(pilot, runs_root, ["live", "baseline"])
            chart = loss_chart(screen)
            live = screen.runs[0]
            rows = real_rows("live")
            assert len(chart.lines[0].xs) == len(rows)
            step = rows[-1]["step"]
            with JsonlWriter(live.path / "metrics.jsonl") as writer:
                writer.write({"step": step + 1, "max_steps": 200, "loss": 0.5, "lr": 1e-4, "tokens": 99999, "time": FIXED_NOW})
                writer.write({"step": step + 2, "max_steps": 200, "loss": 0.25, "lr": 1e-4, "tokens": 99999 + 50, "time": FIXED_NOW + 1})
            await wait_for(pilot, lambda: len(loss_chart(screen).lines[0].xs) == len(rows) + 2, what="new points")
            assert chart.lines[0].ys[-1] == 0.25 and screen.cursor_values("loss")["live"] == 0.25  # the cursor follows the end
            assert screen.runs[0].row.step == step + 2
            run = Run(live.path).load()
            run.record.set(status="succeeded", ended=FIXED_NOW)
            run.save()
            await wait_for(pilot, lambda: screen.runs[0].row.status == "succeeded", what="the new status")
            await pilot.press("7")  # the summary pane
            await pilot.pause()
            assert "succeeded" in screen_text(app)

    asyncio.run(scenario())


def test_summary_flags_a_stalled_run_and_one_that_stalls_while_compared(runs_root, tmp_path):
    """The summary's status is the history's: `stuck` (its rank frozen) says stalled, and `live`
    turns stalled when no step comes for minutes, though nothing in its folder changes."""
    now = [FIXED_NOW]

    def statuses(screen) -> dict[str, str]:
        table = screen.query_one("#cmp-summary", DataTable)
        return {run.label: str(table.get_row(run.id)[1]) for run in screen.runs}

    async def scenario():
        app = test_app(runs_root, tmp_path, clock=lambda: now[0])
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_compare(pilot, runs_root, ["live", "stuck"])
            assert statuses(screen) == {"live": "running", "stuck": "stalled"}
            now[0] += 600
            await wait_for(pilot, lambda: statuses(screen)["live"] == "stalled", what="live flagged stalled")

    asyncio.run(scenario())


@SLOW
@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_config_keeps_its_key_column_and_samples_side_by_side(runs_root, tmp_path, size):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_compare(pilot, runs_root, ["baseline", "sft"])
            table = screen.query_one("#cmp-config")
            assert table.fixed_columns == 1
            await pilot.press("8")  # the samples pane
            await pilot.pause()
            prompt = real_rows("sft", "eval")[0]["samples"][0]["prompt"]
            rows = sample_rows(screen.runs)
            assert [step for step, _, _ in rows][:1] == [10] and rows[0][1] == prompt
            sft_prompts = [s["prompt"] for s in real_rows("sft", "eval")[0]["samples"]]
            for step in (10, 20, 30, 40):  # both runs' answers at every eval, each prompt once per step
                assert sorted(p for s, p, answers in rows if s == step and answers[1] is not None) == sorted(sft_prompts)
                assert [p for s, p, answers in rows if s == step and answers[0] is not None] == [real_rows("baseline", "eval")[0]["samples"][0]["prompt"]]
            assert "What is the" in screen_text(app)

    asyncio.run(scenario())


@SLOW
def test_grad_norm_and_eval_curves(tmp_path):
    from ui_fixtures import synthetic_run

    root = tmp_path / "runs"
    run = synthetic_run(root, "plain", index=1, steps=30)
    with JsonlWriter(run.path / "metrics.jsonl") as writer:
        for step in range(31, 41):
            writer.write({"step": step, "max_steps": 40, "loss": 1.0, "grad_norm": 0.5 + step / 100, "tokens": step * 100})

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_compare(pilot, root, ["plain"])
            await pilot.press("5")  # grad norm: on the second page of panes at 120x36
            await pilot.pause(0.2)
            grad = screen.query_one("#cmp-chart-grad-norm", CompareChart)
            assert list(grad.lines[0].xs)[-10:] == list(range(31, 41)) and grad.points_drawn > 0
            evals = screen.query_one("#cmp-chart-eval-loss", CompareChart)
            assert len(evals.lines[0].xs) == 3  # evals every 10 steps of the first 30

    asyncio.run(scenario())


def test_online_rl_runs_get_task_and_total_reward_charts(tmp_path):
    """An online RL run among the compared ones adds two charts: the task's reward (its answer reward,
    or the one marked primary) and the weighted total, which a format reward can lift alone; a run
    without an answer reward charts its total in both. Runs of other methods alone get neither. The
    summary leaves their (TRL) eval loss out of `best eval` and shows the task's reward on the held-out
    prompts instead."""
    from rl_fixtures import rl_run
    from ui_fixtures import synthetic_run

    root = tmp_path / "runs"
    graded = rl_run(root, "grpo-a", steps=6, rewards=[0.1, 0.2, 0.4, 0.6, 0.8, 0.9])
    rl_run(root, "rloo-b", method="rloo", steps=4, index=1, rewards=[0.0, 0.1, 0.1, 0.3])
    synthetic_run(root, "plain", index=2, steps=5)
    loaded = Run(graded.path).load()
    recipe = dict(loaded.record.recipe)
    recipe["method"] = {**recipe["method"], "rewards": [{"kind": "format", "pattern": "x"},
                                                        {"kind": "answer", "column": "answer"}]}
    loaded.record.set(recipe=recipe)
    loaded.save()
    rows = read_jsonl(graded.metrics_path)  # the answer reward apart from the format one
    graded.metrics_path.unlink()
    with JsonlWriter(graded.metrics_path) as writer:
        for row in rows:
            writer.write({**row, "rewards/answer/mean": row["step"] / 100})
            if row["step"] % 3 == 0:  # TRL's eval rows: an eval loss that says nothing, and the held-out rewards
                writer.write({"split": "eval", "step": row["step"], "eval_loss": 0.01 * row["step"],
                              "eval_reward": 1.0, "eval_rewards/answer/mean": row["step"] / 10})

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_compare(pilot, root, ["grpo-a", "rloo-b"])
            total = screen.query_one("#cmp-chart-reward", CompareChart)
            task = screen.query_one("#cmp-chart-task-reward", CompareChart)
            await wait_for(pilot, lambda: len(total.lines) == 2 and len(task.lines) == 2)
            assert [list(line.ys) for line in total.lines] == [[0.1, 0.2, 0.4, 0.6, 0.8, 0.9], [0.0, 0.1, 0.1, 0.3]]
            assert [list(line.ys) for line in task.lines] == [[0.01, 0.02, 0.03, 0.04, 0.05, 0.06],
                                                              [0.0, 0.1, 0.1, 0.3]]  # rloo-b: no answer reward
            titles = {key: title for key, (title, _) in screen.chart_metrics().items()}
            assert titles["task_reward"] == "Task reward" and titles["reward"] == "Total reward"
            table = screen.query_one("#cmp-summary", DataTable)
            headers = [str(column.label) for column in table.columns.values()]
            summary = {run.label: dict(zip(headers, map(str, table.get_row(run.id)), strict=True)) for run in screen.runs}
            assert summary["grpo-a"]["best eval"] == "-" and summary["grpo-a"]["held out"] == "0.600"
            assert summary["rloo-b"]["held out"] == "-"  # no eval rows
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_compare(pilot, root, ["plain"])
            assert not {"reward", "task_reward"} & set(screen.chart_metrics())
            assert not screen.query("#cmp-chart-reward") and not screen.query("#cmp-chart-task-reward")

    asyncio.run(scenario())


@pytest.mark.parametrize("size", [(80, 24), pytest.param((120, 36), marks=SLOW)])
def test_every_tab_stays_on_screen_with_its_key_and_p_reaches_the_tenth_pane(tmp_path, size):
    """Ten panes (two RL runs) do not fit their titles in the tab row: each tab keeps its number (the
    tenth, which has no digit, an ellipsis), the current one its title; p reaches the tenth (Samples)."""
    from rl_fixtures import rl_run

    root = tmp_path / "runs"
    rl_run(root, "grpo-a", steps=6)
    rl_run(root, "rloo-b", method="rloo", steps=4, index=1)

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_compare(pilot, root, ["grpo-a", "rloo-b"])
            await pilot.press("1")
            await pilot.pause(0.2)
            row = next(line for line in screen_text(app).splitlines() if " 1 Loss " in line)
            assert all(f" {key} " in row or row.rstrip().endswith(f" {key}") for key in [*"23456789", "…"]), row
            await pilot.press("9", "p")
            await pilot.pause(0.2)
            assert screen.query_one("PaneDeck").active_id == "cmp-samples-pane"
            assert " Samples " in next(line for line in screen_text(app).splitlines() if " 1 " in line)

    asyncio.run(scenario())


def test_tab_labels_keep_the_active_title_and_the_first_ones_that_fit():
    titles = ["Loss", "Eval loss", "Learning rate", "Tokens/s", "Grad norm", "Task reward", "Total reward",
              "Config", "Summary", "Samples"]
    assert tab_labels(titles[:3], 0, 80) == ["1 Loss", "2 Eval loss", "3 Learning rate"]
    narrow = tab_labels(titles, 6, 60)
    assert narrow[:2] == ["1 Loss", "2 Eval loss"] and narrow[6] == "7 Total reward" and narrow[9] == "…"
    assert narrow[2:6] == ["3", "4", "5", "6"] and sum(len(label) + 2 for label in narrow) <= 60
    assert tab_labels(titles, 9, 200)[9] == "Samples"  # no digit for the tenth


# ------------------------------------------------------------------ pure helpers


def test_ema_is_debiased_and_numpy_agrees_with_python(monkeypatch):
    values = [math.sin(i / 7) + i / 50 for i in range(500)]
    fast = ema(values, 0.9)
    import tuiapp.ui.comparing as comparing

    monkeypatch.setattr(comparing, "numpy_module", lambda: None)
    slow = ema(values, 0.9)
    assert fast == pytest.approx(slow, abs=1e-9)
    assert ema([2.0, 4.0], 0.5) == [2.0, pytest.approx((0.5 * 2 * 0.5 + 0.5 * 4) / 0.75)]
    assert ema(values, 0.0) == values


def test_ticks_limits_ranges_and_values():
    assert nice_ticks(0, 40, 4, integer=True) == [0, 10, 20, 30, 40]
    assert all(t == int(t) for t in nice_ticks(0, 7, 10, integer=True))  # never 1.75 steps
    assert nice_ticks(0.0, 1.0, 5) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert [tick_label(t, 10) for t in (0, 10, 20)] == ["0", "10", "20"] and tick_label(120000) == "120k"
    speeds = [1000.0 + i % 7 for i in range(60)] + [90000.0]  # one spike
    low, high = robust_limits(speeds, robust=True)
    assert high < 1100 and low > 900
    assert robust_limits(speeds, robust=False)[1] > 90000
    assert default_x_range([40, 40, 400]) == (0.0, 40)  # the 400-step run does not squeeze the others
    assert default_x_range([40, 60]) == (0.0, 60)
    assert value_at([1, 2, 3], [5.0, 6.0, 7.0], 2.5) == (2, 6.0) and value_at([1], [5.0], 0.5) is None


def test_summary_shows_a_mixtures_tokens_per_source(runs_root, tmp_path):
    """A run that mixes sources gets a `tokens per source` column in the summary; the others a dash."""
    with JsonlWriter(RunStore(runs_root).get("live").path / "metrics.jsonl") as writer:
        writer.write({"step": 999, "max_steps": 1000, "loss": 0.5, "lr": 1e-4, "tokens": 4000, "time": FIXED_NOW,
                      "tokens/facts": 3000, "tokens/chat": 1000})

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_compare(pilot, runs_root, ["live", "baseline"])
            table = screen.query_one("#cmp-summary", DataTable)
            cells = {run.label: str(table.get_cell(run.id, "sources")) for run in screen.runs}
            assert cells == {"live": "facts 3,000 (75%) · chat 1,000 (25%)", "baseline": "-"}

    asyncio.run(scenario())


def test_config_names_a_sources_keys_by_index():
    from tuiapp.ui.comparing import config_rows

    one = {"dataset": {"sources": [{"name": "demo:facts", "weight": 3.0}, {"name": "demo:chat", "weight": 1.0}]}}
    other = {"dataset": {"sources": [{"name": "demo:facts", "weight": 1.0}, {"name": "demo:chat", "weight": 1.0}]}}
    assert config_rows([one, other]) == [("dataset.sources.0.weight", [3.0, 1.0])]
