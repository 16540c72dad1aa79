"""train.profile_steps: torch.profiler over a few training steps of rank 0, after the first PROFILE_AFTER
(core.config.recipe; compiling, autotuning and the allocator's first growth are done by then). It writes the run folder's
profile/ (core.run_folder.rundir): the ops by self time (torch's own table), a summary llmtui show reads
(the steps' wall time, how much of it the device was busy, the top ops) and the Chrome trace, gzipped.
"""

from __future__ import annotations

import gzip
import json
import shutil
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from tuiapp.core.config.recipe import PROFILE_AFTER
from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder.rundir import RunDir

TOP_OPS = 25  # ops kept in the summary


def _device_time(event) -> float:
    """An op's own time on the device, µs (torch 2.4+ names it device; older releases cuda)."""
    return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)) or 0.0)


def summary(averages, wall_s: float, steps: int, first_step: int, on_device: bool) -> dict:
    """The profile's figures: each top op's calls and self time (device time on a GPU, else CPU time), its
    share of the steps' wall time, and how busy the device was (its ops' self time over the wall time)."""
    timed = [(e, _device_time(e) if on_device else float(e.self_cpu_time_total)) for e in averages]
    timed = [(e, t) for e, t in timed if t > 0]
    timed.sort(key=lambda pair: -pair[1])
    wall_us = max(wall_s * 1e6, 1e-9)
    busy = sum(t for _, t in timed) / wall_us if on_device else None
    return {
        "first_step": first_step, "steps": steps, "wall_s": wall_s, "step_s": wall_s / max(steps, 1),
        "clock": "device" if on_device else "cpu", "device_busy": busy,
        "ops": [{"name": e.key, "calls": int(e.count), "self_us": t, "share": t / wall_us}
                for e, t in timed[:TOP_OPS]],
    }


class StepProfiler(TrainerCallback):
    """Profiles `steps` optimizer steps of the main process after PROFILE_AFTER; writes profile/."""

    def __init__(self, run_dir: Path, steps: int, recorder=None):
        self.folder = RunDir(run_dir)
        self.steps, self.recorder = steps, recorder
        self.profiler = None
        self.started = 0.0
        self.first_step = 0
        self.done = False

    def on_step_begin(self, args, state, control, **kwargs):
        if self.done or self.profiler is not None or not state.is_world_process_zero:
            return
        if state.global_step < PROFILE_AFTER:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        self.profiler = torch.profiler.profile(activities=activities)
        self.profiler.__enter__()
        self.first_step, self.started = state.global_step + 1, time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.profiler is not None and state.global_step - self.first_step + 1 >= self.steps:
            self._finish(state)

    def on_train_end(self, args, state, control, **kwargs):
        if self.profiler is not None:  # the run ended inside the profiled steps
            self._finish(state)

    def _finish(self, state) -> None:
        on_device = torch.cuda.is_available()
        if on_device:
            torch.cuda.synchronize()
        wall_s = time.perf_counter() - self.started
        profiler, self.profiler, self.done = self.profiler, None, True
        profiler.__exit__(None, None, None)
        steps = state.global_step - self.first_step + 1
        folder = self.folder.profile_dir
        folder.mkdir(parents=True, exist_ok=True)
        averages = profiler.key_averages()
        sort_by = "self_device_time_total" if on_device else "self_cpu_time_total"
        self.folder.profile_ops.write_text(averages.table(sort_by=sort_by, row_limit=60), encoding="utf-8")
        figures = summary(averages, wall_s, steps, self.first_step, on_device)
        self.folder.profile_summary.write_text(json.dumps(figures, indent=1), encoding="utf-8")
        plain = self.folder.profile_trace.with_suffix("")  # torch writes it plain, gzipped below
        profiler.export_chrome_trace(str(plain))
        with open(plain, "rb") as source, gzip.open(self.folder.profile_trace, "wb") as target:
            shutil.copyfileobj(source, target)
        plain.unlink()
        if self.recorder is not None:
            self.recorder.event(state, {"event": ev.PROFILED, "time": time.time(), "first_step": self.first_step,
                                        "steps": steps, "wall_s": wall_s, "device_busy": figures["device_busy"]})
