"""Early stopping on the eval loss, through the real launcher and Trainer."""

import pytest

from tests.e2e.helpers import llmtui, only_run, run_info, train_steps

pytestmark = pytest.mark.slow


def test_a_run_whose_eval_loss_stalls_stops_early_and_succeeds(tmp_path):
    result = llmtui("run", "recipes/tiny-lora.toml", "--set", "train.max_steps=40", "--set", "train.eval_steps=2",
                    "--set", "train.save_steps=0", "--set", "train.learning_rate=1e-9", "--set",
                    "train.early_stopping_patience=2", "--set", "train.early_stopping_threshold=0.01",
                    "--set", "train.sample_prompts=[]", runs_dir=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = only_run(tmp_path)
    info = run_info(run_dir)
    assert info["status"] == "succeeded"
    assert info["reason"].startswith("stopped early at step 6: the eval loss did not improve for 2 evals")
    assert train_steps(run_dir)[-1] == 6 and (run_dir / "final").is_dir()


def test_early_stopping_without_evals_is_refused_before_launch(tmp_path):
    result = llmtui("run", "recipes/tiny-lora.toml", "--set", "train.eval_steps=0", "--set",
                    "train.early_stopping_patience=2", runs_dir=tmp_path)
    assert result.returncode == 2 and "train.early_stopping_patience" in result.stderr
    assert not tmp_path.exists() or not any(p for p in tmp_path.iterdir() if not p.name.startswith("."))
