"""The history reads a long run's summary from its columns (metrics.columns, or the TUI's cache
of them): the same figures as from every JSON line, for finished and live runs."""

from __future__ import annotations

import math

import pytest
from ui_fixtures import real_runs, synthetic_run

from tuiapp.core.run_folder import columns
from tuiapp.core.run_folder.metrics import JsonlWriter, read_jsonl
from tuiapp.core.run_folder.rundata import SUMMARISE_MIN_BYTES, MetricsWriter, read_run_data
from tuiapp.ui.history import HistoryLoader, LiveSummary, with_metrics, with_run_data

FIGURES = ("step", "max_steps", "last_loss", "best_eval_loss", "best_accuracy", "best_margin", "reward",
           "tokens_per_s", "last_time", "losses", "step_times")


def same_figures(got, exact, where) -> None:
    for name in FIGURES:
        assert getattr(got, name) == getattr(exact, name), (where, name)
    if exact.peak_mem is None:
        assert got.peak_mem is None, where
    else:
        assert got.peak_mem == pytest.approx(exact.peak_mem, rel=1e-9), where


def preference_rows(count: int) -> list[dict]:
    out = []
    for step in range(1, count + 1):
        out.append({"step": step, "max_steps": count, "time": 1e9 + step, "loss": 0.7 - step / (2 * count),
                    "tokens": 100 * step, "tokens_per_s": 500.0 + step % 11,
                    "rewards/accuracies": 0.5 + 0.4 * math.sin(step / 9), "rewards/margins": step / count,
                    "mem": {"rank0": {"peak": 3e9 + step * 7}, "rank1": {"peak": 2.5e9}}})
        if step % 50 == 0:
            out.append({"split": "eval", "step": step, "eval_loss": 0.6, "eval_rewards/accuracies": 0.6 + step / 1e4})
    return out


def test_a_summary_from_columns_is_the_summary_of_every_line(tmp_path):
    root = tmp_path / "runs"
    runs = list(real_runs(root).values()) + [synthetic_run(root, "long", index=1, steps=600, eval_every=50)]
    dpo = synthetic_run(root, "pairs", index=2, method="dpo", steps=2, eval_every=0)
    dpo.metrics_path.unlink()
    with JsonlWriter(dpo.metrics_path) as writer:
        for row in preference_rows(700):
            writer.write(row)
    runs.append(dpo)
    loader = HistoryLoader(root)
    rows = {r.id: r for batch in loader.load_infos(loader.scan(), 100) for r in batch}
    for run in runs:
        records = read_jsonl(run.metrics_path)
        exact = with_metrics(rows[run.id], records)
        data, _ = read_run_data(run.metrics_path)
        same_figures(with_run_data(rows[run.id], data), exact, run.id)
        # a live run read in columns goes on from them: the same as one fed every line
        half = len(records) // 2
        ahead = tmp_path / "ahead" / run.id
        with MetricsWriter(ahead) as writer:
            for record in records[:half]:
                writer.write(record)
        data, _ = read_run_data(ahead / "metrics.jsonl")
        live, whole = LiveSummary.from_data(data), LiveSummary()
        live.add(records[half:])
        whole.add(records)
        for name in ("step", "max_steps", "last_loss", "best_eval_loss", "best_accuracy", "best_margin",
                     "tokens_per_s", "last_time", "step_times"):
            assert getattr(live.apply(rows[run.id]), name) == getattr(whole.apply(rows[run.id]), name), (run.id, name)
        assert len(live.apply(rows[run.id]).losses) <= 48


def long_run(root, index: int, status: str, rows: int):
    run = synthetic_run(root, f"long{index}", index=index, status=status, steps=2, eval_every=0)
    run.metrics_path.unlink()
    with MetricsWriter(run.path, every_rows=2000) as writer:
        for step in range(1, rows + 1):
            writer.write({"step": step, "max_steps": rows, "time": 1e9 + step, "loss": 2.0 - step / (2 * rows),
                          "lr": 1e-4, "tokens": 64 * step, "tokens_per_s": 900.0 + step % 5})
    assert run.metrics_path.stat().st_size >= SUMMARISE_MIN_BYTES
    return run


def test_the_history_reads_long_runs_in_columns_and_follows_live_ones(tmp_path):
    root = tmp_path / "runs"
    done = long_run(root, 1, "succeeded", 12_000)
    live = long_run(root, 2, "running", 12_000)
    old = long_run(root, 3, "succeeded", 12_000)
    columns.columns_path(old.path).unlink()  # an older llmtui's run: parsed once, then cached by the TUI
    loader = HistoryLoader(root)
    rows = {r.id: r for batch in loader.load_infos(loader.scan(), 100) for r in batch}
    for run in (done, live, old):
        got = loader.summarize(rows[run.id])
        same_figures(got, with_metrics(rows[run.id], read_jsonl(run.metrics_path)), run.id)
    assert columns.columns_cache(old.path).exists() and not columns.columns_cache(done.path).exists()
    assert live.id in loader.active
    with JsonlWriter(live.metrics_path) as writer:
        writer.write({"step": 12_001, "max_steps": 12_001, "time": 2e9, "loss": 0.25, "tokens": 1, "tokens_per_s": 5.0})
    [polled] = [r for r in loader.poll() if r.id == live.id]
    assert polled.step == 12_001 and polled.last_loss == 0.25 and polled.last_time == 2e9
