"""A mixture of two sources trains with real ranks, and every train row carries each source's
tokens so far (tokens/<label>), which add up to the row's token total; a mixture by tokens chains
from that run (`model.name = "run:NAME"`), and a sweep varies a source's weight."""

import pytest

from tests.e2e.helpers import kill_group, llmtui, metrics, only_run, run_info, stop_after
from tuiapp.core.run_folder.metrics import dedupe_steps

pytestmark = pytest.mark.slow


def test_a_two_source_mixture_trains_on_two_ranks_and_logs_tokens_per_source(runs_dir):
    result = llmtui("run", "recipes/tiny-mixture.toml", "--set", "launch.gpus=2", "--set", "train.max_steps=12",
                    "--set", "train.logging_steps=2", "--set", "train.eval_steps=6", "--set", "train.save_steps=0",
                    "--set", "train.micro_batch=4", runs_dir=runs_dir)
    run_dir = only_run(runs_dir)
    assert result.returncode == 0, result.stdout + (run_dir / "stdout.log").read_text()[-4000:]
    info = run_info(run_dir)
    assert info["ranks"] == 2 and info["dataset"] == "mix(facts:3, chat:1)"
    rows = metrics(run_dir)
    train = [r for r in rows if r.get("split", "train") == "train"]
    assert [r["step"] for r in train] == [1, 2, 4, 6, 8, 10, 12]
    for row in train:
        assert row["tokens/facts"] + row["tokens/chat"] == row["tokens"], row
    last = train[-1]
    assert last["tokens/facts"] > 0 and last["tokens/chat"] > 0
    assert [r["tokens/facts"] for r in train] == sorted(r["tokens/facts"] for r in train)
    assert any(r.get("split") == "eval" and r.get("eval_loss") is not None for r in rows)  # the sources' held-out
    shown = llmtui("show", run_dir.name, runs_dir=runs_dir, check=True).stdout
    assert f"sources   facts {last['tokens/facts']:,}" in shown and "· chat " in shown

    # chained: a mixture by tokens, from the first run's model, one rank
    result = llmtui("run", "recipes/tiny-mixture.toml", "--set", 'model.name="run:tiny-mixture"', "--set",
                    'name="mix-chained"', "--set", 'dataset.mix_by="tokens"', "--set", "train.max_steps=4",
                    "--set", "train.logging_steps=2", "--set", "train.eval_steps=0", "--set", "train.save_steps=0",
                    "--set", "launch.gpus=1", runs_dir=runs_dir)
    chained = next(p for p in runs_dir.iterdir() if p.is_dir() and p.name != run_dir.name and p.name[0] != ".")
    assert result.returncode == 0, result.stdout + (chained / "stdout.log").read_text()[-4000:]
    assert run_info(chained)["model_ref"] == "run:tiny-mixture"
    rows = [r for r in metrics(chained) if r.get("split", "train") == "train"]
    assert rows and all(r["tokens/facts"] + r["tokens/chat"] == r["tokens"] for r in rows)


def test_a_sweep_varies_a_sources_weight(runs_dir):
    result = llmtui("sweep", "recipes/tiny-mixture.toml", "--grid", "dataset.sources.0.weight=1,3", "--dry-run",
                    runs_dir=runs_dir, check=True)
    assert "2 runs, varying dataset.sources.0.weight" in result.stdout


def test_a_stopped_then_resumed_mixture_keeps_its_tokens_per_source_adding_up(runs_dir):
    llmtui("run", "recipes/tiny-mixture.toml", "--set", "train.max_steps=12", "--set", "train.logging_steps=1",
           "--set", "train.eval_steps=0", "--set", "train.save_steps=0", "--set", "launch.gpus=1", "--detach",
           runs_dir=runs_dir, check=True)
    run_dir = only_run(runs_dir)
    try:
        code, output = stop_after(run_dir, 3, runs_dir)
        assert code == 0, output
        [checkpoint] = (run_dir / "checkpoints").glob("checkpoint-*")
        assert 3 <= int(checkpoint.name.split("-")[1]) < 12
        resumed = llmtui("resume", run_dir.name, runs_dir=runs_dir, timeout=600)
        assert resumed.returncode == 0, resumed.stdout + (run_dir / "stdout.log").read_text()[-4000:]
    finally:
        kill_group(run_dir)
    rows = dedupe_steps([r for r in metrics(run_dir) if r.get("split", "train") == "train"])
    assert [r["step"] for r in rows] == list(range(1, 13))
    for row in rows:
        assert row["tokens/facts"] + row["tokens/chat"] == row["tokens"], row
