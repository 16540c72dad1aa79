"""train.optimizer through the real launcher: a Muon run (recipes/tiny-muon.toml) trains, its run
view and compare's config diff name the optimizer; one that cannot run here is refused before launch."""

import pytest
import tomllib

from tests.e2e.helpers import llmtui, metrics, only_run, run_info
from tuiapp.core.machine.gpus import cuda_available

pytestmark = pytest.mark.slow  # real `llmtui` processes


def test_tiny_muon_preset_trains_and_is_named(tmp_path):
    from tuiapp.core.run_folder.rundata import RunData
    from tuiapp.core.run_folder.rundir import RunRecord
    from tuiapp.ui.comparing import config_rows
    from tuiapp.ui.run_panes import status_text

    result = llmtui("run", "recipes/tiny-muon.toml", "--set", "train.max_steps=10", "--set", "train.eval_steps=0",
                    "--set", "train.micro_batch=4", "--set", "train.max_seq_len=64", runs_dir=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = only_run(tmp_path)
    info = run_info(run_dir)
    assert info["status"] == "succeeded"
    losses = [r["loss"] for r in metrics(run_dir) if r.get("split", "train") == "train" and "loss" in r]
    assert len(losses) >= 8 and sum(losses[-2:]) < 0.9 * sum(losses[:2]), losses
    frozen = tomllib.loads((run_dir / "recipe.toml").read_text())
    assert frozen["train"]["optimizer"] == "muon"
    record = RunRecord(**{k: v for k, v in info.items() if k in RunRecord.__dataclass_fields__})
    assert "pretrain with muon on" in status_text(record, RunData(), now=0.0)
    adamw = {**frozen, "train": {**frozen["train"], "optimizer": "adamw"}}
    assert ("train.optimizer", ["muon", "adamw"]) in config_rows([frozen, adamw])


@pytest.mark.skipif(cuda_available(), reason="adamw_8bit is refused for the lack of CUDA")
def test_an_optimizer_that_cannot_run_here_is_refused_before_launch(tmp_path):
    result = llmtui("run", "recipes/tiny-muon.toml", "--set", "train.optimizer=adamw_8bit", runs_dir=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "train.optimizer" in result.stderr and "needs a CUDA GPU" in result.stderr
    assert not tmp_path.exists() or not any(p for p in tmp_path.iterdir() if not p.name.startswith("."))


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def deepspeed_muon(request, tmp_path_factory):
    """recipes/tiny-muon.toml on 2 CPU ranks under DeepSpeed's engine (gloo) at ZeRO-2 and ZeRO-3."""
    runs = tmp_path_factory.mktemp(f"muon-zero{request.param}")
    result = llmtui("run", "recipes/tiny-muon.toml", "--set", "train.max_steps=8", "--set", "train.eval_steps=0",
                    "--set", "train.micro_batch=4", "--set", "train.max_seq_len=64", "--set", "launch.gpus=2",
                    "--set", f"launch.zero_stage={request.param}", runs_dir=runs, timeout=900)
    return request.param, result, only_run(runs)


def test_muon_under_deepspeed_is_deepspeeds_zero_muon(deepspeed_muon):
    """The run succeeds on 2 ranks and its loss falls; what stepped the weights (the first_step event)
    is DeepSpeed's MuonWithAuxAdam inside its ZeRO optimizer; the lr column is AdamW's rate (the
    recipe's), not Muon's scaled one; rank 0's optimizer state is the estimate's within 5 %."""
    import json

    from tuiapp.core.config.recipe import load_recipe
    from tuiapp.core.plan import estimate

    stage, result, run_dir = deepspeed_muon
    log = (run_dir / "stdout.log").read_text(errors="replace")[-4000:]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:] + log
    info = run_info(run_dir)
    assert info["status"] == "succeeded" and info["ranks"] == 2
    train = [r for r in metrics(run_dir) if r.get("split", "train") == "train" and "loss" in r]
    losses = [r["loss"] for r in train]
    assert len(losses) == 8 and sum(losses[-2:]) < 0.9 * sum(losses[:2]), losses
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    first = next(e for e in events if e.get("event") == "first_step")
    assert first["optimizer"] == "deepspeed.runtime.zero.muon.muon_optimizer.MuonWithAuxAdam", first
    zero = "DeepSpeedZeroOptimizer_Stage3" if stage == 3 else "DeepSpeedZeroOptimizer"
    assert first["optimizer_wrappers"][-1] == zero, first
    recipe = load_recipe(run_dir / "recipe.toml")
    rates = [r["lr"] for r in train]  # no warmup: the recipe's rate, then the cosine's decay
    assert rates[0] == pytest.approx(recipe.train.learning_rate) and max(rates) <= rates[0], rates
    predicted = estimate.estimate_recipe(recipe, dict(estimate.TINY_CONFIG), 2, cuda=False).memory.optimizer
    measured = first["optimizer_state_bytes"]  # rank 0's: its partition of the Muon momentum and AdamW moments
    assert abs(predicted - measured) <= 0.05 * measured, (stage, predicted, measured)
