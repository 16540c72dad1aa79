"""An online RL run (grpo, rloo) is judged by its task's reward, not by the eval loss TRL logs on its
held-out prompts: the history, a sweep's ranking and table, the end-of-run alert and `llmtui runs`
show no best eval loss for it, and where they have a place for its headline, its task reward on the
held-out prompts (the eval rows' eval_rewards/<primary>/mean). A plain SFT run keeps its best eval."""

from __future__ import annotations

import json
from dataclasses import replace

from rl_fixtures import rl_run
from ui_fixtures import synthetic_run

from tuiapp.cli.main import main
from tuiapp.core.run_folder.metrics import JsonlWriter, read_jsonl
from tuiapp.core.run_folder.rundata import read_run_data
from tuiapp.core.store.runs import Run
from tuiapp.ui.alerts import run_alerts, sweep_alerts
from tuiapp.ui.comparing import load_compare_run
from tuiapp.ui.groups import build_groups, table_rows
from tuiapp.ui.history import HistoryLoader, LiveSummary, with_metrics, with_run_data
from tuiapp.ui.widgets.runs_table import cells

HELD_OUT = {3: 0.109, 6: 0.42, 9: 0.73}  # eval_rewards/answer/mean at each evaluation
GROUP = {"id": "g1", "name": "rl-sweep", "keys": ["train.learning_rate"]}


def graded_rl_run(root, name: str, *, index: int, status: str = "succeeded", method: str = "grpo", lr: float = 1e-5):
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
            if row["step"] in HELD_OUT:
                writer.write({"split": "eval", "step": row["step"], "time": row["time"] + 0.5,
                              "eval_loss": 0.001 * row["step"], "eval_reward": 1.5,
                              "eval_rewards/format/mean": 0.9, "eval_rewards/answer/mean": HELD_OUT[row["step"]]})
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

    # a sweep of RL runs: no run ranks by (or shows) its eval loss
    group = build_groups([rows["grpo-done"], rows["rloo-live"]], {}, set())["g1"]
    assert group.best is None and group.best_text() == "no eval loss yet"
    table = table_rows(group.runs, group.keys, group.metric, 0)
    assert [line[-1] for line in table] == ["", ""] and [line[0] for line in table] == ["-", "-"]

    # the alert of a run that ends: its held-out reward, not its eval loss
    [alert] = run_alerts({done.id: replace(rows["grpo-done"], status="running")}, [rows["grpo-done"]])
    assert alert.text == "grpo-done: succeeded · held out answer 0.730"
    [alert] = run_alerts({sft.id: replace(rows["sft-run"], status="running")}, [rows["sft-run"]])
    assert f"best eval loss {rows['sft-run'].best_eval_loss:.4f}" in alert.text
    ended = [replace(rows["rloo-live"], status="succeeded"), rows["grpo-done"]]
    [finished] = sweep_alerts(ended, {r.id: r for r in ended}, {})
    assert "eval loss 0.0" not in finished.text and finished.text.endswith("no eval loss yet")

    # `llmtui runs --json`
    assert main(["--runs-dir", str(root), "runs", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed["grpo-done"]["best_eval_loss"] is None and listed["rloo-live"]["best_eval_loss"] is None
    assert listed["sft-run"]["best_eval_loss"] == rows["sft-run"].best_eval_loss
