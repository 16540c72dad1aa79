"""train.optimizer through the real launcher: a Muon run (recipes/tiny-muon.toml) trains, its run
view and compare's config diff name the optimizer; one that cannot run here is refused before launch;
under DeepSpeed's engine on 2 CPU ranks (ZeRO-2, and ZeRO-3 for muon) muon is DeepSpeed's ZeRO Muon,
and muon, adafactor and lion train with the estimate's optimizer state."""

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



UNDER_ZERO = {  # what steps the weights under DeepSpeed's ZeRO optimizer, by kind
    "muon": "deepspeed.runtime.zero.muon.muon_optimizer.MuonWithAuxAdam",
    "adafactor": "transformers.optimization.Adafactor",
    "lion": "lion_pytorch.lion_pytorch.Lion",
}


@pytest.fixture(scope="module", params=[("muon", 2), ("muon", 3), ("adafactor", 2), ("lion", 2)],
                ids=["muon-zero2", "muon-zero3", "adafactor-zero2", "lion-zero2"])
def under_zero(request, tmp_path_factory):
    """recipes/tiny-muon.toml with train.optimizer on 2 CPU ranks under DeepSpeed's engine (gloo)."""
    kind, stage = request.param
    runs = tmp_path_factory.mktemp(f"{kind}-zero{stage}")
    result = llmtui("run", "recipes/tiny-muon.toml", "--set", f"train.optimizer={kind}", "--set", "train.max_steps=8",
                    "--set", "train.eval_steps=0", "--set", "train.micro_batch=4", "--set", "train.max_seq_len=64",
                    "--set", "launch.gpus=2", "--set", f"launch.zero_stage={stage}", runs_dir=runs, timeout=900)
    return kind, stage, result, only_run(runs)


def test_optimizer_under_deepspeed_zero(under_zero):
    """The run succeeds on 2 ranks and its loss falls; what stepped the weights (the first_step event)
    is the kind's optimizer inside DeepSpeed's ZeRO optimizer (for muon DeepSpeed's own ZeRO Muon),
    and rank 0's optimizer state is the estimate's within 5 %. Muon's lr column is AdamW's rate (the
    recipe's), not the Muon group's scaled one."""
    import json

    from tuiapp.core.config.recipe import load_recipe
    from tuiapp.core.plan import estimate

    kind, stage, result, run_dir = under_zero
    log = (run_dir / "stdout.log").read_text(errors="replace")[-4000:]
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:] + log
    info = run_info(run_dir)
    assert info["status"] == "succeeded" and info["ranks"] == 2
    train = [r for r in metrics(run_dir) if r.get("split", "train") == "train" and "loss" in r]
    losses = [r["loss"] for r in train]
    assert len(losses) == 8 and sum(losses[-2:]) < 0.9 * sum(losses[:2]), losses
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]
    first = next(e for e in events if e.get("event") == "first_step")
    assert first["optimizer"] == UNDER_ZERO[kind], first
    zero = "DeepSpeedZeroOptimizer_Stage3" if stage == 3 else "DeepSpeedZeroOptimizer"
    assert first["optimizer_wrappers"][-1] == zero, first
    recipe = load_recipe(run_dir / "recipe.toml")
    if kind == "muon":
        rates = [r["lr"] for r in train]  # no warmup: the recipe's rate, then the cosine's decay
        assert rates[0] == pytest.approx(recipe.train.learning_rate) and max(rates) <= rates[0], rates
    predicted = estimate.estimate_recipe(recipe, dict(estimate.TINY_CONFIG), 2, cuda=False).memory.optimizer
    measured = first["optimizer_state_bytes"]  # rank 0's: its partition's states
    assert abs(predicted - measured) <= 0.05 * measured, (kind, stage, predicted, measured)
