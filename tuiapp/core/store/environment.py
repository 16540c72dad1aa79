"""What a run is made with, gathered at launch into its provenance.json (read by
tuiapp.core.run_folder.provenance): llmtui's version and git revision (from a checkout), Python,
the OS, CPU and GPUs, the torch side's package versions (read with importlib.metadata: nothing is
imported), the seed, a fingerprint of the data (a sha256 of each local file; a demo's version) and
the recipe after every --set. `llmtui reproduce` gathers it again and names each difference."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import psutil

from tuiapp.core.config.recipe import DatasetSpec, Recipe
from tuiapp.core.data.datasets import resolve_source
from tuiapp.core.data.demo_data import DEMO_VERSION
from tuiapp.core.machine.gpus import detect_gpus
from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.provenance import path_of

FORMAT = 1
# the packages that decide what a run computes (those not installed are left out)
PACKAGES = ("torch", "transformers", "peft", "trl", "deepspeed", "datasets", "accelerate", "tokenizers", "safetensors",
            "huggingface_hub", "kernels", "flash_attn", "liger_kernel", "bitsandbytes", "triton", "vllm", "lm_eval",
            "numpy")
WHOLE_HASH_BYTES = 1 << 30  # a larger file is fingerprinted by its size and 8 MB of its head and tail
SAMPLE_BYTES = 8 << 20
CHECKOUT = Path(__file__).resolve().parents[3]  # the folder holding tuiapp/ (a git checkout when run from one)


def package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def torch_cuda(versions: dict[str, str]) -> str | None:
    """torch's build: 'cpu', 'cu128'... from its local version (2.13.0+cu128), else the CUDA runtime
    wheel it depends on."""
    torch = versions.get("torch")
    if torch is None:
        return None
    if "+" in torch:
        return torch.split("+", 1)[1]
    for runtime in ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime"):
        try:
            return "cuda " + importlib.metadata.version(runtime)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, timeout=10,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def llmtui_code() -> dict:
    """llmtui's version, and its git revision when it runs from a checkout (dirty: uncommitted changes)."""
    try:
        version = importlib.metadata.version("llmtui")
    except importlib.metadata.PackageNotFoundError:
        version = None
    out: dict = {"version": version}
    if (CHECKOUT / ".git").exists():
        revision = _git("rev-parse", "HEAD")
        if revision:
            out["revision"] = revision
            out["dirty"] = bool(_git("status", "--porcelain", "--untracked-files=no", "--", "tuiapp"))
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        return driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def machine() -> dict:
    out: dict = {"cpu": _cpu_name(), "cores": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total}
    gpus = detect_gpus()
    if gpus:
        out["gpus"] = [{"name": gpu.name, "memory_bytes": gpu.total_bytes} for gpu in gpus]
        out["driver"] = _driver()
    return out


def file_hash(path: Path) -> dict:
    """A file's fingerprint: its size and sha256 (of its whole content up to 1 GB, else of its
    first and last 8 MB, marked 'sampled')."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        if size <= WHOLE_HASH_BYTES:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
            return {"path": str(path), "bytes": size, "sha256": digest.hexdigest()}
        digest.update(handle.read(SAMPLE_BYTES))
        handle.seek(size - SAMPLE_BYTES)
        digest.update(handle.read(SAMPLE_BYTES))
    return {"path": str(path), "bytes": size, "sha256": digest.hexdigest(), "sampled": True}


def _source(spec: DatasetSpec, base_dir: Path) -> dict:
    out: dict = {"source": spec.name}
    try:
        source = resolve_source(spec, base_dir)
    except Exception as exc:  # a source that is gone (reproduce names it as a difference)
        out["missing"] = str(getattr(exc, "message", exc))
        return out
    if source.kind == "demo":
        out["demo_version"] = DEMO_VERSION
    elif source.kind == "hub":
        out["hub"] = True
    else:
        out["files"] = [file_hash(path) for path in source.files]
    return out


def data_fingerprint(recipe: Recipe, base_dir: Path) -> list[dict]:
    """Each source the run reads (a mixture's each, and a held-out file), with its fingerprint."""
    specs = recipe.dataset.source_specs() or [recipe.dataset]
    out = []
    for spec in specs:
        out.append(_source(spec, base_dir))
        if isinstance(spec.eval_split, str):
            out.append(_source(DatasetSpec(name=spec.eval_split, format=spec.format, columns=dict(spec.columns)),
                               base_dir))
    return out


def collect(recipe: Recipe, overrides: list[str] | None = None, base_dir: Path | None = None) -> dict:
    """The provenance of a run of `recipe` launched here, now."""
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    versions = package_versions()
    return {
        "format": FORMAT,
        "time": time.time(),
        "llmtui": llmtui_code(),
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "os": platform.platform(),
        "machine": machine(),
        "packages": versions,
        "torch_cuda": torch_cuda(versions),
        "seed": recipe.train.seed,
        "data": data_fingerprint(recipe, base),
        "cwd": str(base),
        "overrides": list(overrides or []),
        "recipe": recipe.model_dump(mode="json"),
    }


def write(run_dir: Path, recipe: Recipe, overrides: list[str] | None = None, base_dir: Path | None = None) -> dict:
    record = collect(recipe, overrides, base_dir)
    atomic_write_text(path_of(run_dir), json.dumps(record, indent=2, default=str))
    return record
