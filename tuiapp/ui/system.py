"""This machine's GPUs (NVML, read by tuiapp.core.machine.gpus.read_devices, the one NVML reader) or,
without them, host RAM and CPU (psutil), for the run view.

`SystemSampler.sample()` blocks briefly (NVML calls); the run view calls it from a thread
worker. Nothing here raises: a machine without NVIDIA GPUs falls back to psutil.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import psutil

from tuiapp.core.machine import gpus


@dataclass
class GpuSample:
    index: int
    name: str
    util: float | None  # percent
    used: float  # bytes
    total: float
    power_watts: float | None = None
    temperature_c: float | None = None


@dataclass
class SystemSample:
    gpus: list[GpuSample] = field(default_factory=list)
    cpu_percent: float | None = None
    ram_used: float | None = None
    ram_total: float | None = None
    source: str = "psutil"


class SystemSampler:
    def __init__(self) -> None:
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() > 0:
                self._nvml = pynvml
            else:
                pynvml.nvmlShutdown()
        except Exception:
            self._nvml = None
        psutil.cpu_percent(None)  # the first call only starts the measurement

    def sample(self) -> SystemSample:
        memory = psutil.virtual_memory()
        out = SystemSample(
            cpu_percent=psutil.cpu_percent(None), ram_used=float(memory.total - memory.available),
            ram_total=float(memory.total),
        )
        if self._nvml is None:
            return out
        out.gpus = [GpuSample(g.index, g.name, g.util_percent, float(g.used_bytes), float(g.total_bytes),
                              g.power_watts, g.temperature_c)
                    for g in gpus.read_devices(self._nvml, processes=False)]
        out.source = "nvml" if out.gpus else "psutil"
        return out

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None
