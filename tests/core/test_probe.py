"""Micro-batch by probing, the pure part: sizes, the pick, probe.json, the estimate's error line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuiapp.core.common.errors import RecipeError, UserError
from tuiapp.core.config.recipe import parse_recipe
from tuiapp.core.plan import estimate, probe
from tuiapp.core.prelaunch import door
from tuiapp.core.store.runs import RunStore

MB = 1024**2


def recipe(extra: str = "", kind: str = "lora"):
    return parse_recipe(f'[method]\nkind = "{kind}"\n{extra}')


def write_rows(folder: Path, rows: list[dict], limit: int = 1000 * MB) -> None:
    (folder / probe.PROBE_DIR).mkdir(parents=True, exist_ok=True)
    lines = [{"kind": "device", "device": "cpu", "limit_bytes": limit}] + rows
    (folder / probe.PROBE_DIR / probe.ROWS_FILE).write_text("".join(json.dumps(r) + "\n" for r in lines))


def row(size: int, peak_mb: int, status: str = "ok") -> dict:
    return {"micro_batch": size, "status": status, "peak_bytes": peak_mb * MB, "measured_bytes": (peak_mb - 500) * MB,
            "tokens_per_s": 100.0 * size, "step_s": 0.1}


def test_recipe_takes_auto_and_refuses_other_words_and_zero():
    assert recipe('[train]\nmicro_batch = "auto"').train.micro_batch == "auto"
    assert recipe("[train]\nmicro_batch = 3").train.micro_batch == 3
    with pytest.raises(RecipeError, match="at least 1, or 'auto'") as zero:
        recipe("[train]\nmicro_batch = 0")
    assert zero.value.key == "train.micro_batch" and zero.value.line == 4
    with pytest.raises(RecipeError, match="should be 'auto'"):
        recipe('[train]\nmicro_batch = "big"')


def test_sizes_double_up_to_the_cap():
    assert probe.candidate_sizes(8) == [1, 2, 4, 8]
    assert probe.candidate_sizes(12) == [1, 2, 4, 8, 12]
    assert probe.candidate_sizes(1) == [1]
    assert probe.candidate_sizes(16, min_size=2) == [2, 4, 8, 16]


def test_sizes_of_memory_parse_with_units():
    assert probe.parse_bytes("512MiB") == 512 * MB
    assert probe.parse_bytes("1.5GB") == int(1.5 * 1024**3)
    assert probe.parse_bytes("4096") == 4096
    with pytest.raises(UserError, match="not a size"):
        probe.parse_bytes("lots")
    with pytest.raises(UserError, match="above 0"):
        probe.parse_bytes("0GB")


def test_the_pick_is_the_largest_size_under_the_budget():
    rows = [row(1, 600), row(2, 700), row(4, 900), row(8, 1300, "over")]
    assert probe.choose(rows, 950 * MB) == 4
    assert probe.choose(rows, 650 * MB) == 1
    assert probe.choose(rows, 500 * MB) is None
    assert probe.choose([row(1, 600), row(2, 0, "oom")], 10_000 * MB) == 1


def test_finish_records_the_pick_with_predicted_and_measured(tmp_path):
    write_rows(tmp_path, [row(1, 600), row(2, 700), row(4, 950), row(8, 1300, "over")])
    result = probe.finish(recipe('[train]\nmicro_batch = "auto"'), tmp_path, 0, started=0.0)
    assert result.chosen == 2  # 950 MB is over 1000 MB less 10% headroom
    data = probe.read(tmp_path)
    assert data["chosen"] == 2 and data["budget_bytes"] == 900 * MB
    assert data["measured_bytes"] == 200 * MB
    assert data["predicted_bytes"] == result.rows[1]["predicted_bytes"] > 0  # the tiny model's estimate
    assert result.rows[0]["predicted_bytes"] < result.rows[2]["predicted_bytes"]  # grows with the size
    table = probe.format_table(result)
    assert "<- chosen" in table.splitlines()[2] and "chosen: micro_batch = 2" in table


def test_finish_says_why_nothing_was_chosen(tmp_path):
    write_rows(tmp_path, [row(1, 2000, "over")])
    result = probe.finish(recipe(), tmp_path, 0, started=0.0)
    assert result.chosen is None and "even micro_batch 1 peaks at" in result.reason
    failed = tmp_path / "failed"
    failed.mkdir()
    result = probe.finish(recipe(), failed, 1, started=0.0)
    assert result.chosen is None and "failed (exit code 1)" in result.reason and "launcher.log" in result.reason


def test_the_chosen_size_is_frozen_into_the_run_recipe(tmp_path):
    auto = recipe('[train]\nmicro_batch = "auto"\nmax_micro_batch = 8')
    (tmp_path / "recipe.toml").write_text(auto.to_toml())
    chosen = probe.fix_micro_batch(tmp_path, auto, 4)
    assert chosen.train.micro_batch == 4 and auto.train.micro_batch == "auto"
    assert parse_recipe((tmp_path / "recipe.toml").read_text()).train.micro_batch == 4


def test_auto_is_refused_where_it_cannot_be_probed():
    assert probe.rules(recipe('[train]\nmicro_batch = "auto"')) == []
    assert probe.rules(recipe("[train]\nmicro_batch = 2", kind="dpo")) == []
    dpo = probe.rules(recipe('[train]\nmicro_batch = "auto"', kind="dpo"))
    assert [f.level for f in dpo] == ["error"] and "dpo" in dpo[0].message
    fsdp = probe.rules(recipe('[train]\nmicro_batch = "auto"\n[launch]\nstrategy = "fsdp"'))
    assert fsdp[0].level == "error" and fsdp[0].key == "train.micro_batch" and "fsdp" in fsdp[0].message
    nodes = probe.rules(recipe('[train]\nmicro_batch = "auto"\n[launch]\nhosts = ["a slots=1", "b slots=1"]'))
    assert any("multi-node" in f.message for f in nodes)


def test_kto_rule_copes_with_auto():
    kto = recipe('[train]\nmicro_batch = "auto"', kind="kto")
    assert any(f.key == "train.micro_batch" and "probes" in f.message for f in probe.rules(kto))


def test_the_probing_rank_is_one_deepspeed_rank(tmp_path):
    argv = probe.rank_argv(tmp_path / "r.toml", tmp_path, [1, 2, 4], 29555, limit_bytes=123, headroom=0.2)
    assert argv[0] == "env" and "RANK=0" in argv and "WORLD_SIZE=1" in argv and "MASTER_PORT=29555" in argv
    assert argv[argv.index("-m") + 1:argv.index("-m") + 3] == ["tuiapp.trainer.tools.probe", "--local_rank=0"]
    assert argv[argv.index("--sizes") + 1] == "1,2,4" and argv[argv.index("--limit") + 1] == "123"
    gpu = probe.rank_argv(tmp_path / "r.toml", tmp_path, [1], 29555, gpu_id=3)
    assert "CUDA_VISIBLE_DEVICES=3" in gpu


def test_default_limit_follows_the_environment(monkeypatch):
    monkeypatch.setenv(probe.DEVICE_MEMORY_ENV, "2GB")
    assert probe.default_limit(recipe(), cuda=0) == 2 * 1024**3
    monkeypatch.delenv(probe.DEVICE_MEMORY_ENV)
    one, two = probe.default_limit(recipe(), 0), probe.default_limit(recipe("[launch]\ngpus = 2"), 0)
    assert one > 0 and abs(one / 2 - two) <= 1
    assert probe.default_limit(recipe(), cuda=1) is None


def test_estimate_of_auto_picks_what_it_predicts_fits():
    config = estimate.load_model_config("meta-llama/Llama-3.2-1B")
    auto = recipe('[train]\nmicro_batch = "auto"\nmax_micro_batch = 64\nmax_seq_len = 2048')
    small = estimate.estimate_recipe(auto, config, n_gpus=1, gpu_memory_bytes=24 * 1024**3)
    big = estimate.estimate_recipe(auto, config, n_gpus=1, gpu_memory_bytes=80 * 1024**3)
    assert small.micro_batch_auto and 1 <= small.micro_batch <= big.micro_batch <= 64
    assert big.micro_batch > small.micro_batch
    assert "micro_batch auto (" in estimate.format_estimate(big)
    unknown = estimate.estimate_recipe(auto, config, n_gpus=1)
    assert unknown.micro_batch == 1 and unknown.fits is None


def test_estimate_reports_its_error_on_past_probed_runs(tmp_path):
    runs = tmp_path / "runs"
    for name, (measured, predicted) in {"a": (110, 100), "b": (300, 200), "c": (90, 100)}.items():
        (runs / name).mkdir(parents=True)
        (runs / name / probe.PROBE_FILE).write_text(json.dumps({"measured_bytes": measured, "predicted_bytes": predicted}))
    (runs / probe.PROBES_DIR / "p1").mkdir(parents=True)
    (runs / probe.PROBES_DIR / "p1" / probe.PROBE_FILE).write_text(json.dumps({"measured_bytes": 120, "predicted_bytes": 100}))
    (runs / "no-probe").mkdir()
    assert sorted(probe.past_ratios(runs)) == [0.9, 1.1, 1.2, 1.5]
    report = door.estimate_report(recipe(), RunStore(runs), base_dir=tmp_path)
    assert "median 1.15x over 4 probed runs" in report["text"]
    assert report["json"]["past_measured_over_predicted"] == {"median": pytest.approx(1.15), "runs": 4}
    assert "past runs" not in door.estimate_report(recipe(), RunStore(tmp_path / "empty"), base_dir=tmp_path)["text"]


def test_probe_command_refuses_what_it_cannot_probe_before_launching(tmp_path, capsys):
    from tuiapp.cli.main import main

    dpo = tmp_path / "dpo.toml"
    dpo.write_text('[model]\nname = "tiny"\n[method]\nkind = "dpo"\n[dataset]\nname = "demo:prefs"\n')
    assert main(["--runs-dir", str(tmp_path / "runs"), "probe", str(dpo)]) == 2
    assert "train.micro_batch" in capsys.readouterr().err
    assert not (tmp_path / "runs" / probe.PROBES_DIR).exists()
    lora = tmp_path / "lora.toml"
    lora.write_text('[model]\nname = "tiny"\n[method]\nkind = "lora"\n')
    assert main(["--runs-dir", str(tmp_path / "runs"), "probe", str(lora), "--memory-limit", "lots"]) == 2
    assert "--memory-limit 'lots' is not a size" in capsys.readouterr().err
