"""The UI's data layer without Textual: history rows, run series, form data, compare, tails.

Run folders are the real-run fixtures (tests/fixtures/runs, see ui_fixtures.py) except where a
test says SYNTHETIC."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ui_fixtures import FIXED_NOW, REAL_IDS, real_rows, real_runs, synthetic_run

from tuiapp.core.common.errors import RecipeError, RecipeErrors
from tuiapp.core.config.recipe import LoraMethod, Recipe, TrainSpec, load_recipe
from tuiapp.core.run_folder.metrics import JsonlWriter
from tuiapp.core.run_folder.rundata import RunData
from tuiapp.core.run_folder.runstate import is_stalled
from tuiapp.core.run_folder.tail import TextTail, log_sources
from tuiapp.ui import formdata
from tuiapp.ui.comparing import config_rows, flatten, load_compare_run, x_values
from tuiapp.ui.history import HistoryLoader, LiveSummary, with_metrics
from tuiapp.ui.history_model import HistoryModel


def test_ui_never_imports_torch_or_the_trainer():
    code = (
        "import sys, tuiapp.ui.app, tuiapp.ui.screens.home, tuiapp.ui.screens.run_view, "
        "tuiapp.ui.screens.new_experiment, tuiapp.ui.screens.compare, tuiapp.ui.screens.help;"
        "bad = [m for m in ('torch', 'transformers', 'deepspeed', 'tuiapp.trainer', 'peft') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_history_loader_reads_rows_and_summaries(tmp_path):
    root = tmp_path / "runs"
    runs = real_runs(root)
    loader = HistoryLoader(root)
    batches = list(loader.load_infos(loader.scan(), batch=4))
    assert [len(b) for b in batches] == [4, 3]
    rows = [r for b in batches for r in b]
    assert rows[0].name == "live"  # newest first
    by_name = {r.name: loader.summarize(r) for r in rows}
    assert by_name["baseline"].step == 40 and by_name["baseline"].max_steps == 40
    best = {name: min(r["eval_loss"] for r in real_rows(name, "eval")) for name in ("baseline", "high-lr")}
    assert by_name["high-lr"].best_eval_loss == best["high-lr"] and by_name["baseline"].best_eval_loss == best["baseline"]
    assert by_name["crashed"].status == "failed" and by_name["halted"].status == "stopped"
    assert by_name["stuck"].stalled(FIXED_NOW) and not by_name["live"].stalled(FIXED_NOW)
    assert len(by_name["baseline"].losses) <= 48
    assert set(loader.active) == {runs["live"].id, runs["stuck"].id}
    # a live run writes a new row: the next poll reports it
    step = real_rows("live")[-1]["step"]
    with JsonlWriter(runs["live"].metrics_path) as writer:
        writer.write({"step": step + 1, "max_steps": 200, "loss": 0.5, "time": FIXED_NOW})
    changed = loader.poll()
    assert [r.name for r in changed] == ["live"] and changed[0].step == step + 1
    assert loader.poll() == []


def test_history_model_filters_sorts_and_marks(tmp_path):
    root = tmp_path / "runs"
    real_runs(root)
    loader = HistoryLoader(root)
    model = HistoryModel(lambda: FIXED_NOW)
    model.add([loader.summarize(r) for b in loader.load_infos(loader.scan(), 100) for r in b])
    assert len(model.visible) == 7
    model.status_filter = "stalled"
    model.invalidate()
    assert [r.name for r in model.visible] == ["stuck"]
    model.status_filter, model.method_filter = "", "lora"
    model.invalidate()
    assert {r.name for r in model.visible} == {"baseline", "high-lr", "live"}
    model.method_filter, model.text_filter = "", "HIGH"
    model.invalidate()
    assert [r.name for r in model.visible] == ["high-lr"]
    model.text_filter = ""
    model.sort_by("last_loss")
    losses = [r.last_loss for r in model.visible]
    assert losses == sorted(losses)
    model.sort_by("last_loss")  # again: descending
    assert [r.last_loss for r in model.visible] == sorted(losses, reverse=True)
    model.sort_by("name", reverse=False)
    assert [r.name for r in model.visible][:2] == ["baseline", "crashed"]
    model.toggle_mark(model.visible[0].id)
    model.toggle_mark(model.visible[1].id)
    model.toggle_mark(model.visible[0].id)
    assert model.marked == [model.visible[1].id]


def test_is_stalled():
    times = [0.0, 1.0, 2.0, 3.0]
    assert not is_stalled(times, 30.0)
    assert is_stalled(times, 100.0)
    assert not is_stalled(times[:2], 1000.0)


def test_rundata_dedupes_a_resumed_run():
    data = RunData()
    data.extend([{"step": s, "loss": 10 - s, "lr": 0.1, "time": s, "max_steps": 10} for s in range(1, 6)])
    data.extend([{"split": "eval", "step": 4, "eval_loss": 3.0, "samples": [{"prompt": "p", "output": "o"}]}])
    # resumed from the step-3 checkpoint: steps 4 and 5 are written again
    data.extend([{"step": s, "loss": 100 + s, "lr": 0.1, "time": 10 + s, "max_steps": 10} for s in (4, 5, 6)])
    assert list(data.loss.xs) == [1, 2, 3, 4, 5, 6]
    assert list(data.loss.ys) == [9, 8, 7, 104, 105, 106]
    assert len(data.eval_loss) == 0  # the eval at step 4 belonged to the abandoned branch
    assert data.samples == [{"prompt": "p", "output": "o"}]
    data.extend([{"step": 7, "loss": "nan", "time": 20}])
    assert data.nonfinite_loss and len(data.loss) == 6


def test_form_defaults_are_a_valid_recipe_and_roundtrip():
    check = formdata.check_values(formdata.default_values("lora"), "lora")
    assert check.errors == [] and check.recipe == Recipe(method=LoraMethod())
    recipe = Recipe(name="x", method=LoraMethod(rank=4, target_modules=["q_proj", "v_proj"]),
                    train=TrainSpec(sample_prompts=["hi \"there\""], learning_rate=3e-5),
                    dataset={"name": "demo:chat", "columns": {"prompt": "q"}, "eval_split": 0.1},
                    launch={"gpus": [0, 1], "zero_stage": 2})
    values = formdata.values_from_recipe(recipe)
    assert formdata.check_values(values, "lora").recipe == recipe


def test_form_errors_are_the_ones_validate_prints(tmp_path):
    values = formdata.default_values("qlora")
    values["train.learning_rate"] = "fast"
    values["launch.gpus"] = "0"
    check = formdata.check_values(values, "qlora", "recipes/run.toml")
    assert {e.key for e in check.errors} == {"train.learning_rate", "launch.gpus"}
    path = tmp_path / "recipes" / "run.toml"
    path.parent.mkdir()
    path.write_text(check.toml, encoding="utf-8")
    try:
        load_recipe(path)
    except (RecipeErrors, RecipeError) as exc:
        from_file = [str(e) for e in getattr(exc, "errors", [exc])]
    assert [s.replace(str(path), "recipes/run.toml") for s in from_file] == [str(e) for e in check.errors]


def test_compare_series_and_config(tmp_path):
    root = tmp_path / "runs"
    runs = real_runs(root)
    a, b = load_compare_run(runs["baseline"].path), load_compare_run(runs["high-lr"].path)
    assert len(a.metric("loss")) == 40
    tokens = {r["step"]: r["tokens"] for r in real_rows("baseline")}  # tokens seen, as the trainer counted
    assert x_values(a.data, a.metric("loss").xs, "tokens") == list(tokens.values())
    assert x_values(a.data, a.metric("eval_loss").xs, "tokens") == [tokens[10], tokens[20], tokens[30], tokens[40]]
    assert x_values(a.data, a.metric("loss").xs, "relative")[-1] == 100.0
    times = [r["time"] for r in real_rows("baseline")]
    assert x_values(a.data, a.metric("loss").xs, "time") == [t - times[0] for t in times]
    assert a.row.step == 40 and a.row.last_loss == real_rows("baseline")[-1]["loss"]
    keys = [k for k, _ in config_rows([a.recipe, b.recipe])]
    assert keys == ["name", "train.learning_rate"]
    assert len(config_rows([a.recipe, b.recipe], only_differing=False)) > 30
    assert flatten({"a": {"b": 1, "c": {}}}) == {"a.b": 1, "a.c": {}}


def test_compare_x_values_skip_rows_without_tokens():
    data = RunData()
    data.extend([{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5, "tokens": 100}, {"split": "eval", "step": 2, "eval_loss": 1.0}])
    xs = x_values(data, data.loss.xs, "tokens")
    assert xs[0] != xs[0] and xs[1] == 100.0  # NaN: no x for the row without tokens
    assert x_values(data, data.eval_loss.xs, "tokens") == [100.0]


def test_text_tail(tmp_path):
    path = tmp_path / "log.txt"
    path.write_bytes(b"a" * 100 + b"\nfirst\nsecond\npart")
    tail = TextTail(path, initial_bytes=20)
    lines, reset = tail.read_new()
    assert reset and lines == ["first", "second"]  # the cut line is dropped, the partial waits
    with open(path, "ab") as handle:
        handle.write(b"ial\nprogress 1\rprogress 2\n")
    assert tail.read_new() == (["partial", "progress 2"], False)
    path.write_bytes(b"new\n")  # truncated: start again
    assert tail.read_new() == (["new"], True)
    assert TextTail(tmp_path / "missing").read_new() == ([], False)


def test_log_sources(tmp_path):
    run = real_runs(tmp_path / "runs", ["crashed"])["crashed"]  # 2 ranks: DeepSpeed's <start>_rank<N>.log
    stamp = REAL_IDS["crashed"][:8]
    labels = [label for label, _ in log_sources(run.path)]
    assert labels[0] == "stdout" and len(labels) == 3
    assert labels[1].startswith(f"ranks/{stamp}") and labels[1].endswith("_rank0.log") and labels[2].endswith("_rank1.log")
    for name in ("phase-0.json", "memory-0.json", "stack-0.txt"):  # what a live rank writes beside its log
        (run.path / "ranks" / name).write_text("{}")
    labels = [label for label, _ in log_sources(run.path)]
    assert len(labels) == 4 and labels[-1] == "ranks/stack-0.txt"


def test_synthetic_rows_match_the_real_trainer_format(tmp_path):
    """The SYNTHETIC helper writes rows with the keys (and nesting) of the real trainer's rows."""
    run = synthetic_run(tmp_path / "runs", "x", index=1, steps=3, eval_every=3)
    rows = [json.loads(line) for line in Path(run.metrics_path).read_text().splitlines()]
    real_train, real_eval = real_rows("sft")[0], real_rows("sft", "eval")[0]
    assert set(rows[0]) <= set(real_train) and set(rows[0]["mem"]["rank0"]) <= set(real_train["mem"]["rank0"])
    assert rows[-1]["split"] == "eval" and set(rows[-1]) <= set(real_eval)
    assert set(rows[-1]["samples"][0]) == set(real_eval["samples"][0])


def test_system_sampler_falls_back_to_psutil():
    from tuiapp.ui.system import SystemSampler

    sampler = SystemSampler()
    try:
        sample = sampler.sample()
    finally:
        sampler.close()
    assert sample.ram_total and sample.ram_used and sample.cpu_percent is not None
    assert sample.source in ("nvml", "psutil")


def test_system_sampler_reads_nvml_gpus():
    from tuiapp.core.plan.launcher import cuda_device_count
    from tuiapp.ui.system import SystemSampler

    if cuda_device_count() == 0:
        import pytest

        pytest.skip("no NVIDIA GPU visible to NVML")
    sampler = SystemSampler()
    try:
        sample = sampler.sample()
    finally:
        sampler.close()
    assert sample.source == "nvml" and sample.gpus and sample.gpus[0].total > 0


def test_launch_is_refused_by_preflight_errors(tmp_path, monkeypatch):
    from tuiapp.core.config.recipe import QloraMethod
    from tuiapp.core.lifecycle import service
    from tuiapp.ui import actions

    monkeypatch.setenv("LLMTUI_FORCE_CPU", "1")
    recipe = Recipe(name="q", method=QloraMethod())
    try:
        actions.launch(recipe, tmp_path / "runs", tmp_path)
    except service.LaunchRefused as exc:
        assert "error" in str(exc)
    else:
        raise AssertionError("a QLoRA run on a CPU-only machine must be refused")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_check_form_reports_findings(tmp_path):
    from tuiapp.ui import actions

    values = formdata.default_values("lora")
    values["dataset.name"] = "missing.jsonl"
    report = actions.check_form(values, "lora", tmp_path / "runs", tmp_path)
    assert report.check.errors == [] and report.has_errors
    assert "dataset not found" in report.findings
    values["dataset.name"] = "demo:facts"
    report = actions.check_form(values, "lora", tmp_path / "runs", tmp_path)
    assert not report.has_errors and report.estimate


def test_live_summary_matches_the_full_summary(tmp_path):
    """Every real run, and a SYNTHETIC 600-step one (more steps than the sparkline keeps)."""
    from tuiapp.core.run_folder.metrics import read_jsonl

    root = tmp_path / "runs"
    runs = list(real_runs(root).values()) + [synthetic_run(root, "long", index=1, steps=600, eval_every=50)]
    base = HistoryLoader(root)
    rows = {r.id: r for batch in base.load_infos(base.scan(), 100) for r in batch}
    for run in runs:
        records = read_jsonl(run.metrics_path)
        live, chunk = LiveSummary(), 7 if len(records) < 100 else 37  # rows as polls bring them
        for start in range(0, len(records), chunk):
            live.add(records[start:start + chunk])
        exact, incremental = with_metrics(rows[run.id], records), live.apply(rows[run.id])
        for name in ("step", "max_steps", "last_loss", "best_eval_loss", "tokens_per_s", "peak_mem", "last_time", "step_times"):
            assert getattr(incremental, name) == getattr(exact, name), (run.name, name)
        assert len(incremental.losses) <= 48 and incremental.losses[0] == exact.losses[0]


def test_columns_cache_of_a_long_run_is_used_extended_and_dropped_when_the_file_changes(tmp_path):
    from tuiapp.core.run_folder.rundata import COLUMNS_MIN_RECORDS, read_run_data

    metrics, cache = tmp_path / "metrics.jsonl", tmp_path / ".cache" / "run.bin"
    rows = [{"step": s, "loss": 3.0 - s / 1e4, "tokens": s * 10, "time": 1000.0 + s, "mem": {"rank0": {"peak": 2e9}}}
            for s in range(1, COLUMNS_MIN_RECORDS + 1)]
    rows.insert(50, {"split": "eval", "step": 50, "eval_loss": 2.5, "samples": [{"prompt": "p", "output": "o"}]})
    with JsonlWriter(metrics) as writer:
        for row in rows:
            writer.write(row)
    first, read = read_run_data(metrics, cache)
    assert cache.exists() and read.offset == metrics.stat().st_size
    made = cache.stat().st_mtime_ns
    again, reader = read_run_data(metrics, cache)  # from the cache: the same data, nothing rewritten
    assert cache.stat().st_mtime_ns == made and list(again.loss.ys) == list(first.loss.ys)
    assert list(again.tokens) == list(first.tokens) and list(again.memory["rank0"].ys) == [2.0] * COLUMNS_MIN_RECORDS
    assert again.evals == [(50, [{"prompt": "p", "output": "o"}])] and again.last_train["step"] == COLUMNS_MIN_RECORDS
    with JsonlWriter(metrics) as writer:  # the file grows: only the new line is parsed
        writer.write({"step": COLUMNS_MIN_RECORDS + 1, "loss": 0.5})
    grown, _ = read_run_data(metrics, cache)
    assert len(grown.loss) == COLUMNS_MIN_RECORDS + 1 and grown.loss.ys[-1] == 0.5
    metrics.write_text("".join(line.replace('"loss":', '"loss":1') + "\n" for line in metrics.read_text().splitlines()))
    rewritten, _ = read_run_data(metrics, cache)  # other bytes where the cache was made: read whole
    assert rewritten.loss.ys[0] != first.loss.ys[0]


def test_cached_columns_of_removed_runs_are_pruned(tmp_path):
    from tuiapp.ui.comparing import columns_cache, prune_columns_cache

    root = tmp_path / "runs"
    kept = root / "20250101-000001-kept-0001"
    kept.mkdir(parents=True)
    for run_id in (kept.name, "20250101-000002-gone-0002"):
        path = columns_cache(root / run_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    assert prune_columns_cache(root) == 1
    assert [p.name for p in (root / ".cache" / "columns").iterdir()] == [f"{kept.name}.bin"]
    assert prune_columns_cache(tmp_path / "nowhere") == 0


def test_a_finished_runs_columns_are_summarised_once_for_the_compare(tmp_path):
    from tuiapp.core.run_folder.rundata import SUMMARISE_MIN_BYTES, columns_cache, read_run_data, summarise_run

    run = tmp_path / "runs" / "20250101-000001-long-0001"
    run.mkdir(parents=True)
    rows = [{"step": s, "time": 1e9 + s, "loss": 3.0 - s * 1e-5, "lr": 1e-4, "tokens": 512 * s} for s in range(1, 15_001)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert (run / "metrics.jsonl").stat().st_size >= SUMMARISE_MIN_BYTES
    summarise_run(run)
    made = columns_cache(run).stat().st_ino
    data, _ = read_run_data(run / "metrics.jsonl", columns_cache(run))
    assert columns_cache(run).stat().st_ino == made  # read from the columns: nothing parsed, nothing rewritten
    assert len(data.loss) == 15_000 and data.loss.ys[-1] == rows[-1]["loss"]

    short = tmp_path / "runs" / "20250101-000002-short-0002"
    short.mkdir()
    (short / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:100]))
    summarise_run(short)
    summarise_run(tmp_path / "runs" / "missing")
    assert not columns_cache(short).exists()
