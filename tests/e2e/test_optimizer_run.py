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
