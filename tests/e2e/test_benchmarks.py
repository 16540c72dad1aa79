"""Benchmarks through the real lm-eval package on the demo task (demo:facts-mc, local files): scored
at each evaluation of a real tiny run, shown by the history's and compare's view models, the run
view's pane and `llmtui show`; `llmtui eval --benchmark` on the finished run's checkpoints, final
model and base. One shared run (tests/after_runs.py)."""

import json
import shutil

import pytest

from tests.after_runs import BENCH_EVERY, BENCH_STEPS, bench_run, verdict_judge_run
from tests.e2e.helpers import llmtui, metrics
from tuiapp.core.run_folder import benchmarks
from tuiapp.core.run_folder.rundata import columns_cache, read_run_data
from tuiapp.core.store.runs import Run
from tuiapp.ui.comparing import bench_series, has_benchmarks, load_compare_run
from tuiapp.ui.history import row_from_record, with_metrics
from tuiapp.ui.run_panes import samples_text
from tuiapp.ui.widgets.runs_table import cells

pytestmark = pytest.mark.slow
KEY = "bench/llmtui_facts_mc/acc"


def test_scores_at_each_eval_in_history_compare_run_view_and_show(tmp_path_factory):
    path = bench_run(tmp_path_factory)
    rows = [r for r in metrics(path) if r.get("split") == "eval"]
    assert [r["step"] for r in rows] == [BENCH_EVERY, BENCH_STEPS]
    assert all(0.0 <= r[KEY] <= 1.0 and r["bench_s"] > 0 for r in rows), rows
    assert all("eval_loss" in r for r in rows)  # the same row as the evaluation's loss

    run = Run(path).load()
    row = with_metrics(row_from_record(path, run.record, {}), run.metrics())
    assert row.bench == {"llmtui_facts_mc": rows[-1][KEY]}
    assert cells(row, 0.0)["bench"] == f"llmtui_facts_mc {rows[-1][KEY]:.3g}"

    compared = load_compare_run(path)
    assert has_benchmarks(run.record.recipe)
    assert list(bench_series(compared.data).ys) == [r[KEY] for r in rows]
    assert compared.row.bench == row.bench

    data, _ = read_run_data(run.metrics_path, columns_cache(path))
    assert f"bench llmtui_facts_mc acc: step {BENCH_EVERY}: {rows[0][KEY]:.4f}" in samples_text(data)

    shown = llmtui("show", path.name, runs_dir=path.parent, check=True).stdout
    assert f"bench     llmtui_facts_mc: acc {rows[-1][KEY]:.4f} (last eval)" in shown


def test_eval_benchmark_on_checkpoints_final_and_base(tmp_path_factory, tmp_path):
    source = bench_run(tmp_path_factory)
    path = tmp_path / source.name
    shutil.copytree(source, path)
    done = llmtui("eval", path.name, "--benchmark", "demo:facts-mc", "--checkpoints", "all", "--limit", "8",
                  "--json", runs_dir=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert [(m["model"], m["step"]) for m in result["models"]] == [
        (f"checkpoint-{BENCH_EVERY}", BENCH_EVERY), (f"checkpoint-{BENCH_STEPS}", BENCH_STEPS),
        ("final", BENCH_STEPS), ("base", 0)]
    for model in result["models"]:
        assert 0.0 <= model["scores"]["llmtui_facts_mc"]["acc"] <= 1.0
    saved = benchmarks.latest(path)
    assert saved["path"] == result["path"] and saved["models"] == result["models"]
    table = benchmarks.table(saved)
    assert table[0].split()[:4] == ["model", "step", "llmtui_facts_mc", "acc"] and len(table) == 5
    shown = llmtui("show", path.name, runs_dir=tmp_path, check=True).stdout
    assert "llmtui eval --benchmark:" in shown and "base" in shown
    # a task YAML that is not there is refused before any model loads
    bad = llmtui("eval", path.name, "--benchmark", "nowhere/task.yaml", runs_dir=tmp_path)
    assert bad.returncode == 2 and "task YAML not found" in bad.stderr


def test_judge_against_the_base_with_a_served_run_as_judge(tmp_path_factory, tmp_path):
    """A tiny judge trained to prefer answer A (tests/after_runs.py), served by `llmtui serve`, judges the
    bench run's answers against its base's: every verdict is valid, and as the run's answer is A on even
    prompts and B on odd ones, it wins half; the win rate and its interval are recorded and shown."""
    import socket

    from tuiapp.core.store import served

    source, judge_source = bench_run(tmp_path_factory), verdict_judge_run(tmp_path_factory)
    path, judge = tmp_path / source.name, tmp_path / judge_source.name
    shutil.copytree(source, path)
    shutil.copytree(judge_source, judge)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        started = llmtui("serve", judge.name, "--port", str(port), runs_dir=tmp_path, timeout=300)
        assert started.returncode == 0, started.stdout + started.stderr
        done = llmtui("eval", path.name, "--judge", judge.name, "--limit", "4", "--json", runs_dir=tmp_path,
                      timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)
        summary = result["summary"]
        assert result["mode"] == "pairwise" and result["against"] == "base" and result["prompts"] == 4
        assert [item["run_is"] for item in result["items"]] == ["A", "B", "A", "B"]
        assert [item["verdict"] for item in result["items"]] == ["A"] * 4, result["items"]
        assert [item["outcome"] for item in result["items"]] == ["win", "loss", "win", "loss"]
        assert (summary["n"], summary["valid"], summary["invalid"], summary["win"], summary["loss"]) == (4, 4, 0, 2, 2)
        low, high = summary["win_rate_ci95"]
        assert summary["win_rate"] == 0.5 and low < 0.5 < high
        saved = json.loads(open(result["path"]).read())
        assert saved["summary"] == summary and str(path / "judge") in result["path"]
        text = llmtui("eval", path.name, "--judge", f"http://localhost:{port}/v1", "--judge-mode", "single",
                      "--limit", "2", runs_dir=tmp_path, timeout=600)
        assert text.returncode == 0, text.stderr[-3000:]
        assert "mean rating" in text.stdout and "saved " in text.stdout  # "A" is no rating: counted invalid
        shown = llmtui("show", path.name, runs_dir=tmp_path, check=True).stdout
        assert "judge     rated by" in shown and "mean rating" in shown  # the latest: the single-answer one
    finally:
        served.stop(judge, grace_s=5)
    # a run that is not served is refused before any model loads
    refused = llmtui("eval", path.name, "--judge", judge.name, runs_dir=tmp_path)
    assert refused.returncode == 2 and "is not served" in refused.stderr
