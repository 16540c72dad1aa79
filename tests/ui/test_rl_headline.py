"""An online RL run (grpo, rloo) is judged by its task's reward, not by the eval loss TRL logs on its
held-out prompts: the history, a sweep's ranking and table, the end-of-run alert and `llmtui runs`
show no best eval loss for it, and where they have a place for its headline, its task reward on the
held-out prompts (the eval rows' eval_rewards/<primary>/mean). A plain SFT run keeps its best eval."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from rl_fixtures import rl_run
from ui_fixtures import screen_text, synthetic_run, test_app, wait_for

from tuiapp.cli.main import main
from tuiapp.core.run_folder.metrics import JsonlWriter, read_jsonl
from tuiapp.core.run_folder.rundata import read_run_data
from tuiapp.core.store.runs import Run, RunStore
from tuiapp.ui.alerts import run_alerts, sweep_alerts
from tuiapp.ui.comparing import load_compare_run
from tuiapp.ui.groups import build_groups, rank_runs, shade, table_rows
from tuiapp.ui.history import HistoryLoader, LiveSummary, with_metrics, with_run_data
from tuiapp.ui.history_model import GROUP_SORT_KEYS
from tuiapp.ui.screens.compare import CompareScreen
from tuiapp.ui.screens.group import GroupScreen
from tuiapp.ui.widgets.charts import CompareChart
from tuiapp.ui.widgets.runs_table import cells, group_cells

HELD_OUT = {3: 0.109, 6: 0.42, 9: 0.73}  # eval_rewards/answer/mean at each evaluation
GROUP = {"id": "g1", "name": "rl-sweep", "keys": ["train.learning_rate"]}


def graded_rl_run(root, name: str, *, index: int, status: str = "succeeded", method: str = "grpo", lr: float = 1e-5,
                  held_out: dict[int, float] = HELD_OUT):
    """An RL run whose recipe has an answer reward (its headline) and whose metrics.jsonl has TRL's eval
    rows every third step: eval_loss (low, and meaningless) beside the held-out rewards; one of a sweep."""
    run = rl_run(root, name, method=method, steps=9, status=status, index=index)
    loaded = Run(run.path).load()
    recipe = dict(loaded.record.recipe)
    recipe["method"] = {**recipe["method"], "rewards": [{"kind": "format", "pattern": "x"},
                                                        {"kind": "answer", "column": "answer"}]}
    loaded.record.set(recipe=recipe, group={**GROUP, "index": index, "values": {"train.learning_rate": lr}})
    loaded.save()
    rows = read_jsonl(run.metrics_path)
    run.metrics_path.unlink()
    with JsonlWriter(run.metrics_path) as writer:
        for row in rows:
            writer.write(row)
            if row["step"] in held_out:
                writer.write({"split": "eval", "step": row["step"], "time": row["time"] + 0.5,
                              "eval_loss": 0.001 * row["step"], "eval_reward": 1.5,
                              "eval_rewards/format/mean": 0.9, "eval_rewards/answer/mean": held_out[row["step"]]})
    return run


def test_rl_runs_show_their_held_out_reward_and_no_best_eval_loss(tmp_path, capsys):
    root = tmp_path / "runs"
    done = graded_rl_run(root, "grpo-done", index=1)
    live = graded_rl_run(root, "rloo-live", index=2, status="running", method="rloo", lr=3e-5)
    sft = synthetic_run(root, "sft-run", method="sft", index=3, steps=20, eval_every=10)
    loader = HistoryLoader(root)
    infos = {r.name: r for batch in loader.load_infos(loader.scan(), 10) for r in batch}
    rows = {name: loader.summarize(row) for name, row in infos.items()}

    # the history's row, every way it is read: every line, in columns, live (from lines or from columns)
    for name, run in (("grpo-done", done), ("rloo-live", live)):
        info = infos[name]
        assert rows[name].best_eval_loss is None and rows[name].held_out == 0.73, name
        assert rows[name].held_out_text() == "held out answer 0.730"
        data, _ = read_run_data(run.metrics_path)
        for got in (with_metrics(info, read_jsonl(run.metrics_path)), with_run_data(info, data)):
            assert (got.best_eval_loss, got.held_out) == (None, 0.73), name
        records = read_jsonl(run.metrics_path)
        fed = LiveSummary()
        fed.add(records)
        ahead = LiveSummary.from_data(read_run_data(run.metrics_path)[0])
        for summary in (fed, ahead):
            assert (summary.apply(info).best_eval_loss, summary.apply(info).held_out) == (None, 0.73), name
        assert cells(rows[name], 0)["best_eval"] == ""
    assert rows["sft-run"].best_eval_loss is not None and rows["sft-run"].held_out is None
    assert cells(rows["sft-run"], 0)["best_eval"] == f"{rows['sft-run'].best_eval_loss:.4f}"

    # a live run's next evaluation moves its held-out reward, and still no eval loss
    with JsonlWriter(live.metrics_path) as writer:
        writer.write({"step": 10, "max_steps": 10, "time": 2e9, "loss": 0.1, "reward": 1.0, "rewards/answer/mean": 0.5})
        writer.write({"split": "eval", "step": 10, "eval_loss": 0.0001, "eval_rewards/answer/mean": 0.81})
    [polled] = [r for r in loader.poll() if r.name == "rloo-live"]
    assert polled.best_eval_loss is None and polled.held_out == 0.81

    # compare reads the run in columns (comparing.summary_row)
    compared = load_compare_run(done.path).row
    assert compared.best_eval_loss is None and compared.held_out == 0.73

    # a sweep of RL runs: no run ranks by (or shows) its eval loss; their held-out reward ranks them
    group = build_groups([rows["grpo-done"], rows["rloo-live"]], {}, set())["g1"]
    assert group.metric == "held_out" and group.best_text() == "best held-out reward 0.7300 · learning_rate=1e-05"
    table = table_rows(group.runs, group.keys, group.metric, 0)
    assert [line[-1] for line in table] == ["0.7300", "0.7300"] and [line[0] for line in table] == ["1", "2"]

    # the alert of a run that ends: its held-out reward, not its eval loss
    [alert] = run_alerts({done.id: replace(rows["grpo-done"], status="running")}, [rows["grpo-done"]])
    assert alert.text == "grpo-done: succeeded · held out answer 0.730"
    [alert] = run_alerts({sft.id: replace(rows["sft-run"], status="running")}, [rows["sft-run"]])
    assert f"best eval loss {rows['sft-run'].best_eval_loss:.4f}" in alert.text
    ended = [replace(rows["rloo-live"], status="succeeded"), rows["grpo-done"]]
    [finished] = sweep_alerts(ended, {r.id: r for r in ended}, {})
    assert "eval loss" not in finished.text and finished.text.endswith("best held-out reward 0.7300 · learning_rate=1e-05")

    # `llmtui runs --json`
    assert main(["--runs-dir", str(root), "runs", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["grpo-done"]["best_eval_loss"] is None and listed["rloo-live"]["best_eval_loss"] is None
    assert listed["sft-run"]["best_eval_loss"] == rows["sft-run"].best_eval_loss


def test_a_sweep_of_rl_runs_ranks_by_held_out_reward_and_compare_charts_it_in_place_of_eval_loss(tmp_path):
    """Two grpo runs of one sweep: the one whose answer reward on the held-out prompts ends higher ranks
    first (though its eval loss is lower: it ranks nothing), the group screen says what it ranks by, the
    heat map's shades run the same way; comparing them charts that reward where the eval loss was."""
    root = tmp_path / "runs"
    low = graded_rl_run(root, "grpo-low", index=1, lr=1e-5, held_out={3: 0.2, 6: 0.3, 9: 0.35})
    high = graded_rl_run(root, "grpo-high", index=2, lr=3e-5, held_out={3: 0.1, 6: 0.5, 9: 0.9})
    loader = HistoryLoader(root)
    rows = [loader.summarize(r) for batch in loader.load_infos(loader.scan(), 10) for r in batch]
    group = build_groups(rows, {}, set())["g1"]
    assert group.metric == "held_out" and [r.name for r in rank_runs(group.runs, group.metric)] == ["grpo-high", "grpo-low"]
    assert group.best.name == "grpo-high" and group.best_text() == "best held-out reward 0.9000 · learning_rate=3e-05"
    assert shade(0.9, [0.35, 0.9], "held_out") == "█" and shade(0.35, [0.35, 0.9], "held_out") == "░"
    # the history's sweep line before any evaluation, and its sort by the best value: the better sweep first
    assert group_cells(replace(group, runs=[]))[2] == "no held-out reward yet"
    worse = replace(group, group_id="g2", runs=[group.runs[0] if group.runs[0].name == "grpo-low"
                                                       else group.runs[1]])
    assert worse.best_value == 0.35 and group.best_value == 0.9
    by_best = GROUP_SORT_KEYS["best_eval"]
    assert sorted([worse, group], key=lambda g: by_best(g, 0.0))[0] is group

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="history")
            app.open_group("g1")
            await wait_for(pilot, lambda: isinstance(app.screen, GroupScreen) and app.screen.loaded, what="group")
            screen = app.screen
            assert [r.id for r in screen.ranked] == [high.id, low.id]
            text = screen_text(app)
            assert "ranked by held-out reward · best held-out reward 0.9000 · learning_rate=3e-05" in text
            assert "held-out reward ▲" in text and "best eval" not in text  # the ranked column says what it is
            lines = [line.split() for line in text.splitlines()]
            assert ["1", "3e-05", "✓", "succeeded", "9/9"] == next(line for line in lines if line[:1] == ["1"])[:5]
            assert lines[[line[:1] for line in lines].index(["1"])][-1] == "0.9000"
            assert lines[[line[:1] for line in lines].index(["2"])][-1] == "0.3500"
            await pilot.press("c")
            compare = app.screen
            assert isinstance(compare, CompareScreen)
            await wait_for(pilot, lambda: compare.loaded, what="compare")
            assert list(compare.chart_metrics())[:2] == ["loss", "held_out"]
            assert compare.chart_metrics()["held_out"][0] == "Held-out reward" and not compare.query("#cmp-chart-eval-loss")
            chart = compare.query_one("#cmp-chart-held-out", CompareChart)
            await wait_for(pilot, lambda: len(chart.lines) == 2, what="the held-out chart")
            assert [(list(line.xs), list(line.ys)) for line in chart.lines] == [([3, 6, 9], [0.1, 0.5, 0.9]),
                                                                               ([3, 6, 9], [0.2, 0.3, 0.35])]

    asyncio.run(scenario())


def test_compare_leaves_rl_runs_out_of_the_eval_loss_chart_and_a_mixed_sweep_ranks_by_eval_loss(tmp_path):
    """A grpo run compared with an SFT run: the Eval loss chart draws the SFT run's evaluations and none of
    the grpo run's (TRL's eval loss, which it logged); no held-out chart then. A sweep that mixes them (it
    should not happen) ranks by eval loss as before: the grpo run unranked, last."""
    root = tmp_path / "runs"
    graded_rl_run(root, "grpo-run", index=1)
    sft = synthetic_run(root, "sft-run", method="sft", index=2, steps=20, eval_every=10)
    loader = HistoryLoader(root)
    rows = {r.name: loader.summarize(r) for batch in loader.load_infos(loader.scan(), 10) for r in batch}
    mixed = [rows["grpo-run"], replace(rows["sft-run"], group={**GROUP, "index": 2, "values": {"train.learning_rate": 2e-5}})]
    group = build_groups(mixed, {}, set())["g1"]
    assert group.metric == "eval_loss" and [r.name for r in rank_runs(group.runs, group.metric)] == ["sft-run", "grpo-run"]
    assert [line[0] for line in table_rows(group.runs, group.keys, group.metric, 0)] == ["1", "-"]

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="history")
            app.open_compare([RunStore(root).get("grpo-run").id, sft.id])
            await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.loaded, what="compare")
            compare = app.screen
            assert "held_out" not in compare.chart_metrics()
            chart = compare.query_one("#cmp-chart-eval-loss", CompareChart)
            await wait_for(pilot, lambda: len(chart.lines) == 2, what="the eval loss chart")
            drawn = {line.label: list(line.xs) for line in chart.lines}
            assert drawn == {"grpo-run": [], "sft-run": [10, 20]}

    asyncio.run(scenario())
