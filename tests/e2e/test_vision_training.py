"""The tiny-vlm-lora preset trains through the real `llmtui run` (a DeepSpeed CPU rank) on demo:shapes."""

from __future__ import annotations

import math

import pytest

from tests.e2e.helpers import llmtui, metrics, only_run, run_info

pytestmark = pytest.mark.slow


def test_tiny_vlm_lora_preset_trains(runs_dir):
    result = llmtui("run", "recipes/tiny-vlm-lora.toml", "--set", "train.max_steps=4", "--set", "train.save_steps=0",
                    "--set", "train.eval_steps=0", "--set", "train.logging_steps=1", runs_dir=runs_dir, timeout=900)
    run = only_run(runs_dir)
    log = (run / "stdout.log").read_text(errors="replace")[-3000:] if (run / "stdout.log").exists() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + log
    assert run_info(run)["status"] == "succeeded"
    losses = [r["loss"] for r in metrics(run) if r.get("split", "train") == "train" and "loss" in r]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    final = run / "final"
    assert (final / "adapter_config.json").is_file() and (final / "processor_config.json").is_file()
