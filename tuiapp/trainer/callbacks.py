"""Trainer callbacks: the rank-0 metrics/events writer, graceful stop, and eval samples."""

from __future__ import annotations

import math
import os
import resource
import signal
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from transformers import TrainerCallback

from tuiapp.core.metrics import (
    PREFERENCE_METRICS,
    EvalRow,
    JsonlWriter,
    TrainRow,
    rank_memory_path,
    read_rank_memory,
    write_rank_memory,
)
from tuiapp.trainer import phases


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _sync_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def memory_snapshot() -> dict:
    """This rank's memory: CUDA allocator figures, or process RSS on CPU."""
    rss = psutil.Process().memory_info().rss
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        return {
            "device": f"cuda:{device}",
            "allocated": torch.cuda.memory_allocated(device),
            "reserved": torch.cuda.memory_reserved(device),
            "peak": torch.cuda.max_memory_allocated(device),
            "rss": rss,
        }
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"device": "cpu", "rss": rss, "peak": peak_kb * 1024}


_host_group_cache: list = []


def _host_group():
    """A gloo process group for small host-side agreements: the default group when it is gloo
    already (CPU), else one made once, so the flag never goes through a device stream."""
    if dist.get_backend() == "gloo":
        return None
    if not _host_group_cache:
        _host_group_cache.append(dist.new_group(backend="gloo"))
    return _host_group_cache[0]


class GracefulStop(TrainerCallback):
    """SIGTERM asks for a stop; all ranks agree at a step boundary, save, then end training.

    No rank waits for the others to agree: each step end starts an asynchronous all_reduce (MAX)
    of this rank's flag on a host (gloo) group and reads the one it started a step earlier, done by
    then. Every rank reads the same agreed flag at the same step, one step after the signal."""

    def __init__(self):
        self.requested = False
        self.stopped = False
        self._group = None
        self._flag = None
        self._pending = None
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame):
        self.requested = True

    def on_train_begin(self, args, state, control, **kwargs):
        if _distributed():
            self._group = _host_group()

    def _agreed(self) -> bool:
        """The flag agreed by the all_reduce started at the previous step end."""
        if self._pending is None:
            return False
        self._pending.wait()
        self._pending = None
        return bool(self._flag.item())  # a host tensor: no device sync

    def on_step_end(self, args, state, control, **kwargs):
        if _distributed():
            agreed = self._agreed()
            self._flag = torch.tensor([1 if self.requested else 0], dtype=torch.int32)
            self._pending = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        else:
            agreed = self.requested
        if agreed:
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._pending is not None:  # the last step's agreement: every rank started it
            self._pending.wait()
            self._pending = None


def preference_metrics(logs: dict, prefix: str = "") -> dict:
    """TRL's preference metrics under llmtui's keys (PREFERENCE_METRICS): DPO, SimPO/CPO, ORPO
    and KTO log rewards/* (KTO also kl) already; the reward model's accuracy/margin/mean_reward
    become rewards/accuracies, rewards/margins and the chosen and rejected means."""
    out = {key: logs[prefix + key] for key in PREFERENCE_METRICS if isinstance(logs.get(prefix + key), (int, float))}
    accuracy, margin, mean = (logs.get(prefix + k) for k in ("accuracy", "margin", "mean_reward"))
    if isinstance(accuracy, (int, float)):
        out.setdefault("rewards/accuracies", accuracy)
    if isinstance(margin, (int, float)):
        out.setdefault("rewards/margins", margin)
        if isinstance(mean, (int, float)):  # the mean over chosen and rejected, which are as many
            out.setdefault("rewards/chosen", mean + margin / 2)
            out.setdefault("rewards/rejected", mean - margin / 2)
    return out


MEMORY_EVERY_S = 2.0  # how often a rank rewrites its ranks/memory-<rank>.json


class RunRecorder(TrainerCallback):
    """Writes metrics.jsonl and events.jsonl (rank 0 only). Each rank writes its own memory to
    ranks/memory-<rank>.json (at most every MEMORY_EVERY_S, no collective); rank 0's rows carry
    its fresh figures and the others' latest files. `loss_is_nll`: the loss is a token
    cross-entropy (eval rows then carry its perplexity); not for preference losses."""

    def __init__(self, run_dir: Path, host: str, loss_is_nll: bool = True):
        self.run_dir = Path(run_dir)
        self.host = host
        self.loss_is_nll = loss_is_nll
        self.metrics = None
        self.events = None
        self._last_time = None
        self._last_tokens = 0
        self._last_step = 0
        self._memory_written = 0.0
        self._others: dict = {}  # rank 0: the other ranks' latest memory files
        self.rank = int(os.environ.get("RANK", "0"))
        self.samples: list[dict] = []

    def _is_writer(self, state) -> bool:
        return state.is_world_process_zero

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        phases.enter("first step")
        if self._is_writer(state):
            for rank in read_rank_memory(self.run_dir):  # an earlier attempt's with more ranks
                if int(rank[4:]) >= max(1, args.world_size):
                    rank_memory_path(self.run_dir, int(rank[4:])).unlink(missing_ok=True)
        self._rank_memory(force=True)
        if _distributed():  # once: every rank's file exists before rank 0's first row reads them
            dist.barrier()
            self._rank_memory(force=True)
        if self._is_writer(state):
            self.metrics = JsonlWriter(self.run_dir / "metrics.jsonl")
            self.events = JsonlWriter(self.run_dir / "events.jsonl")
            total = trainable = 0
            for param in model.parameters():
                n = getattr(param, "ds_numel", param.numel())
                total += n
                trainable += n if param.requires_grad else 0
            self.events.write({
                "event": "started",
                "step": state.global_step,
                "max_steps": state.max_steps,
                "world_size": args.world_size,
                "params": total,
                "trainable_params": trainable,
                "device": str(args.device),
            })
        self._last_time = time.time()
        self._last_tokens = state.num_input_tokens_seen
        self._last_step = state.global_step

    def _rank_memory(self, force: bool = False) -> dict:
        """This rank's memory, written to its file when MEMORY_EVERY_S passed; on rank 0 every
        rank's latest figures as a row's `mem` (its own fresh)."""
        mine = memory_snapshot()
        mine["host"] = self.host
        # node rank: DeepSpeed's launcher sets CROSS_RANK, torchrun GROUP_RANK
        mine["node"] = int(os.environ.get("CROSS_RANK") or os.environ.get("GROUP_RANK") or 0)
        now = time.monotonic()
        if force or now - self._memory_written >= MEMORY_EVERY_S:
            self._memory_written = now
            try:
                write_rank_memory(self.run_dir, self.rank, mine)
            except OSError:
                pass  # a full disk must not end training; the memory column just lags
            if self.rank == 0 and _distributed():
                self._others = read_rank_memory(self.run_dir)
        if self.rank != 0:
            return {}
        memory = {**self._others, f"rank{self.rank}": mine}
        return dict(sorted(memory.items(), key=lambda item: int(item[0][4:])))

    def on_step_end(self, args, state, control, **kwargs):
        if not getattr(self, "_first", False):
            self._first = True
            phases.enter("training")
            if self.events is not None:
                self.events.write({"event": "first_step", "step": state.global_step})

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        memory = self._rank_memory()
        if not self._is_writer(state) or self.metrics is None:
            return
        if "loss" not in logs or "train_loss" in logs:
            return  # eval rows are written in on_evaluate; the final summary is not a step
        now = time.time()
        tokens = state.num_input_tokens_seen
        dt = max(now - (self._last_time or now), 1e-9)
        steps = state.global_step - self._last_step
        row: TrainRow = {
            "step": state.global_step,
            "max_steps": state.max_steps,
            "epoch": logs.pop("epoch", state.epoch),
            "loss": logs.pop("loss", None),
            "lr": logs.pop("learning_rate", None),
            "grad_norm": logs.pop("grad_norm", None),
            "tokens": tokens,
            "tokens_per_s": (tokens - self._last_tokens) / dt if steps > 0 else None,
            "samples_per_s": steps * args.train_batch_size * max(1, args.world_size) / dt if steps > 0 else None,
            "step_time": dt / steps if steps > 0 else None,
            "mem": memory,
        }
        for key in ("num_input_tokens_seen", "train_runtime", "train_tokens_per_second"):
            logs.pop(key, None)
        row.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})
        row.update(preference_metrics(logs))
        self.metrics.write(row)
        self._last_time, self._last_tokens, self._last_step = now, tokens, state.global_step

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not self._is_writer(state) or self.metrics is None:
            return
        loss = (metrics or {}).get("eval_loss")
        row: EvalRow = {"split": "eval", "step": state.global_step, "epoch": state.epoch, "eval_loss": loss}
        if isinstance(loss, (int, float)) and math.isfinite(loss) and self.loss_is_nll:
            row["perplexity"] = math.exp(min(loss, 50.0))
        row.update({f"eval_{k}": v for k, v in preference_metrics(metrics or {}, "eval_").items()})
        if self.samples:
            row["samples"] = self.samples
        self.metrics.write(row)
        self.events.write({"event": "eval", "step": state.global_step, "eval_loss": loss})

    def on_save(self, args, state, control, **kwargs):
        if self._is_writer(state) and self.events is not None:
            self.events.write({"event": "checkpoint", "step": state.global_step})

    def event(self, state, record: dict) -> None:
        if self._is_writer(state) and self.events is not None:
            self.events.write(record)


class EvalSamples(TrainerCallback):
    """Generates answers to the recipe's sample prompts at each eval (all ranks take part)."""

    def __init__(self, recorder: RunRecorder, tokenizer, prompts: list[str], max_new_tokens: int, zero3: bool):
        self.recorder = recorder
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.max_new_tokens = max_new_tokens
        self.zero3 = zero3

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        self.recorder.samples = generate_samples(
            model, self.tokenizer, self.prompts, self.max_new_tokens, synced=self.zero3 and _distributed()
        )


# run before RunRecorder.on_evaluate: callbacks are called in the order they were added
def generate_samples(model, tokenizer, prompts, max_new_tokens, synced=False) -> list[dict]:
    if not prompts or model is None:
        return []
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = []
    try:
        for prompt in prompts:
            if tokenizer.chat_template:
                text = tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
                )
            else:
                text = prompt
            enc = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(device)
            with torch.no_grad():
                generated = model.generate(
                    **enc,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                    synced_gpus=synced,
                )
            answer = tokenizer.decode(generated[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            out.append({"prompt": prompt, "output": answer.strip()})
    finally:
        model.train(was_training)
    return out
