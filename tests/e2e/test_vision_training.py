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


def _cuda() -> bool:
    from tuiapp.core.plan.launcher import cuda_device_count

    return cuda_device_count() > 0


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_the_gpu_vlm_preset_settings_train_on_cuda(runs_dir):
    """The Qwen2.5-VL preset's [vision] settings (LoRA, the projector whole at its own rate, bf16,
    gradient checkpointing) on the tiny VLM, whose fixed-size processor takes no max_pixels."""
    result = llmtui("run", "recipes/gpu-qwen2.5-vl-3b-lora.toml", "--set", "model.name='tiny-vlm'",
                    "--set", "vision.max_pixels=0", "--set", "train.max_steps=3", "--set", "train.eval_steps=0",
                    "--set", "train.save_steps=0", "--set", "train.max_seq_len=128", "--set", "train.epochs=1",
                    runs_dir=runs_dir, timeout=900)
    run = only_run(runs_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert run_info(run)["status"] == "succeeded"
    losses = [r["loss"] for r in metrics(run) if r.get("split", "train") == "train" and "loss" in r]
    assert len(losses) == 3 and all(math.isfinite(loss) for loss in losses)
    saved = (run / "final" / "adapter_config.json").read_text()
    assert "multi_modal_projector" in saved  # trained whole, saved with the adapter


def test_dpo_on_image_pairs_trains_through_the_cli(runs_dir, tmp_path_factory):
    from tests.trainer.test_vision_dpo import pair_file

    folder = tmp_path_factory.mktemp("image-pairs")  # runs_dir is a folder of runs only
    data = pair_file(folder)
    recipe = folder / "dpo.toml"
    recipe.write_text(f'[model]\nname = "tiny-vlm"\n[dataset]\nname = "{data}"\n[method]\nkind = "dpo"\n'
                      '[method.adapter]\nkind = "lora"\nrank = 4\n[train]\nmax_steps = 3\nmicro_batch = 2\n'
                      'max_seq_len = 64\npacking = false\nlearning_rate = 1e-2\n[vision]\ntrain_projector = true\n'
                      'projector_lr = 3e-3\n[launch]\ngpus = 1\n')
    result = llmtui("run", str(recipe), runs_dir=runs_dir, timeout=900)
    run = only_run(runs_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert run_info(run)["status"] == "succeeded"
    rows = [r for r in metrics(run) if r.get("split", "train") == "train" and "loss" in r]
    assert len(rows) == 3 and all(math.isfinite(r["loss"]) for r in rows)
    assert (run / "final" / "adapter_config.json").is_file() and (run / "final" / "processor_config.json").is_file()
