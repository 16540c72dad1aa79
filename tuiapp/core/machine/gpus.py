"""GPUs seen by NVML, without torch: detection, CUDA availability and the visible count."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple


class GpuProcess(NamedTuple):
    pid: int
    used_bytes: int


@dataclass(frozen=True)
class GpuInfo:
    index: int  # NVML index (PCI bus order, as nvidia-smi shows)
    name: str
    total_bytes: int
    used_bytes: int
    other_processes: list[GpuProcess] = field(default_factory=list)
    util_percent: float | None = None  # None where NVML cannot tell
    power_watts: float | None = None
    temperature_c: float | None = None
    capability: tuple[int, int] | None = None  # CUDA compute capability (9, 0) = Hopper; None where NVML cannot tell


def _maybe(read):
    try:
        return read()
    except Exception:
        return None


def read_devices(nvml, *, processes: bool = True) -> list[GpuInfo]:
    """Every device of an initialised NVML module (pynvml): memory, utilisation, power, temperature
    and, with `processes`, the compute processes other than this one. The one NVML reader of
    llmtui: preflight's detection and the run view's monitor both read through it."""
    gpus = []
    try:
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            others = []
            if processes:
                running = _maybe(lambda h=handle: nvml.nvmlDeviceGetComputeRunningProcesses(h)) or []
                others = [GpuProcess(p.pid, int(p.usedGpuMemory or 0)) for p in running if p.pid != os.getpid()]
            util = _maybe(lambda h=handle: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu))
            power = _maybe(lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0)  # milliwatts
            temperature = _maybe(lambda h=handle: float(nvml.nvmlDeviceGetTemperature(h, 0)))  # 0: the GPU die
            capability = _maybe(lambda h=handle: tuple(nvml.nvmlDeviceGetCudaComputeCapability(h)))
            gpus.append(GpuInfo(index, name.decode() if isinstance(name, bytes) else str(name),
                                int(memory.total), int(memory.used), others, util, power, temperature,
                                capability))
    except Exception:
        return gpus
    return gpus


def detect_gpus() -> list[GpuInfo]:
    """GPUs seen by NVML, with compute processes other than this one; [] without NVML."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        return read_devices(pynvml)
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def cuda_available(gpus: list[GpuInfo] | None = None) -> bool:
    """Whether runs will get CUDA devices, judged without importing torch."""
    if os.environ.get("LLMTUI_FORCE_CPU") == "1":
        return False
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    if gpus is None:
        gpus = detect_gpus()
    if gpus:
        return True
    proc = Path("/proc/driver/nvidia/gpus")
    return proc.is_dir() and any(proc.iterdir())


def cuda_device_count() -> int:
    """GPUs visible through NVML; 0 on a machine without NVIDIA GPUs or with LLMTUI_FORCE_CPU."""
    if os.environ.get("LLMTUI_FORCE_CPU") == "1":
        return 0
    count = len(detect_gpus())
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip()]
        return min(count, len(ids))
    return count
