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
    gpus = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception:
                processes = []
            others = [
                GpuProcess(p.pid, int(p.usedGpuMemory or 0))
                for p in processes if p.pid != os.getpid()
            ]
            gpus.append(GpuInfo(
                index, name.decode() if isinstance(name, bytes) else str(name),
                int(memory.total), int(memory.used), others,
            ))
    except Exception:
        return gpus
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return gpus


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
