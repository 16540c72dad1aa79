"""The one NVML reader (core.machine.gpus.read_devices), used by preflight's detection and the run view's
monitor. NVML cannot run on this CPU machine, so a stand-in module with pynvml's calls plays one
GPU whose utilisation query fails; tests/ui/test_data.py reads real NVML where a GPU is visible."""

import os
from types import SimpleNamespace

from tuiapp.core.machine.gpus import read_devices
from tuiapp.core.run_folder.rundata import RunData
from tuiapp.ui.run_panes import memory_text
from tuiapp.ui.system import SystemSample, SystemSampler

GB = 1 << 30


class OneGpu:
    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"handle{index}"

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=80 * GB, used=12 * GB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=4242, usedGpuMemory=3 * GB), SimpleNamespace(pid=os.getpid(), usedGpuMemory=GB)]

    def nvmlDeviceGetUtilizationRates(self, handle):
        raise RuntimeError("not supported on this device")

    def nvmlDeviceGetPowerUsage(self, handle):
        return 312_500  # milliwatts

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61


def test_one_reader_gives_memory_processes_power_and_temperature():
    [gpu] = read_devices(OneGpu())
    assert (gpu.index, gpu.name, gpu.total_bytes, gpu.used_bytes) == (0, "NVIDIA H100 80GB HBM3", 80 * GB, 12 * GB)
    assert [p.pid for p in gpu.other_processes] == [4242]  # this process is not 'another'
    assert gpu.util_percent is None and gpu.power_watts == 312.5 and gpu.temperature_c == 61.0
    assert read_devices(OneGpu(), processes=False)[0].other_processes == []


def test_the_run_views_monitor_reads_through_the_same_reader():
    sampler = SystemSampler()
    sampler._nvml = OneGpu()  # the sampler keeps NVML initialised; here the stand-in
    sample = sampler.sample()
    assert sample.source == "nvml" and sample.gpus[0].used == 12 * GB and sample.gpus[0].power_watts == 312.5
    text = memory_text(RunData(), SystemSample(gpus=sample.gpus, source="nvml"), monitor=True)
    assert "GPU0 NVIDIA H100 80GB HBM3: util ?, mem" in text and "312 W, 61°C" in text
