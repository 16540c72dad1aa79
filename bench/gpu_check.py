"""The GPU acceptance check, one command: `make gpu-check` (this script).

    .venv/bin/python bench/gpu_check.py [--stages S,...] [--methods M,...] [--out FILE]
    .venv/bin/python bench/gpu_check.py --cpu-smoke       # the same plumbing on CPU: tiny sizes, 2 steps, fp32

On a CUDA machine it proves every GPU path of llmtui through the real `llmtui run` (recipes written
into a temporary folder, each run followed headless, its metrics.jsonl read back), with nothing
downloaded: the models are random-weight Qwen2-shaped configs built locally with the bundled tiny
model's tokenizer, and the data is generated. Stages (docs/gpu.md says what each checks and why):

  methods    every method 20 steps in bf16 on a ~0.5 B Qwen-like model, from the tiny-<method>
             presets (QLoRA: nf4 with double quantization); a few at once (--parallel)
  rl         the presets' chain tiny-rl-format -> tiny-grpo, tiny-rloo as they are (the bundled tiny
             model): the primary reward rises >= 3x and the held-out reward beats the base's
  attention  eager, sdpa and flash_attention_2 (when flash_attn is installed) on the same packed
             batches: losses equal within --loss-rtol, tokens/s and peak memory each
  liger      Liger kernels off and on: loss parity, tokens/s, peak memory
  zero       ZeRO-2 and ZeRO-3, optimizer offloaded to the CPU, on one GPU
  probe      `llmtui probe` of two configurations: its measured peaks against the estimate
  mfu        SFT of a ~1 B config with packing (+ flash-attention and Liger when installed):
             MFU = tokens/s x 6 x parameters / the GPU's peak bf16 FLOP/s, and the same steps
             through bench/baseline_train.py (a plain Trainer script) for the ratio
  Every run also gets `llmtui estimate` against its measured peak (torch's allocator, and NVML
  while it was the only run on the GPU), and its NVML readings (memory, utilisation, power,
  temperature) checked against torch's figures and against the readers llmtui's UI and queue use.

It writes bench/GPU_RESULTS.md (machine, versions, every figure, each check passed or failed).

Exit codes: 0 every check passed, or nothing ran because this machine has no CUDA (it says so and
writes nothing); 1 a check failed (a run failed, a loss was not finite or out of tolerance, NVML
disagreed with torch); 2 bad arguments. Goals (MFU >= 45 %, estimate error <= 10 %) are reported
as met or missed; missing one is not a failure of the check.

--cpu-smoke runs every stage that does not need CUDA for real on this CPU (tiny sizes, 2 steps,
fp32; qlora, flash-attention, Liger and NVML are listed as skipped) and writes its report to --out
(default: the work folder, never bench/GPU_RESULTS.md), so the plumbing is tested where there is no GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

# Ranks build DeepSpeed's ops (CPU Adam for offload, the CPU comm op) where llmtui's own runs do,
# once per environment; bench/common.py points TORCH_EXTENSIONS_DIR at a private folder on import.
_USER_EXTENSIONS = os.environ.get("TORCH_EXTENSIONS_DIR")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import fmt, md_table  # noqa: E402

ROOT = common.ROOT
RESULTS = common.BENCH / "GPU_RESULTS.md"
EXIT_OK, EXIT_FAILED, EXIT_BAD_ARGS = 0, 1, 2
STAGES = ("mfu", "attention", "methods", "rl", "zero", "liger", "fp8", "probe")  # in order of value
# Each stage's time budget on a GPU, seconds: one call under 10 minutes in all (a stage cut short says so;
# the report is rewritten after every stage). --budget scales them; the CPU smoke has none.
# On the H200 (2026-11-28, 11-30) a run took 45-90 s, 10-25 of them training: mfu holds its run and the
# baseline's, attention its three first kernels (eager, torch_varlen, sdpa: 183 s on 11-30), rl the tiny chain.
STAGE_BUDGET_S = {"mfu": 170, "attention": 130, "methods": 80, "rl": 90, "zero": 25, "liger": 15, "fp8": 10,
                  "probe": 20}
# Stages run only when named (--stages mfu,batching,...), each with its budget: batching = the mfu run with every
# micro batch filled to a token budget (the H200's default-batching run held 45 % of its tokens per step)
EXTRA_STAGE_BUDGET_S = {"batching": 150}
WHEELS = ROOT / "gpu-wheels"  # `make gpu-wheels`: liger-kernel, torchao (bitsandbytes) for a box without an index
OPTIONAL = {"liger_kernel": "liger-kernel", "torchao": "torchao", "bitsandbytes": "bitsandbytes"}
RATIO_GOAL = 1.5  # llmtui / the plain Trainer script, tokens/s
RESERVED_GOAL = 1.2  # torch's reserved / allocated peak
GIB = 2**30

# Dense bf16 tensor-core peak, FLOP/s, by NVML device name (first match wins: the longer names first).
PEAK_BF16_FLOPS = (
    ("GH200", 989.4e12), ("H200", 989.4e12), ("H100 PCIe", 756.5e12), ("H100 NVL", 835.6e12), ("H100", 989.4e12),
    ("H800", 989.4e12), ("H20", 148.0e12), ("B200", 2250e12), ("B100", 1750e12), ("A100", 312e12),
    ("A800", 312e12), ("L40S", 362.05e12), ("L40", 181.05e12), ("L4", 121.0e12), ("A10G", 70.0e12),
    ("A10", 125.0e12), ("RTX 6000 Ada", 364.25e12), ("RTX A6000", 154.8e12), ("RTX 4090", 165.2e12),
    ("RTX 3090", 71.0e12),
)
MFU_GOAL = 0.45
ESTIMATE_GOAL = 0.10  # |predicted - measured| / measured
FULL_BATCH = 0.8  # batch fill from which a run's peak is compared with the estimate (else: a bound)
NVML_EXTRA_MAX = 3 * GIB  # NVML's figure over torch's reserved: CUDA context, cuBLAS workspace, NCCL


@dataclass(frozen=True)
class Profile:
    """Sizes of one mode: the GPU check, or the CPU smoke of its plumbing."""

    name: str
    cuda: bool
    precision: str
    steps: int
    short_steps: int  # the attention, liger, zero and fp8 runs: parity and tokens/s need fewer steps
    small: dict  # Qwen2Config keys of the ~0.5 B model (methods, attention, liger, zero, probe)
    big: dict  # and of the ~1 B model (mfu)
    seq_len: int  # attention / liger / zero / probe
    micro_batch: int
    mfu_seq_len: int
    mfu_micro_batch: int
    mfu_steps: int
    mfu_warmup: int
    records: int  # generated SFT records
    words: tuple[int, int]  # answer length range of a record, in words
    parallel: int
    loss_rtol: float
    timeout: float


GPU = Profile(
    name="gpu", cuda=True, precision="bf16", steps=20, short_steps=12,
    # Qwen2.5-0.5B's shape: 494 M parameters with its 151,936-token vocabulary (tied embeddings)
    small=dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
               num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
               rope_theta=1000000.0, rms_norm_eps=1e-6),
    # ~1.1 B: TinyLlama's shape (22 layers of 2048, GQA 16/4 heads), as a Qwen2 model, untied
    big=dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=32000, tie_word_embeddings=False, max_position_embeddings=4096,
             rope_theta=10000.0, rms_norm_eps=1e-5),
    # mfu: 8 examples of ~900 tokens a step; the padded baseline stays well inside 80 GB
    seq_len=1024, micro_batch=8, mfu_seq_len=2048, mfu_micro_batch=8, mfu_steps=24, mfu_warmup=6,
    records=1200, words=(80, 1100), parallel=4, loss_rtol=0.02, timeout=600,
)
SMOKE = Profile(
    name="cpu-smoke", cuda=False, precision="fp32", steps=2, short_steps=2,
    small=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=2048, tie_word_embeddings=True, max_position_embeddings=512,
               rope_theta=10000.0, rms_norm_eps=1e-6),
    big=dict(hidden_size=96, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=2048, tie_word_embeddings=False, max_position_embeddings=512,
             rope_theta=10000.0, rms_norm_eps=1e-6),
    seq_len=128, micro_batch=2, mfu_seq_len=128, mfu_micro_batch=2, mfu_steps=5, mfu_warmup=4,
    records=48, words=(8, 60), parallel=1, loss_rtol=1e-3, timeout=600,
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ what this machine has


def cuda_state() -> tuple[bool, str]:
    """Whether runs here get CUDA, and why not (or torch's CUDA version): NVML first (no torch), then torch."""
    from tuiapp.core.plan.launcher import cuda_device_count

    if cuda_device_count() == 0:
        return False, "no CUDA GPU on this machine (NVML sees none)"
    code = "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())"
    out = subprocess.run([common.PYTHON, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        return False, f"torch does not import: {out.stderr.strip()[-300:]}"
    version, cuda, available = out.stdout.split()[-3:]
    if available != "True":
        return False, f"NVML sees a GPU but torch {version} (CUDA {cuda}) cannot use it: install a CUDA build of torch"
    return True, cuda


def has_package(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def method_kinds() -> list[str]:
    """Every `method.kind` of the recipe schema, in its order."""
    from typing import Union, get_args, get_origin

    from tuiapp.core.config import recipe

    union = get_args(recipe.Method)[0]
    assert get_origin(union) is Union, "recipe.Method is no longer Annotated[Union[...], ...]"
    return [cls.model_fields["kind"].default for cls in get_args(union)]


def peak_flops(gpu_name: str) -> float | None:
    for key, flops in PEAK_BF16_FLOPS:
        if key.lower() in gpu_name.lower():
            return flops
    return None


def mfu(tokens_per_s: float | None, params: int, peak: float | None) -> float | None:
    """Model FLOPs utilisation as the issue defines it: tokens/s x 6 x parameters / peak FLOP/s."""
    if not tokens_per_s or not peak:
        return None
    return tokens_per_s * 6 * params / peak


def loss_gap(losses: list[float], reference: list[float]) -> float | None:
    """Largest relative gap between two runs' per-step losses (steps both have)."""
    pairs = [(a, b) for a, b in zip(losses, reference, strict=False) if a is not None and b is not None]
    if not pairs:
        return None
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in pairs)


def error_pct(predicted: float | None, measured: float | None) -> float | None:
    if not predicted or not measured:
        return None
    return 100.0 * (predicted - measured) / measured


# ------------------------------------------------------------------ model folders and data


# Methods whose library supports only some architectures: peft's adaption prompt takes llama, mistral
# and gpt2 (llmtui's preflight refuses it on Qwen2 with that message), so it trains a Llama of the same shape.
ARCHITECTURE = {"llama-adapter": "llama"}


def build_model(folder: Path, shape: dict, cache: Path, device: str, dtype: str, arch: str = "qwen2") -> dict:
    """A random-weight Qwen2 (or Llama) model with the bundled tiny model's tokenizer (run in a child process)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from tuiapp.trainer.models.tiny import IM_END, ensure_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model(cache))
    if len(tokenizer) > shape["vocab_size"]:
        raise SystemExit(f"vocab_size {shape['vocab_size']} is under the tokenizer's {len(tokenizer)} tokens")
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(**shape, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                          pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = model_class(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    info = {"parameters": params, "embedding": model.get_input_embeddings().weight.numel(), "shape": shape,
            "architecture": arch}
    (folder / "gpu_check_model.json").write_text(json.dumps(info) + "\n")
    return info


def ensure_models(wanted: list[tuple[Path, dict, str]], cache: Path, env: dict, cuda: bool, precision: str) -> list[dict]:
    """Each (folder, shape, architecture) built unless it is there, all in one child process (one torch import)."""
    specs = [{"folder": str(folder), "shape": shape, "cache": str(cache), "device": "cuda" if cuda else "cpu",
              "dtype": "bfloat16" if precision == "bf16" else "float32", "arch": arch}
             for folder, shape, arch in wanted if not (folder / "gpu_check_model.json").exists()]
    if specs:
        out = subprocess.run([common.PYTHON, __file__, "--build-model", json.dumps(specs)], cwd=ROOT, env=env,
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"building the models failed:\n{out.stdout[-2000:]}{out.stderr[-4000:]}")
    return [json.loads((folder / "gpu_check_model.json").read_text()) for folder, _, _ in wanted]


def write_sft_data(path: Path, count: int, words: tuple[int, int], seed: int = 0) -> Path:
    """Alpaca records of varied length, from the words of the demo corpus (the tokenizer knows them)."""
    import random

    from tuiapp.core.data import demo_data

    vocab = sorted({w for r in demo_data.text_records() for w in r["text"].split()})
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(count):
            record = {
                "instruction": f"Write note {i} about " + " ".join(rng.choices(vocab, k=rng.randint(4, 24))),
                "input": "",
                "output": " ".join(rng.choices(vocab, k=rng.randint(*words))) + ".",
            }
            handle.write(json.dumps(record) + "\n")
    return path


# ------------------------------------------------------------------ recipes


def preset(kind: str) -> dict:
    """The tiny-<kind> preset as a dict (qlora: tiny-lora with the 4-bit base)."""
    name = "lora" if kind == "qlora" else kind
    data = tomllib.loads((ROOT / "recipes" / f"tiny-{name}.toml").read_text(encoding="utf-8"))
    if kind == "qlora":
        data["method"].update(kind="qlora", quant_type="nf4", double_quant=True)
    return data


FULL_BATCH_KINDS = {"sft", "lora", "qlora", "dora", "ia3", "adapter"}  # SFT records, packed rows of max_seq_len


def method_recipe(kind: str, model: Path, profile: Profile, data: Path | None = None) -> dict:
    """A method's preset on the check's model: `steps` steps, no evals, one device. With `data` (the
    generated SFT records), the methods that train on SFT records take it with packed rows of the
    check's max_seq_len, so their tokens/s and the estimate's error are those of full batches."""
    recipe = preset(kind)
    if data is not None and kind in FULL_BATCH_KINDS:
        recipe["dataset"] = {"name": str(data), "format": "alpaca", "eval_split": 0.0}
        recipe["train"].update(max_seq_len=profile.seq_len, micro_batch=profile.micro_batch, packing=True)
    data = recipe
    data["name"] = f"gpu-check-{kind}"
    data["model"] = {"name": str(model)}
    data["method"].pop("hidden_size", None)
    data["method"].pop("num_layers", None)
    if kind == "distill":  # the preset's run: teacher is not on a fresh box; the student, as its own
        data["method"]["teacher"] = str(model)  # teacher, shares its tokenizer (the KL starts near 0)
    data["dataset"]["eval_split"] = 0.0
    data["train"].update(max_steps=profile.steps, precision=profile.precision, eval_steps=0, save_steps=0,
                         eval_on_start=False, sample_prompts=[], learning_rate=1e-4, logging_steps=1)
    data["launch"] = {"gpus": 1}
    return data


def sft_recipe(name: str, model: Path, data_file: Path, profile: Profile, *, steps: int | None = None,
               seq_len: int | None = None, micro_batch: int | None = None, attention: str = "auto",
               liger: bool = False, zero: int = 0, offload: str = "none") -> dict:
    """Full SFT on the generated data with packed batches (the attention, liger, zero and mfu runs)."""
    return {
        "name": name,
        "model": {"name": str(model), "attn_implementation": attention},
        "dataset": {"name": str(data_file), "format": "alpaca", "eval_split": 0.0},
        "method": {"kind": "sft"},
        "train": {"max_steps": steps or profile.steps, "micro_batch": micro_batch or profile.micro_batch,
                  "learning_rate": 1e-4, "max_seq_len": seq_len or profile.seq_len, "packing": True,
                  "liger_kernel": liger, "precision": profile.precision, "eval_steps": 0, "save_steps": 0,
                  "sample_prompts": [], "seed": 42, "logging_steps": 1},
        "launch": {"gpus": 1, "zero_stage": zero, "offload_optimizer": offload},
    }


# ------------------------------------------------------------------ NVML


class Nvml:
    """NVML readings of the runs' device (the first of CUDA_VISIBLE_DEVICES, else 0), sampled in a
    thread while runs train."""

    def __init__(self):
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        self.index = int(first) if first.isdigit() else 0
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        name = pynvml.nvmlDeviceGetName(self.handle)
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.total = int(pynvml.nvmlDeviceGetMemoryInfo(self.handle).total)
        try:
            self.power_limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000
        except pynvml.NVMLError:
            self.power_limit_w = None
        try:
            self.capability = tuple(pynvml.nvmlDeviceGetCudaComputeCapability(self.handle))
        except pynvml.NVMLError:
            self.capability = None
        self.driver = pynvml.nvmlSystemGetDriverVersion()
        self.driver = self.driver.decode() if isinstance(self.driver, bytes) else str(self.driver)

    def read(self) -> dict:
        nv, h = self.nvml, self.handle
        out = {"time": time.time(), "used": int(nv.nvmlDeviceGetMemoryInfo(h).used)}
        for key, call in (("util", lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu),
                          ("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000),
                          ("temp_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))):
            try:
                out[key] = float(call())
            except nv.NVMLError:
                out[key] = None
        try:
            out["procs"] = {p.pid: int(p.usedGpuMemory or 0) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)}
        except nv.NVMLError:
            out["procs"] = {}
        return out

    def project_readers(self) -> dict:
        """The device's used memory as llmtui's own readers see it: the run view's sampler and core.machine.gpus."""
        out = {"direct": self.read()["used"]}
        try:
            from tuiapp.ui.system import SystemSampler

            sampler = SystemSampler()
            gpus = sampler.sample().gpus
            sampler.close()
            out["ui"] = next((int(g.used) for g in gpus if g.index == self.index), None)
        except Exception as exc:  # a renamed reader is reported, not fatal
            out["ui_error"] = repr(exc)
        try:
            from tuiapp.core.machine.gpus import detect_gpus

            gpus = detect_gpus()
            out["core"] = next((g.used_bytes for g in gpus if g.index == self.index), None)
        except Exception as exc:
            out["core_error"] = repr(exc)
        return out


class Sampler(threading.Thread):
    def __init__(self, nvml: Nvml, interval: float = 0.25):
        super().__init__(daemon=True)
        self.nvml, self.interval = nvml, interval
        self.samples: list[dict] = []
        self.stop_event = threading.Event()

    def run(self):
        while not self.stop_event.is_set():
            try:
                self.samples.append(self.nvml.read())
            except Exception:
                pass
            self.stop_event.wait(self.interval)

    def between(self, start: float, end: float) -> list[dict]:
        return [s for s in list(self.samples) if start <= s["time"] <= end]


# ------------------------------------------------------------------ runs


@dataclass
class Run:
    name: str
    stage: str
    recipe: dict
    alone: bool = True  # the only run on the GPU while it trained (NVML's device figures are its own)
    skipped: str | None = None
    recipe_path: Path | None = None
    returncode: int | None = None
    status: str | None = None
    reason: str | None = None
    rows: list = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    run_dir: Path | None = None
    rank_pids: set = field(default_factory=set)
    log_tail: str = ""
    estimate: int | None = None
    baseline_used: int | None = None  # NVML device memory used before it started
    nvml: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.skipped is None and self.returncode == 0 and self.status == "succeeded" and not self.problems

    @property
    def losses(self) -> list[float | None]:
        return [r.get("loss") for r in self.rows]

    def tokens_per_s(self, warmup: int) -> float | None:
        return common.throughput(self.rows, warmup)

    def first_step_after(self) -> float | None:
        """Seconds from `llmtui run` to the first step's row: preflight, launch, model, data."""
        times = [r["time"] for r in self.rows if isinstance(r.get("time"), (int, float))]
        return min(times) - self.started if times and self.started else None

    def start_phases(self) -> list[float] | None:
        """first_step_after in parts, from the run's events: checks, model, data and engine, step 1."""
        if self.run_dir is None or not self.started:
            return None
        at = {}
        for event in common.read_jsonl(self.run_dir / "events.jsonl"):
            if event.get("event") in ("launched", "model_plan", "started") and isinstance(event.get("time"), (int, float)):
                at.setdefault(event["event"], event["time"])
        first = self.first_step_after()
        if first is None or len(at) < 3:
            return None
        marks = [self.started, at["launched"], at["model_plan"], at["started"], self.started + first]
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]

    def memory(self, key: str) -> int | None:
        values = [((r.get("mem") or {}).get("rank0") or {}).get(key) for r in self.rows]
        values = [v for v in values if isinstance(v, (int, float))]
        return int(max(values)) if values else None

    def fill(self) -> float | None:
        """Tokens of a median step over the batch the estimate assumes (max_seq_len x micro_batch)."""
        train = self.recipe.get("train", {})
        capacity = (train.get("max_seq_len") or 0) * (train.get("micro_batch") or 0)
        if train.get("batching") == "tokens" and train.get("tokens_per_batch"):
            capacity = train["tokens_per_batch"]
        totals = [r.get("tokens") for r in self.rows if isinstance(r.get("tokens"), (int, float))]
        steps = sorted(b - a for a, b in zip(totals, totals[1:], strict=False))
        return steps[len(steps) // 2] / capacity if steps and capacity else None

    @property
    def peak(self) -> int | None:  # torch's max_memory_allocated on CUDA, peak RSS on CPU
        return self.memory("peak")

    def nvml_own_peak(self) -> int | None:
        """The rank's own NVML figure, by pid (None where NVML sees other pids, as in some containers)."""
        own = [sum(m for pid, m in s["procs"].items() if pid in self.rank_pids) for s in self.nvml]
        own = [v for v in own if v]
        return max(own) if own else None

    def nvml_peak(self) -> int | None:
        """The rank's own NVML figure (by pid), else the device's rise over its start when it ran alone."""
        own = self.nvml_own_peak()
        if own:
            return own
        if self.alone and self.baseline_used is not None and self.nvml:
            return max(s["used"] for s in self.nvml) - self.baseline_used
        return None


def rank_pids(run_dir: Path) -> set[int]:
    import psutil

    pids = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "tuiapp.trainer" in cmd and str(run_dir) in cmd:
            pids.add(proc.info["pid"])
    return pids


class Runner:
    """Starts `llmtui run RECIPE` for each Run (up to `parallel` at once), follows them, reads them back."""

    def __init__(self, work: Path, env: dict, profile: Profile, sampler: Sampler | None):
        self.work, self.env, self.profile, self.sampler = work, env, profile, sampler
        self.active: list[tuple[Run, subprocess.Popen, object]] = []
        self.deadline: float | None = None  # the stage's time budget ends: no run starts, running ones stop
        self.budget_s: float | None = None

    def write_recipe(self, run: Run) -> Path:
        import tomli_w

        folder = self.work / "recipes"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{run.name}.toml"
        path.write_text(tomli_w.dumps(run.recipe), encoding="utf-8")
        run.recipe_path = path
        return path

    def runs_dir(self, run: Run) -> Path:
        return self.work / "runs" / run.name

    def run_all(self, runs: list[Run], parallel: int = 1) -> list[Run]:
        from concurrent.futures import ThreadPoolExecutor

        pending = [r for r in runs if r.skipped is None]
        for run in pending:
            self.write_recipe(run)
        with ThreadPoolExecutor(max_workers=2) as pool:  # `llmtui estimate` of each, beside the runs
            estimates = [(run, pool.submit(self.estimate, run)) for run in pending]
            try:
                while pending or self.active:
                    if pending and self.deadline is not None and time.time() >= self.deadline:
                        for run in pending:
                            run.skipped = f"not started: the stage's time budget ({self.budget_s:.0f} s) ran out"
                        pending = []
                    while pending and len(self.active) < max(1, parallel):
                        self._start(pending.pop(0))
                    self._poll()
                    time.sleep(0.5)
            finally:
                for run, proc, _log in self.active:
                    proc.kill()
                    common.kill_run(run.run_dir)
                self.active = []
            for run, future in estimates:
                if run.skipped and run.skipped.startswith("not started") and future.cancel():
                    continue  # no estimate wanted of a run the budget left out
                run.estimate = future.result()
        return runs

    def _start(self, run: Run) -> None:
        log(f"  {run.stage}: {run.name} ...")
        runs_dir = self.runs_dir(run)
        shutil.rmtree(runs_dir, ignore_errors=True)
        argv = [*common.llmtui_command(), "run", str(run.recipe_path), "--runs-dir", str(runs_dir)]
        handle = open(self.work / f"{run.name}.cli.log", "wb")
        if self.sampler is not None and not self.active:
            samples = self.sampler.samples
            run.baseline_used = samples[-1]["used"] if samples else None
        run.alone = run.alone and not self.active
        run.started = time.time()
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=handle, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        for other, _, _ in self.active:
            other.alone = False
        self.active.append((run, proc, handle))

    def _poll(self) -> None:
        for item in list(self.active):
            run, proc, handle = item
            if run.run_dir is None and self.runs_dir(run).is_dir():
                dirs = [p for p in self.runs_dir(run).iterdir() if p.is_dir() and not p.name.startswith(".")]
                run.run_dir = dirs[0] if dirs else None
            if run.run_dir is not None and not run.rank_pids:
                run.rank_pids = rank_pids(run.run_dir)
            timed_out = time.time() - run.started > self.profile.timeout
            cut = self.deadline is not None and time.time() >= self.deadline
            if proc.poll() is None and not (timed_out or cut):
                continue
            if (timed_out or cut) and proc.poll() is None:
                proc.kill()
                common.kill_run(run.run_dir)
                if cut and not timed_out:
                    run.extra["cut"] = f"cut short by the stage's time budget ({self.budget_s:.0f} s)"
                else:
                    run.problems.append(f"timed out after {self.profile.timeout:.0f} s")
            proc.wait()
            handle.close()
            self.active.remove(item)
            self._finish(run, proc.returncode)

    def _finish(self, run: Run, code: int) -> None:
        run.ended, run.returncode = time.time(), code
        if self.sampler is not None:
            run.nvml = self.sampler.between(run.started, run.ended)
        if run.run_dir is not None:
            try:
                info = json.loads((run.run_dir / "run.json").read_text())
            except (OSError, ValueError):
                info = {}
            run.status, run.reason = info.get("status"), info.get("reason")
            rows = [r for r in common.read_jsonl(run.run_dir / "metrics.jsonl") if r.get("split", "train") == "train"]
            by_step = {r["step"]: r for r in rows if isinstance(r.get("step"), int)}
            run.rows = [by_step[s] for s in sorted(by_step)]
        run.log_tail = common._tail(self.work / f"{run.name}.cli.log", 25)
        steps = [r["step"] for r in run.rows]
        expected = run.recipe["train"]["max_steps"]
        if run.extra.get("cut"):  # what it logged is kept; not a failure of llmtui
            run.skipped = run.extra["cut"] + f" after {len(steps)} of {expected} steps"
        elif code != 0 or run.status != "succeeded":
            run.problems.append(f"exit {code}, status {run.status}: {run.reason or 'see the log'}")
        elif steps != list(range(1, expected + 1)):
            run.problems.append(f"logged steps {steps[:3]}...{steps[-3:]} instead of 1..{expected}")
        bad = [r["step"] for r in run.rows if not _finite(r.get("loss"))]
        if bad:
            run.problems.append(f"loss not finite at steps {bad[:5]}")
        log(f"  {run.stage}: {run.name}: {'ok' if run.ok else run.skipped or '; '.join(run.problems)} ({run.ended - run.started:.0f} s)")

    def estimate(self, run: Run) -> int | None:
        argv = [*common.llmtui_command(), "estimate", str(run.recipe_path), "--json", "--runs-dir",
                str(self.work / "estimates")]
        out = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True)
        try:
            return int(json.loads(out.stdout)["memory"]["total"])
        except (ValueError, KeyError, TypeError):
            run.extra["estimate_failed"] = (out.stderr or out.stdout).strip()[-300:]
            return None

    def probe(self, run: Run, max_size: int) -> dict:
        argv = [*common.llmtui_command(), "probe", str(run.recipe_path), "--json", "--max", str(max_size),
                "--steps", "3", "--runs-dir", str(self.work / "probes" / run.name)]
        started = time.time()
        left = self.deadline - time.time() if self.deadline else self.profile.timeout
        try:
            out = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True,
                                 timeout=max(5.0, min(self.profile.timeout, left)))
        except subprocess.TimeoutExpired:
            return {"rows": [], "error": f"cut short by the stage's time budget ({self.budget_s or 0:.0f} s)",
                    "returncode": None, "seconds": time.time() - started, "cut": True}
        try:
            start = out.stdout.index("{")
            data = json.loads(out.stdout[start:])
        except ValueError:
            data = {"rows": [], "error": (out.stderr or out.stdout).strip()[-800:]}
        data["returncode"], data["seconds"] = out.returncode, time.time() - started
        return data


def _planned_attention(run_dir: Path | None) -> str | None:
    """The attention the run's model_plan event says it ran."""
    if run_dir is None:
        return None
    for event in common.read_jsonl(run_dir / "events.jsonl"):
        if event.get("event") == "model_plan":
            return event.get("attention")
    return None


def _fifths(values: list) -> tuple[float | None, float | None]:
    """Mean of the first and of the last fifth of the logged steps' values (single steps are noisy)."""
    values = [v for v in values if _finite(v)]
    if len(values) < 2:
        return None, None
    k = max(1, len(values) // 5)
    return sum(values[:k]) / k, sum(values[-k:]) / k


def _common_steps(losses: list, reference: list) -> tuple[list, list]:
    """The steps both runs logged (a run cut short by its budget compares what it trained)."""
    n = min(len(losses), len(reference))
    return losses[:n], reference[:n]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


# ------------------------------------------------------------------ the check


@dataclass
class Check:
    profile: Profile
    work: Path
    env: dict
    methods: list[str]
    stages: list[str]
    peak_tflops: float | None = None
    runs: list[Run] = field(default_factory=list)
    findings: list[tuple[str, str, bool, str]] = field(default_factory=list)  # stage, what, passed, detail
    skipped: list[tuple[str, str]] = field(default_factory=list)  # what, why
    info: dict = field(default_factory=dict)
    probes: dict = field(default_factory=dict)
    mfu_rows: list = field(default_factory=list)
    readers: dict = field(default_factory=dict)
    nvml: Nvml | None = None
    sampler: Sampler | None = None
    budget_scale: float | None = None  # None: no stage budgets (the CPU smoke)
    stage_times: list = field(default_factory=list)  # (stage, budget s, seconds, cut short)

    def run_stage(self, stage: str) -> None:
        """One stage under its time budget; whether it was cut short goes into the report."""
        budget = ({**STAGE_BUDGET_S, **EXTRA_STAGE_BUDGET_S}[stage] * self.budget_scale if self.budget_scale
                  else None)
        started = time.time()
        self.runner.deadline = started + budget if budget else None
        self.runner.budget_s = budget
        first = len(self.runs)
        getattr(self, f"stage_{stage}")()
        self.runner.deadline = None
        cut = [r for r in self.runs[first:] if r.skipped and "time budget" in r.skipped] + \
            [what for what, why in self.skipped if "time budget" in why and what.startswith(stage)]
        self.stage_times.append((stage, budget, time.time() - started, bool(cut)))

    def verdict(self, stage: str, what: str, passed: bool, detail: str = "") -> None:
        self.findings.append((stage, what, passed, detail))
        log(f"  {'PASS' if passed else 'FAIL'} {stage}: {what} {detail}")

    def skip(self, what: str, why: str) -> None:
        self.skipped.append((what, why))
        log(f"  skipped {what}: {why}")

    @property
    def failed(self) -> bool:
        return any(not passed for _, _, passed, _ in self.findings)

    # ---------------------------------------------------------- setup

    def prepare(self) -> None:
        p = self.profile
        # the tokenizer comes from the bundled tiny model, built once in the user's llmtui cache
        cache = Path(os.environ.get("LLMTUI_CACHE") or Path.home() / ".cache" / "llmtui")
        if p.cuda:
            self.nvml = Nvml()
            self.sampler = Sampler(self.nvml)
            self.sampler.start()
        log(f"building the models ({p.name}) and data in {self.work}")
        self.small_dir, self.big_dir = self.work / "model-small", self.work / "model-big"
        wanted = [(self.small_dir, p.small, "qwen2")]
        archs = {ARCHITECTURE[m] for m in self.methods if m in ARCHITECTURE} if "methods" in self.stages else set()
        self.arch_dirs = {arch: self.work / f"model-small-{arch}" for arch in sorted(archs)}
        wanted += [(folder, p.small, arch) for arch, folder in self.arch_dirs.items()]
        if "mfu" in self.stages or "batching" in self.stages:
            wanted.append((self.big_dir, p.big, "qwen2"))
        built = ensure_models(wanted, cache, self.env, p.cuda, p.precision)
        self.small, self.big = built[0], built[-1]
        self.data = write_sft_data(self.work / "sft.jsonl", p.records, p.words)
        self.runner = Runner(self.work, self.env, p, self.sampler)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.stop_event.set()

    # ---------------------------------------------------------- stages

    def stage_methods(self) -> None:
        p = self.profile
        runs = []
        for kind in self.methods:
            model = self.arch_dirs.get(ARCHITECTURE.get(kind), self.small_dir)
            run = Run(f"method-{kind}", "methods", method_recipe(kind, model, p, data=self.data))
            if kind in ARCHITECTURE:
                run.extra["note"] = f"a {ARCHITECTURE[kind]} model of the same shape"
            if kind == "qlora" and not p.cuda:
                run.skipped = "needs CUDA and bitsandbytes"
            elif kind == "qlora" and not has_package("bitsandbytes"):
                run.skipped = "bitsandbytes is not installed (pip install '.[qlora]')"
            if run.skipped:
                self.skip(f"method {kind}", run.skipped)
            runs.append(run)
        self.runs += self.runner.run_all(runs, parallel=p.parallel)
        for run in runs:
            if run.skipped is None:
                self.verdict("methods", f"{run.recipe['method']['kind']} trains {p.steps} steps", run.ok,
                             "; ".join(run.problems))
            if run.recipe["method"]["kind"] in ("grpo", "rloo") and run.rows:
                # a random-weight model earns ~0 reward, so whether RL learns is the rl stage's (its tiny chain)
                logged = [r for r in run.rows if _finite(r.get("reward"))]
                self.verdict("methods", f"{run.recipe['method']['kind']}: a reward logged at every step",
                             len(logged) == len(run.rows), f"{len(logged)} of {len(run.rows)} steps")

    def stage_rl(self) -> None:
        """tiny-rl-format -> tiny-grpo and tiny-rloo, the presets as they are (the bundled tiny model, the
        demo data, their own held-out evaluations): what the CPU test holds them to, on this GPU. The CPU
        smoke runs each for the profile's few steps, without the evaluations."""
        p = self.profile
        short = {"max_steps": p.steps, "eval_steps": 0, "eval_on_start": False} if not p.cuda else {}
        sft = Run("rl-format", "rl", preset("rl-format"))
        sft.recipe["train"].update(short)
        self.runs += self.runner.run_all([sft])
        if not sft.ok:
            self.verdict("rl", "tiny-rl-format (the RL presets' base) trains", False,
                         sft.skipped or "; ".join(sft.problems))
            return
        runs = []
        for kind in ("grpo", "rloo"):
            run = Run(f"rl-{kind}", "rl", preset(kind))
            run.recipe["train"].update(short)
            run.recipe["model"]["name"] = str(sft.run_dir / "final")  # the preset's run:tiny-rl-format
            runs.append(run)
        self.runs += self.runner.run_all(runs, parallel=2)
        for run in [r for r in runs if r.skipped is None]:
            kind = run.recipe["method"]["kind"]
            self.verdict("rl", f"tiny-{kind} trains {run.recipe['train']['max_steps']} steps", run.ok,
                         "; ".join(run.problems))
            if not p.cuda or not run.ok:
                continue
            first, last = _fifths([r.get("rewards/answer/mean") for r in run.rows])
            run.extra["reward"] = (first, last)
            self.verdict("rl", f"tiny-{kind}: the primary (answer) reward rises >= 3x, first fifth of the steps "
                         "-> last", first is not None and last >= 3 * first and last > 0,
                         f"{fmt(first, '.3f')} -> {fmt(last, '.3f')}")
            evals = [r.get("eval_rewards/answer/mean") for r in common.read_jsonl(run.run_dir / "metrics.jsonl")
                     if r.get("split") == "eval"]
            run.extra["held_out"] = (evals[0], evals[-1]) if len(evals) >= 2 else None
            self.verdict("rl", f"tiny-{kind}: held-out answer reward after training above the base's",
                         len(evals) >= 2 and evals[-1] > evals[0],
                         " -> ".join(fmt(e, ".3f") for e in evals) or "no evaluations logged")

    def _compare(self, stage: str, runs: list[Run], label: str, rtol: float | None = None) -> None:
        """Loss parity of runs over the same batches, against the first."""
        rtol = self.profile.loss_rtol if rtol is None else rtol
        reference = runs[0]
        if not reference.ok and not (reference.skipped and reference.losses):
            return
        for run in runs[1:]:
            if not run.ok and not (run.skipped and run.losses):
                continue
            gap = loss_gap(*_common_steps(run.losses, reference.losses))
            run.extra["loss_gap"] = gap
            self.verdict(stage, f"{run.extra[label]} loss matches {reference.extra[label]}",
                         gap is not None and gap <= rtol,
                         f"largest relative gap {fmt(gap, '.2e')} (tolerance {rtol:g})")

    def stage_attention(self) -> None:
        p = self.profile
        # eager first (the reference of loss parity); torch_varlen: torch's FlashAttention varlen kernels on
        # CUDA (on a CPU its fallback, sdpa per example, which is also what sdpa runs there: sdpa is left out)
        # (torch_varlen before sdpa and flex: it is what "auto" picks on packed rows)
        impls = ["eager", "torch_varlen", "sdpa", "flex_attention"] if p.cuda else ["eager", "torch_varlen"]
        if p.cuda and has_package("flash_attn"):
            impls.append("flash_attention_2")
        else:
            self.skip("flash_attention_2", "needs CUDA" if not p.cuda else "flash_attn is not installed "
                      "(a wheel matching torch and CUDA from github.com/Dao-AILab/flash-attention/releases)")
        runs = []
        for impl in impls:
            run = Run(f"attention-{impl}", "attention", sft_recipe(f"gpu-check-attn-{impl}", self.small_dir,
                                                                    self.data, p, attention=impl,
                                                                    steps=p.short_steps))
            run.extra["impl"] = impl
            runs.append(run)
        self.runs += self.runner.run_all(runs)
        for run in [r for r in runs if r.skipped is None]:
            self.verdict("attention", f"{run.extra['impl']} trains on packed batches", run.ok, "; ".join(run.problems))
        self._compare("attention", runs, "impl")

    def stage_liger(self) -> None:
        p = self.profile
        if not p.cuda:
            self.skip("liger", "Liger's kernels are Triton: CUDA only")
            return
        if not has_package("liger_kernel"):
            self.skip("liger", "liger-kernel is not installed (pip install liger-kernel)")
            return
        # "off" is the attention stage's sdpa run when that ran: the same recipe, batches and seed
        off = next((r for r in self.runs if r.name == "attention-sdpa" and r.ok), None)
        runs = [] if off is None else [off]
        for on in (False, True) if off is None else (True,):
            run = Run(f"liger-{'on' if on else 'off'}", "liger", sft_recipe(
                f"gpu-check-liger-{'on' if on else 'off'}", self.small_dir, self.data, p, attention="sdpa", liger=on,
                steps=p.short_steps))
            runs.append(run)
        for run, on in zip(runs, (False, True), strict=True):
            run.extra["liger"] = "liger on" if on else "liger off"
        self.runs += self.runner.run_all(runs[1:] if off is not None else runs)
        for run in [r for r in runs if r.skipped is None]:
            self.verdict("liger", f"{run.extra['liger']} trains", run.ok, "; ".join(run.problems))
        self._compare("liger", runs, "liger")

    def stage_zero(self) -> None:
        p = self.profile
        runs = []
        for stage in (2, 3):
            run = Run(f"zero{stage}-offload", "zero", sft_recipe(f"gpu-check-zero{stage}", self.small_dir, self.data,
                                                                   p, zero=stage, offload="cpu", steps=p.short_steps))
            runs.append(run)
        self.runs += self.runner.run_all(runs)
        for run in [r for r in runs if r.skipped is None]:
            self.verdict("zero", f"{run.name} (optimizer on the CPU) trains", run.ok, "; ".join(run.problems))

    def stage_fp8(self) -> None:
        """bf16 against fp8 (torchao's float8 linears) on the same packed batches: tokens/s, loss gap."""
        p = self.profile
        if not p.cuda:
            self.skip("fp8", "float8 training needs a CUDA GPU of compute capability 8.9+")
            return
        if not has_package("torchao"):
            self.skip("fp8", "torchao is not installed (make gpu-wheels, or pip install '.[fp8]')")
            return
        if self.nvml is not None and self.nvml.capability and tuple(self.nvml.capability) < (8, 9):
            self.skip("fp8", f"{self.nvml.name} has no FP8 tensor cores (compute capability "
                      f"{self.nvml.capability[0]}.{self.nvml.capability[1]})")
            return
        runs = []
        for precision in ("bf16", "fp8"):
            recipe = sft_recipe(f"gpu-check-{precision}", self.small_dir, self.data, p, steps=p.short_steps)
            recipe["train"]["precision"] = precision
            run = Run(f"fp8-{precision}" if precision == "fp8" else "fp8-bf16", "fp8", recipe)
            run.extra["precision"] = precision
            runs.append(run)
        self.runs += self.runner.run_all(runs)
        for run in [r for r in runs if r.skipped is None]:
            self.verdict("fp8", f"{run.extra['precision']} trains", run.ok, "; ".join(run.problems))
        self._compare("fp8", runs, "precision", rtol=0.05)
        bf16, fp8 = (r.tokens_per_s(self._warmup()) for r in runs)
        self.info["fp8"] = {"bf16": bf16, "fp8": fp8, "speedup": fp8 / bf16 if bf16 and fp8 else None,
                            "gap": runs[1].extra.get("loss_gap")}

    def stage_probe(self) -> None:
        p = self.profile
        targets = [Run("probe-sft", "probe", sft_recipe("gpu-check-probe-sft", self.small_dir, self.data, p)),
                   Run("probe-lora", "probe", method_recipe("lora", self.small_dir, p))]
        for run in targets:
            self.runner.write_recipe(run)
            log(f"  probe: {run.name} ...")
            size = run.recipe["train"]["micro_batch"]
            data = self.runner.probe(run, size)
            self.probes[run.name] = data
            ok_rows = [r for r in data.get("rows", []) if r.get("status") == "ok"]
            if data.get("cut"):
                self.skip(f"probe {run.name}", data["error"])
                continue
            self.verdict("probe", f"{run.name} measures micro_batch 1..{size}", data["returncode"] in (0, 1) and
                         bool(ok_rows), data.get("error", "") or data.get("reason") or "")

    def stage_mfu(self) -> None:
        p = self.profile
        attention = "auto"  # what a user gets: flash-attn 2 when installed, else torch_varlen on packed rows
        liger = p.cuda and has_package("liger_kernel")
        run = Run("mfu-llmtui", "mfu", sft_recipe("gpu-check-mfu", self.big_dir, self.data, p, steps=p.mfu_steps,
                                                 seq_len=p.mfu_seq_len, micro_batch=p.mfu_micro_batch,
                                                 attention=attention, liger=liger))
        # torch.profiler over steps 4..3+N, inside the warm-up the tokens/s leaves out: where a step's time goes
        run.recipe["train"]["profile_steps"] = min(3, max(0, p.mfu_warmup - 3))
        run.extra.update(attention=attention, liger=liger)
        self.runs += self.runner.run_all([run])
        run.extra["kernel"] = _planned_attention(run.run_dir)
        if run.skipped is None:
            self.verdict("mfu", f"llmtui SFT of the ~1 B model trains {p.mfu_steps} steps", run.ok,
                         "; ".join(run.problems))
        task = {"name": "mfu-baseline", "method": "sft", "data": str(self.data), "steps": p.mfu_steps,
                "micro_batch": p.mfu_micro_batch, "lr": 1e-4, "max_seq_len": p.mfu_seq_len, "ranks": 1}
        log("  mfu: the plain Trainer baseline ...")
        before = self.sampler.samples[-1]["used"] if self.sampler and self.sampler.samples else None
        started = time.time()
        left = self.runner.deadline - time.time() if self.runner.deadline else p.timeout
        timeout = max(10.0, min(p.timeout, left))
        base = common.run_baseline(task, self.big_dir, self.work / "baseline", self.env, timeout=timeout)
        seen = self.sampler.between(started, time.time()) if self.sampler else []
        base_peak = max(s["used"] for s in seen) - before if seen and before is not None else None
        finite = all(_finite(r.get("loss")) for r in base["rows"] if r.get("loss") is not None)
        base_ok = base["ok"] and finite
        # stopped by the stage's budget, not failed: the steps it logged still give its tokens/s
        base_cut = not base["ok"] and timeout < p.timeout and base["wall"] >= timeout - 1
        if base_cut:
            self.skip("the plain Trainer baseline", f"cut short by the stage's time budget after "
                      f"{len(base['rows'])} of {p.mfu_steps} steps")
        else:
            self.verdict("mfu", "the plain Trainer baseline trains", base_ok,
                         "" if base_ok else base["log_tail"][-600:])
        params = self.big["parameters"]
        peak = self._peak_flops()
        ours = run.tokens_per_s(p.mfu_warmup) if (run.ok or run.skipped and run.rows) else None
        theirs = common.throughput(base["rows"], p.mfu_warmup) if base_ok or (base_cut and finite) else None
        self.mfu_rows[:0] = [  # before the batching stage's row, when that ran first
            {"what": f"llmtui: packing, {run.extra.get('kernel') or attention}" + (", Liger" if liger else ""),
             "tokens_per_s": ours,
             "mfu": mfu(ours, params, peak), "peak": run.peak, "nvml": run.nvml_peak()},
            {"what": "plain Trainer script (bench/baseline_train.py): padded, sdpa", "tokens_per_s": theirs,
             "mfu": mfu(theirs, params, peak), "peak": None, "nvml": base_peak},
        ]
        self.info["mfu"] = {"parameters": params, "peak_flops": peak, "ratio": (ours / theirs) if ours and theirs else None,
                            "warmup": p.mfu_warmup, "baseline_log": base["log_tail"] if not base_ok else ""}
        if peak is None and p.cuda:
            self.skip("MFU figure", f"no peak bf16 FLOP/s known for {self.nvml.name if self.nvml else '?'}: "
                      "pass --peak-tflops")

    def _peak_flops(self) -> float | None:
        return self.peak_tflops * 1e12 if self.peak_tflops else (peak_flops(self.nvml.name) if self.nvml else None)

    def stage_batching(self) -> None:
        """The mfu run with train.batching = "tokens": each micro batch filled to micro_batch x max_seq_len
        tokens, where the default takes micro_batch examples of whatever length; then twice that budget
        (on the H200 the 16 k run held the GPU at 37 % MFU: whether a bigger step spreads the optimizer's)."""
        p = self.profile
        liger = p.cuda and has_package("liger_kernel")
        runs = []
        for scale in (1, 2):
            budget = scale * p.mfu_micro_batch * p.mfu_seq_len
            recipe = sft_recipe("gpu-check-mfu-tokens", self.big_dir, self.data, p, steps=p.mfu_steps,
                                seq_len=p.mfu_seq_len, micro_batch=p.mfu_micro_batch, liger=liger)
            recipe["train"].update(batching="tokens", tokens_per_batch=budget,
                                   profile_steps=min(3, max(0, p.mfu_warmup - 3)))
            runs.append(Run("mfu-llmtui-tokens" + ("" if scale == 1 else f"-x{scale}"), "batching", recipe))
            runs[-1].extra["budget"] = budget
        self.runs += self.runner.run_all(runs)
        peak = self._peak_flops()
        for run in runs:
            if run.skipped is None:
                self.verdict("batching", f"llmtui SFT of the ~1 B model with {run.extra['budget']}-token batches "
                             f"trains {p.mfu_steps} steps", run.ok, "; ".join(run.problems))
            ours = run.tokens_per_s(p.mfu_warmup) if (run.ok or run.skipped and run.rows) else None
            self.mfu_rows.append({"what": f"llmtui: packing, batches of {run.extra['budget']} tokens"
                                  + (", Liger" if liger else ""), "tokens_per_s": ours,
                                  "mfu": mfu(ours, self.big["parameters"], peak), "peak": run.peak,
                                  "nvml": run.nvml_peak()})
        self.info.setdefault("mfu", {"parameters": self.big["parameters"], "peak_flops": peak, "ratio": None,
                                     "warmup": p.mfu_warmup, "baseline_log": ""})

    # ---------------------------------------------------------- checks over every run

    def check_nvml(self) -> None:
        """NVML's verdicts on the runs not yet checked (it runs after each stage)."""
        if self.nvml is None:
            if not any(what == "NVML readings" for what, _ in self.skipped):
                self.skip("NVML readings", "needs an NVIDIA GPU")
            return
        for run in self.runs:
            if not run.ok or not run.nvml or run.extra.get("nvml_checked"):
                continue
            run.extra["nvml_checked"] = True
            reserved, seen = run.memory("reserved"), run.nvml_peak()
            if reserved and seen is not None and (run.alone or run.nvml_own_peak()):
                extra = seen - reserved
                self.verdict("nvml", f"{run.name}: NVML memory covers torch's reserved memory",
                             -0.02 * reserved <= extra <= NVML_EXTRA_MAX,
                             f"NVML {fmt(seen / GIB, '.2f')} GiB, torch reserved {fmt(reserved / GIB, '.2f')} GiB")
            powers = [s["power_w"] for s in run.nvml if s.get("power_w") is not None]
            temps = [s["temp_c"] for s in run.nvml if s.get("temp_c") is not None]
            utils = [s["util"] for s in run.nvml if s.get("util") is not None]
            limit = self.nvml.power_limit_w
            run.extra.update(power_max=max(powers, default=None), temp_max=max(temps, default=None),
                             util_max=max(utils, default=None))
            sane = (bool(powers) and 0 < max(powers) <= (limit * 1.1 if limit else 2000)
                    and bool(temps) and 10 <= max(temps) <= 105 and bool(utils) and 0 <= max(utils) <= 100)
            self.verdict("nvml", f"{run.name}: power, temperature and utilisation read and plausible", sane,
                         f"power max {fmt(run.extra['power_max'], '.0f')} W (limit {fmt(limit, '.0f')}), "
                         f"temperature max {fmt(run.extra['temp_max'], '.0f')} C, utilisation max "
                         f"{fmt(run.extra['util_max'], '.0f')} %")
            if run.alone and run.stage in ("attention", "mfu") and utils:
                self.verdict("nvml", f"{run.name}: the GPU is busy while it trains", max(utils) >= 50,
                             f"utilisation max {max(utils):.0f} %")
        if self.readers and not self.info.get("readers_checked"):
            self.info["readers_checked"] = True
            direct, tolerance = self.readers.get("direct"), 64 * 2**20  # two reads a few ms apart
            for key in ("ui", "core"):
                value = self.readers.get(key)
                self.verdict("nvml", f"llmtui's {key} reader agrees with NVML",
                             value is not None and abs(value - direct) <= tolerance,
                             self.readers.get(f"{key}_error", "") or f"{fmt((value or 0) / GIB, '.2f')} GiB vs "
                             f"{fmt(direct / GIB, '.2f')} GiB")

    def check_estimates(self) -> None:
        """The estimate assumes every batch full (max_seq_len x micro_batch): its error is taken on runs
        whose steps come near that (FULL_BATCH); on runs of shorter batches it is an upper bound."""
        for run in self.runs:
            if run.ok and run.estimate and run.peak:
                run.extra["estimate_error"] = error_pct(run.estimate, run.peak)
                fill = run.fill()
                run.extra["fill"] = fill
                run.extra["full_batches"] = fill is not None and fill >= FULL_BATCH

    # ---------------------------------------------------------- the report

    def results(self, machine: dict) -> str:
        p = self.profile
        lines = [
            "# GPU acceptance check",
            "",
            "Written by `make gpu-check` (bench/gpu_check.py); do not edit by hand. "
            + ("**CPU smoke run: plumbing only, these figures say nothing about a GPU.**" if not p.cuda else ""),
            "",
            f"Command: `{' '.join(self.info['argv'])}` — {self.info['seconds']:.0f} s in all, "
            f"{'failed checks' if self.failed else 'every check passed'}."
            + (f" **Partial: {self.info['partial']}.**" if self.info.get("partial") else ""),
            "",
            "## Machine",
            "",
            common.machine_markdown(machine),
            "",
            "## Summary",
            "",
            md_table(["stage", "check", "result", "detail"],
                     [[s, w, "pass" if ok else "**FAIL**", d.replace("|", "/").replace("\n", " ")[:300]]
                      for s, w, ok, d in self.findings]),
            "",
        ]
        if self.stage_times:
            lines += ["Stages, in the order they ran:", "",
                      md_table(["stage", "budget", "took", ""],
                               [[st, f"{b:.0f} s" if b else "—", f"{t:.0f} s",
                                 "**cut short by its budget**" if cut else "done"]
                                for st, b, t, cut in self.stage_times]), ""]
        if self.skipped:
            lines += ["Not run here:", ""] + [f"- {what}: {why}" for what, why in self.skipped] + [""]
        lines += ["## Goals", "", self._goals(), ""]
        lines += ["## Runs", "",
                  f"Each run: `llmtui run` of the recipe in the work folder, {p.precision}; tokens/s counts "
                  f"non-padding tokens after step {self._warmup()}; peak = torch's max_memory_allocated "
                  "(on CPU: peak RSS); NVML = the rank's memory as NVML reports it (the device's rise when it ran "
                  "alone); estimate = `llmtui estimate` of the same recipe, error = (estimate − peak) / peak; batch fill "
                  "= a median step's tokens / (max_seq_len × micro_batch), the batch the estimate assumes; to step 1 = "
                  "seconds from `llmtui run` to the first step's row, in parts: the checks before launch (the dry step "
                  "among them), the rank's start to its model plan (imports, the model loaded), to its start event "
                  "(data, the engine), to step 1's row.", ""]
        rows = []
        for run in self.runs:
            if run.skipped:
                rows.append([run.stage, run.name, "skipped", "", "", "", "", "", "", "", "", "", run.skipped])
                continue
            losses = [v for v in run.losses if v is not None]
            rows.append([
                run.stage, run.name, "ok" if run.ok else "**failed**",
                fmt(losses[0] if losses else None, ".4f"), fmt(losses[-1] if losses else None, ".4f"),
                fmt(run.tokens_per_s(self._warmup()), ".0f"), _gib(run.peak), _gib(run.nvml_peak()),
                _gib(run.estimate), fmt(run.extra.get("estimate_error"), "+.1f") + ("%" if run.extra.get(
                    "estimate_error") is not None else ""), _pct(run.extra.get("fill")),
                _seconds(run.first_step_after()) + _phases(run.start_phases()),
                f"{run.ended - run.started:.0f} s" + ("" if run.alone else ", shared GPU"),
            ])
        lines += [md_table(["stage", "run", "result", "first loss", "last loss", "tokens/s", "peak GiB", "NVML GiB",
                            "estimate GiB", "error", "batch fill", "to step 1", "wall"], rows), ""]
        parity = [r for r in self.runs if "loss_gap" in r.extra]
        if parity:
            lines += ["Loss parity (largest relative gap per step against the first run of its stage, tolerance "
                      f"{p.loss_rtol:g}):", "",
                      md_table(["run", "gap"], [[r.name, fmt(r.extra["loss_gap"], ".2e")] for r in parity]), ""]
        if self.probes:
            lines += ["## Probe against the estimate", "", "`llmtui probe RECIPE --max N --steps 3`: measured peak "
                      "(allocator; CPU: RSS growth) and the estimate per micro_batch.", ""]
            prow = []
            for name, data in self.probes.items():
                for r in data.get("rows", []):
                    prow.append([name, r.get("micro_batch"), r.get("status"), _gib(r.get("measured_bytes")),
                                 _gib(r.get("predicted_bytes")),
                                 fmt(error_pct(r.get("predicted_bytes"), r.get("measured_bytes")), "+.1f")])
            lines += [md_table(["recipe", "micro_batch", "status", "measured GiB", "predicted GiB", "error %"], prow), ""]
        if self.nvml is not None:
            lines += ["## NVML", "", f"{self.nvml.name}, driver {self.nvml.driver}, {self.nvml.total / GIB:.1f} GiB, "
                      f"power limit {fmt(self.nvml.power_limit_w, '.0f')} W.", "",
                      md_table(["run", "power max W", "temperature max C", "utilisation max %"],
                               [[r.name, fmt(r.extra.get("power_max"), ".0f"), fmt(r.extra.get("temp_max"), ".0f"),
                                 fmt(r.extra.get("util_max"), ".0f")] for r in self.runs if "power_max" in r.extra]),
                      ""]
        if self.mfu_rows:
            m = self.info["mfu"]
            lines += ["## MFU", "",
                      f"SFT of the ~1 B random model ({m['parameters'] / 1e9:.2f} B parameters), "
                      f"{p.mfu_micro_batch} examples per step, max_seq_len {p.mfu_seq_len}, {p.mfu_steps} steps "
                      f"(tokens/s after step {m['warmup']}). MFU = tokens/s × 6 × parameters / peak bf16 FLOP/s "
                      f"({fmt((m['peak_flops'] or 0) / 1e12, '.1f') if m['peak_flops'] else 'unknown'} TFLOP/s).", "",
                      md_table(["what", "tokens/s", "MFU", "peak GiB", "NVML GiB"],
                               [[r["what"], fmt(r["tokens_per_s"], ".0f"), _pct(r["mfu"]), _gib(r["peak"]),
                                 _gib(r["nvml"])] for r in self.mfu_rows]),
                      "", f"llmtui / plain Trainer: **{fmt(m['ratio'], '.2f')}×**", ""]
        lines += self._profiles()
        no_estimate = [r for r in self.runs if r.extra.get("estimate_failed")]
        if no_estimate:
            lines += ["`llmtui estimate` failed for: " + "; ".join(
                f"{r.name}: {r.extra['estimate_failed']}".replace("\n", " ") for r in no_estimate), ""]
        failed = [r for r in self.runs if not r.skipped and not r.ok]
        if failed:
            lines += ["## Failures", ""]
            for run in failed:
                lines += [f"### {run.name}", "", "; ".join(run.problems), "", "```", run.log_tail, "```", ""]
        lines += ["## Reproduce", "", "```", "make gpu-check                      # every stage",
                  "make gpu-check ARGS='--stages mfu'  # one stage; --methods sft,qlora; --keep keeps the runs",
                  "```", ""]
        return "\n".join(lines)

    def _profiles(self) -> list[str]:
        """The profiled steps of the mfu and batching runs (train.profile_steps): where a step's time goes."""
        from tuiapp.core.run_folder import profile_lines

        out = []
        for run in [r for r in self.runs if r.run_dir is not None and r.stage in ("mfu", "batching")]:
            figures = profile_lines.read(run.run_dir)
            if not figures:
                continue
            busy = figures.get("device_busy")
            out += [f"### Profile of {run.name}", "",
                    f"Steps {figures['first_step']}-{figures['first_step'] + figures['steps'] - 1} under torch.profiler: "
                    f"{figures['step_s']:.3f} s a step" + (f", the GPU busy {busy:.0%} of it (its kernels' time over "
                                                            "the wall time)." if busy is not None else " (CPU clock)."),
                    "",
                    md_table(["op", "calls", "ms", "share of the steps' wall time"],
                             [[op["name"][:70], op["calls"], f"{op['self_us'] / 1e3:.1f}", _pct(op["share"])]
                              for op in figures["ops"][:12]]), ""]
        return out

    def _warmup(self) -> int:
        return 2 if self.profile.cuda else 0

    def _goals(self) -> str:
        rows = []
        m = self.info.get("mfu")
        if m:
            value = self.mfu_rows[0]["mfu"] if self.mfu_rows else None
            rows.append([f"MFU of the 1 B SFT ({self.mfu_rows[0]['what'].split(': ')[-1]})",
                         f"≥ {MFU_GOAL:.0%}", _pct(value), _met(value is not None and value >= MFU_GOAL, value)])
        if m:
            ratio = m.get("ratio")
            rows.append(["llmtui / the plain Trainer script (same GPU, same call)", f"≥ {RATIO_GOAL:g}×",
                         fmt(ratio, ".2f") + "×", _met(ratio is not None and ratio >= RATIO_GOAL, ratio)])
        ratios = [r.memory("reserved") / r.peak for r in self.runs if r.memory("reserved") and r.peak and r.alone]
        if ratios and self.profile.cuda:
            worst = max(ratios)
            rows.append(["torch reserved / allocated peak, worst run alone on the GPU", f"≤ {RESERVED_GOAL:g}",
                         f"{worst:.2f}", _met(worst <= RESERVED_GOAL, worst)])
        for r in [r for r in self.runs if r.extra.get("reward")]:
            first, last = r.extra["reward"]
            rows.append([f"{r.name}: primary reward, first fifth -> last", "≥ 3×", f"{fmt(first, '.3f')} -> "
                         f"{fmt(last, '.3f')}", _met(first is not None and last >= 3 * first and last > 0, last)])
            if r.extra.get("held_out"):
                base, tuned = r.extra["held_out"]
                rows.append([f"{r.name}: held-out answer reward, base -> trained", "above the base's",
                             f"{base:.3f} -> {tuned:.3f}", _met(tuned > base, tuned)])
        f8 = self.info.get("fp8")
        if f8:
            rows.append(["fp8 against bf16: tokens/s, loss gap", "faster, gap ≤ 0.05",
                         f"{fmt(f8['speedup'], '.2f')}×, {fmt(f8['gap'], '.2e')}",
                         _met(bool(f8["speedup"] and f8["speedup"] > 1 and (f8["gap"] or 1) <= 0.05), f8["speedup"])])
        measured = [r for r in self.runs if r.extra.get("estimate_error") is not None]
        errors = [r.extra["estimate_error"] for r in measured if r.extra.get("full_batches")]
        if errors and self.profile.cuda:  # on a CPU the peak is the process's RSS: no estimate of it
            worst = max(errors, key=abs)
            rows.append([f"memory estimate error, worst run of full batches ({len(errors)})", f"≤ {ESTIMATE_GOAL:.0%}",
                         f"{worst:+.1f}%", _met(abs(worst) <= 100 * ESTIMATE_GOAL, worst)])
        bounds = [r for r in measured if not r.extra.get("full_batches")]
        if bounds and self.profile.cuda:
            held = sum(r.extra["estimate_error"] >= 0 for r in bounds)
            rows.append(["memory estimate ≥ peak, runs of shorter batches", f"{len(bounds)} of {len(bounds)}",
                         f"{held} of {len(bounds)}", _met(held == len(bounds), held)])
        parity = [r.extra["loss_gap"] for r in self.runs if r.stage == "attention" and "loss_gap" in r.extra]
        if parity:
            rows.append(["attention implementations, loss gap", f"≤ {self.profile.loss_rtol:g}",
                         fmt(max(parity), ".2e"), _met(max(parity) <= self.profile.loss_rtol, 1)])
        return md_table(["goal", "target", "measured", ""], rows) if rows else "(no goal was measured)"


def _gib(value) -> str:
    return fmt(value / GIB, ".2f") if isinstance(value, (int, float)) else "—"


def _seconds(value) -> str:
    return f"{value:.0f} s" if value is not None else ""


def _phases(parts: list[float] | None) -> str:
    """' (checks 20 · model 25 · data 10 · step 18)' of a run's start, or ''."""
    if not parts:
        return ""
    names = ("checks", "model", "data", "step")
    return " (" + " · ".join(f"{name} {value:.0f}" for name, value in zip(names, parts, strict=True)) + ")"


def _pct(value) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, (int, float)) else "—"


def _met(ok: bool, value) -> str:
    return "—" if value is None else ("met" if ok else "**missed**")


# ------------------------------------------------------------------ main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cpu-smoke", action="store_true", help="run the plumbing on CPU: tiny sizes, 2 steps, fp32")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}; "
                   f"run only when named: {', '.join(EXTRA_STAGE_BUDGET_S)}")
    p.add_argument("--methods", default="all", help="methods of the methods stage (default: every method.kind)")
    p.add_argument("--out", type=Path, default=None, help="the report (default bench/GPU_RESULTS.md; "
                   "--cpu-smoke: WORK/GPU_RESULTS.md)")
    p.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (runs, recipes, models)")
    p.add_argument("--parallel", type=int, default=None, help="runs at once in the methods stage")
    p.add_argument("--peak-tflops", type=float, default=None, help="peak dense bf16 TFLOP/s of the GPU, for MFU "
                   "(default: from its NVML name)")
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds for the stages named, shared in their budgets' proportions (default: each "
                   f"its own, {sum(STAGE_BUDGET_S.values())} for every stage, on a GPU; none in the CPU smoke; "
                   "0 = no budget)")
    p.add_argument("--wheels", type=Path, default=WHEELS, help="folder of wheels to install first when their "
                   "package is missing (make gpu-wheels: liger-kernel, torchao, bitsandbytes)")
    p.add_argument("--build-model", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.build_model:
        for spec in json.loads(args.build_model):
            build_model(Path(spec["folder"]), spec["shape"], Path(spec["cache"]), spec["device"], spec["dtype"],
                        spec["arch"])
        return EXIT_OK
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    kinds = method_kinds()
    methods = kinds if args.methods == "all" else [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [s for s in stages if s not in STAGES and s not in EXTRA_STAGE_BUDGET_S] + \
        [m for m in methods if m not in kinds]
    if bad:
        print(f"error: unknown stage or method {', '.join(bad)}\n  fix: stages are {', '.join(STAGES)} "
              f"(and, named, {', '.join(EXTRA_STAGE_BUDGET_S)}); "
              f"methods are {', '.join(kinds)}", file=sys.stderr)
        return EXIT_BAD_ARGS
    torch_cuda = None
    if not args.cpu_smoke:
        ok, why = cuda_state()
        torch_cuda = why
        if not ok:
            print(f"gpu-check: nothing ran: {why}. It needs a CUDA GPU; bench/GPU_RESULTS.md is unchanged. "
                  "(`--cpu-smoke` runs its plumbing on this CPU.)")
            return EXIT_OK
    profile = SMOKE if args.cpu_smoke else GPU
    if args.parallel:
        profile = Profile(**{**profile.__dict__, "parallel": args.parallel})
    work = args.work or common.temp_dir("gpu-check")
    work.mkdir(parents=True, exist_ok=True)
    out = args.out or (work / "GPU_RESULTS.md" if args.cpu_smoke else RESULTS)
    env = common.bench_env(work / "cache", work / "hf-datasets")
    env["TORCH_EXTENSIONS_DIR"] = _USER_EXTENSIONS or _default_extensions()
    if args.cpu_smoke:
        env["LLMTUI_FORCE_CPU"] = "1"
    check = Check(profile, work, env, methods, stages, peak_tflops=args.peak_tflops,
                  budget_scale=stage_budget_scale(args.budget, args.cpu_smoke, stages))
    if not args.cpu_smoke:
        for what, why in install_wheels(args.wheels):
            check.skip(what, why)
    check.info["torch_cuda"] = torch_cuda
    check.info["argv"] = ["bench/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]
    common.exit_on_sigterm()
    started = time.time()
    check.info["load"] = os.getloadavg() if hasattr(os, "getloadavg") else ()
    try:
        try:
            check.prepare()
        except (RuntimeError, OSError) as exc:
            print(f"gpu-check: failed before any run: {exc}", file=sys.stderr)
            return EXIT_FAILED
        machine = machine_info(check)
        done = []
        for stage in stages:  # in the order given: a check cut short has done the first ones
            log(f"stage {stage}")
            if done and check.nvml is not None and not check.readers:  # between stages, the GPU is quiet
                check.readers = check.nvml.project_readers()
            check.run_stage(stage)
            done.append(stage)
            check.check_nvml()
            if len(done) < len(stages):  # a report so far: a check cut short still leaves its figures
                check.check_estimates()
                check.info["seconds"] = time.time() - started
                check.info["partial"] = f"stages done so far: {', '.join(done)} (the check was still running)"
                write_report(out, check.results(machine))
        check.info.pop("partial", None)
        check.check_estimates()
        check.info["seconds"] = time.time() - started
        write_report(out, check.results(machine))
        print(f"gpu-check: {'FAILED' if check.failed else 'passed'}: {sum(f[2] for f in check.findings)}/"
              f"{len(check.findings)} checks, {len(check.skipped)} not run here; report: {out}")
        return EXIT_FAILED if check.failed else EXIT_OK
    finally:
        check.close()
        if not args.keep and args.work is None:
            common.remove(work)


def stage_budget_scale(budget: float | None, cpu_smoke: bool, stages=STAGES) -> float | None:
    """The stage budgets' scale for --budget, shared among the stages named (None: no budgets; the CPU smoke has
    none unless asked)."""
    if budget is None:
        return None if cpu_smoke else 1.0
    budgets = {**STAGE_BUDGET_S, **EXTRA_STAGE_BUDGET_S}
    return budget / sum(budgets[stage] for stage in stages) if budget > 0 else None


def install_wheels(folder: Path) -> list[tuple[str, str]]:
    """The optional packages missing here installed from `folder` (no index); what stays missing, and why."""
    import importlib

    missing = [(module, dist) for module, dist in OPTIONAL.items() if not has_package(module)]
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    out = []
    for module, dist in missing:
        found = [w for w in wheels if w.name.split("-")[0].lower().replace("_", "-") == dist]
        if not found:
            out.append((dist, f"optional, not installed and no wheel in {folder} (make gpu-wheels): not run"))
            continue
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", str(found[-1])],
                              capture_output=True, text=True)
        importlib.invalidate_caches()
        if done.returncode != 0 or not has_package(module):
            out.append((dist, f"its wheel {found[-1].name} did not install: {(done.stderr or '').strip()[-200:]}"))
        else:
            log(f"installed {found[-1].name}")
    return out


def write_report(out: Path, text: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")


def _default_extensions() -> str:
    from tuiapp.core.plan.launcher import torch_extensions_dir

    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    return torch_extensions_dir(env)


def machine_info(check: Check) -> dict:
    """bench/common.py's machine table, with the versions read from the installed metadata (importing
    torch, transformers and deepspeed to ask them takes a minute on a busy machine)."""
    import platform
    from importlib import metadata

    import psutil

    info = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"), "host": platform.node(),
        "os": f"{platform.system()} {platform.release()}", "python": platform.python_version(),
        "cpu": common.cpu_model(), "cores": f"{psutil.cpu_count(logical=False)} physical / {psutil.cpu_count()} logical",
        "ram": f"{psutil.virtual_memory().total / GIB:.1f} GiB", "gpu": common.gpu_info(),
        "load average at start": " ".join(f"{x:.2f}" for x in check.info.get("load", ())),
    }
    if check.nvml is not None:
        info["driver"] = check.nvml.driver
    if check.info.get("torch_cuda"):
        info["torch CUDA"] = check.info["torch_cuda"]
    for name in ("torch", "transformers", "deepspeed", "accelerate", "peft", "trl", "datasets", "bitsandbytes",
                 "flash-attn", "liger-kernel"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = "not installed"
    return info


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
