"""GPU-only paths: QLoRA over a 4-bit base, bf16 with ZeRO-2, NVML memory in the metrics.
They skip on machines without CUDA (and bitsandbytes for QLoRA); the CPU tests cover the rest."""

import importlib.util

import pytest

from tests.e2e.helpers import llmtui, metrics, only_run, run_info, train_steps

pytestmark = pytest.mark.slow


def cuda_available() -> bool:
    from tuiapp.core.plan.launcher import cuda_device_count

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


# ------------------------------------------------------------------ what `make gpu-check` covers, at tiny size


def _packed_losses(tmp_path, name: str, *sets: str) -> list[float]:
    args = ["run", "recipes/tiny-sft.toml", "--set", "train.max_steps=8", "--set", "train.precision='bf16'",
            "--set", "train.packing=true", "--set", "train.eval_steps=0", "--set", "train.save_steps=0",
            "--set", "train.sample_prompts=[]", "--set", "dataset.eval_split=0.0", "--set", f"name={name}"]
    for item in sets:
        args += ["--set", item]
    runs = tmp_path / name
    result = llmtui(*args, runs_dir=runs)
    run_dir = only_run(runs)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [r for r in metrics(run_dir) if r.get("split", "train") == "train"]
    assert [r["step"] for r in rows] == list(range(1, 9))
    return [r["loss"] for r in rows]


@needs_cuda
@pytest.mark.parametrize("impl", [
    "eager",
    pytest.param("flash_attention_2", marks=pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None,
                                                               reason="needs flash_attn")),
])
def test_attention_implementations_agree_on_packed_batches(tmp_path, impl):
    """The same packed batches through sdpa (one example at a time) and eager (block mask) or
    flash-attention's varlen kernel: the same losses within bf16's tolerance (gpu-check's 2 %)."""
    reference = _packed_losses(tmp_path, "sdpa", "model.attn_implementation='sdpa'")
    losses = _packed_losses(tmp_path, impl.replace("_", "-"), f"model.attn_implementation='{impl}'")
    assert max(abs(a - b) / b for a, b in zip(losses, reference, strict=True)) <= 0.02, (losses, reference)


@needs_cuda
@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="needs liger-kernel")
def test_liger_kernels_keep_the_loss(tmp_path):
    reference = _packed_losses(tmp_path, "plain")
    losses = _packed_losses(tmp_path, "liger", "train.liger_kernel=true")
    assert max(abs(a - b) / b for a, b in zip(losses, reference, strict=True)) <= 0.02, (losses, reference)


@needs_cuda
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_with_cpu_optimizer_offload_on_one_gpu(tmp_path, stage):
    losses = _packed_losses(tmp_path, f"zero{stage}", f"launch.zero_stage={stage}", "launch.offload_optimizer='cpu'")
    assert all(loss == loss and loss < 100 for loss in losses)  # finite


@needs_cuda
def test_nvml_sees_at_least_what_torch_reserved(tmp_path):
    """While a run trains, NVML's figure for the GPU covers torch's reserved memory (gpu-check compares
    the same per run, with the CUDA context on top)."""
    import threading

    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    before = pynvml.nvmlDeviceGetMemoryInfo(handle).used
    seen, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            seen.append(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            stop.wait(0.1)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        _packed_losses(tmp_path, "nvml")
    finally:
        stop.set()
        thread.join()
        pynvml.nvmlShutdown()
    run_dir = only_run(tmp_path / "nvml")
    reserved = max(r["mem"]["rank0"]["reserved"] for r in metrics(run_dir) if r.get("mem"))
    assert max(seen) - before >= 0.98 * reserved


@needs_cuda
def test_gpu_check_stages_pass_here(tmp_path):
    """bench/gpu_check.py itself on this GPU: the attention and ZeRO stages on the 0.5 B model (a few minutes)."""
    import subprocess
    import sys

    out = tmp_path / "GPU_RESULTS.md"
    done = subprocess.run([sys.executable, "bench/gpu_check.py", "--stages", "attention,zero", "--out", str(out)],
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    report = out.read_text()
    assert "every check passed" in report and "## NVML" in report


def test_a_vllm_server_is_refused_without_cuda_before_anything_is_made(tmp_path):
    if cuda_available():
        pytest.skip("this machine has CUDA")
    result = llmtui("run", "recipes/gpu-qwen-0.5b-grpo-vllm-server.toml", runs_dir=tmp_path)
    assert result.returncode == 2 and "method.generation_backend" in result.stderr and "CUDA" in result.stderr
    assert "generation_backend = 'transformers'" in result.stderr and "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir())


def _two_gpus_and_vllm() -> bool:
    from tuiapp.core.plan.launcher import cuda_device_count

    return cuda_device_count() >= 2 and importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(not _two_gpus_and_vllm(), reason="needs two CUDA GPUs and vllm")
def test_grpo_generates_with_the_runs_own_vllm_server(tmp_path):
    """The supervisor starts vLLM on GPU 1, the rank trains on GPU 0 and generates through it, and
    the server ends with the run."""
    from tuiapp.core.machine.procs import process_alive
    from tuiapp.trainer.models.bundled import resolve_model_path

    model = resolve_model_path("tiny")  # a real Llama folder vLLM can load
    result = llmtui("run", "recipes/tiny-grpo.toml", "--set", f"model.name='{model}'",
                    "--set", "method.generation_backend='vllm'", "--set", "method.vllm_mode='server'",
                    "--set", "launch.gpus=1", "--set", "train.max_steps=3", "--set", "train.precision='bf16'",
                    runs_dir=tmp_path)
    run_dir = only_run(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    info = run_info(run_dir)
    server = info["generation_server"]
    assert server["gpus"] == [1] and server.get("ready") and info["gpus"] == [0]
    assert (run_dir / "vllm-server.log").stat().st_size > 0 and not process_alive(server["pid"], None)
    assert train_steps(run_dir) == [1, 2, 3]


@needs_cuda
@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes")
def test_qlora_trains_a_vlm_on_gpu(tmp_path):
    """The language model in 4 bits, the vision tower, projector and head as loaded, LoRA on top."""
    result = llmtui("run", "recipes/tiny-vlm-lora.toml", "--set", "method.kind='qlora'", "--set", "train.max_steps=3",
                    "--set", "train.precision='bf16'", runs_dir=tmp_path / "runs")
    run_dir = only_run(tmp_path / "runs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert train_steps(run_dir) == [1, 2, 3] and (run_dir / "final" / "adapter_config.json").exists()
