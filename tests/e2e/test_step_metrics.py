"""What every metrics row carries on the DeepSpeed CPU path, from real runs: a finite grad_norm
(ZeRO-0 fp32 drops it otherwise), each rank's memory (written per rank, no gather), the exact
non-padding token count (counted per rank, summed once per log), and no checkpoints/ folder when
the run saves none."""

import math

import pytest

from tests.e2e.helpers import llmtui, metrics, only_run, run_info

pytestmark = pytest.mark.slow


def _train_rows(run_dir):
    return [r for r in metrics(run_dir) if r.get("split", "train") == "train"]


def test_two_ranks_zero0_rows_carry_grad_norm_memory_and_exact_tokens(runs_dir):
    result = llmtui("run", "recipes/quickstart.toml", "--set", "launch.zero_stage=0", "--set", "train.max_steps=0",
                    "--set", "train.epochs=1", "--set", "dataset.max_samples=144", "--set", "dataset.eval_split=0",
                    "--set", "train.eval_steps=0", "--set", "train.save_steps=0", "--set", "train.packing=false",
                    "--set", "train.micro_batch=4", runs_dir=runs_dir)
    run_dir = only_run(runs_dir)
    assert result.returncode == 0, result.stdout + (run_dir / "stdout.log").read_text()[-4000:]
    assert run_info(run_dir)["ranks"] == 2
    rows = _train_rows(run_dir)
    assert len(rows) == 17  # 136 examples kept / (4 x 2 ranks): no batch is filled up with repeats
    for row in rows:
        assert isinstance(row["grad_norm"], float) and math.isfinite(row["grad_norm"]) and row["grad_norm"] > 0, row
        assert set(row["mem"]) == {"rank0", "rank1"}, row["mem"]
    assert {p.name for p in (run_dir / "ranks").glob("memory-*.json")} == {"memory-0.json", "memory-1.json"}
    assert not (run_dir / "checkpoints").exists()

    # one epoch sees every training example once: the count is the sum of their lengths
    from tuiapp.core.config.recipe import parse_recipe
    from tuiapp.trainer.dataset.data import build_datasets
    from tuiapp.trainer.models.bundled import resolve_model_path
    from tuiapp.trainer.models.model import cache_dir, load_tokenizer

    recipe = parse_recipe((run_dir / "recipe.toml").read_text(), "recipe.toml")
    tokenizer = load_tokenizer(resolve_model_path(recipe.model.name), False)
    train_set, _ = build_datasets(recipe, tokenizer, cache_dir())
    assert len(train_set) == 136
    tokens = [r["tokens"] for r in rows]
    assert tokens == sorted(tokens) and tokens[-1] == sum(len(ids) for ids in train_set["input_ids"])
