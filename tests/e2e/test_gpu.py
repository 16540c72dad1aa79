"""GPU-only paths: QLoRA over a 4-bit base, bf16 with ZeRO-2, NVML memory in the metrics.
They skip on machines without CUDA (and bitsandbytes for QLoRA); the CPU tests cover the rest."""

import importlib.util

import pytest

from tests.e2e.helpers import llmtui, metrics, only_run, run_info, train_steps

pytestmark = pytest.mark.slow


def cuda_available() -> bool:
    from tuiapp.core.launcher import cuda_device_count

    return cuda_device_count() > 0


needs_cuda = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")


@needs_cuda
@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
def test_qlora_trains_on_gpu(tmp_path):
    recipe = tmp_path / "qlora.toml"
    recipe.write_text(open("recipes/tiny-lora.toml").read().replace('kind = "lora"', 'kind = "qlora"'))
    result = llmtui("run", str(recipe), "--set", "train.max_steps=5", "--set", "train.precision='bf16'",
                    runs_dir=tmp_path / "runs")
    run_dir = only_run(tmp_path / "runs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert train_steps(run_dir) == [1, 2, 3, 4, 5]
    assert (run_dir / "final" / "adapter_config.json").exists()


@needs_cuda
def test_bf16_zero2_reports_cuda_memory(tmp_path):
    result = llmtui("run", "recipes/tiny-sft.toml", "--set", "train.max_steps=5", "--set", "train.precision='bf16'",
                    "--set", "launch.zero_stage=2", runs_dir=tmp_path)
    run_dir = only_run(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert run_info(run_dir)["accelerator"] == "cuda"
    memory = [r for r in metrics(run_dir) if r.get("split", "train") == "train"][-1]["mem"]["rank0"]
    assert memory["device"].startswith("cuda") and memory["allocated"] > 0 and memory["peak"] > 0


def test_gpu_only_features_fail_clearly_without_cuda(tmp_path):
    if cuda_available():
        pytest.skip("this machine has CUDA")
    for sets, key in ((["method.kind='qlora'"], "method.kind"), (["train.precision='bf16'"], "train.precision")):
        args = ["run", "recipes/tiny-lora.toml"]
        for item in sets:
            args += ["--set", item]
        result = llmtui(*args, runs_dir=tmp_path)
        assert result.returncode == 2 and key in result.stderr and "CUDA" in result.stderr
        assert "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir())


@needs_cuda
def test_a_queued_run_waits_for_the_gpu_another_run_holds(tmp_path):
    """NVML path of the queue: a run on GPU 0 outside the queue; a queued run asking for GPU 0
    waits until it ends, then gets it."""
    import json

    from tests.e2e.helpers import wait_for

    llmtui("run", "recipes/tiny-sft.toml", "--set", "train.max_steps=30", "--set", "launch.gpus=[0]",
           "--set", "name=holder", "--detach", runs_dir=tmp_path, check=True)
    llmtui("run", "recipes/tiny-sft.toml", "--set", "train.max_steps=3", "--set", "launch.gpus=[0]",
           "--set", "name=waiter", "--queue", "--detach", runs_dir=tmp_path, check=True)
    runs = {run_info(p)["name"]: p for p in tmp_path.iterdir() if p.is_dir() and not p.name.startswith(".")}
    assert run_info(runs["waiter"])["status"] == "queued"
    assert [r["id"] for r in json.loads(llmtui("queue", "--json", runs_dir=tmp_path, check=True).stdout)] \
        == [runs["waiter"].name]
    wait_for(lambda: run_info(runs["holder"])["status"] in ("succeeded", "failed"), timeout=600, what="the holder")
    wait_for(lambda: run_info(runs["waiter"])["status"] in ("succeeded", "failed"), timeout=600, what="the waiter")
    holder, waiter = run_info(runs["holder"]), run_info(runs["waiter"])
    assert waiter["status"] == "succeeded" and waiter["devices"] == [0]
    assert waiter["attempts"][0]["started"] >= holder["attempts"][0]["ended"] - 1
