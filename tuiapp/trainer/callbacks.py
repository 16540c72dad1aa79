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

from tuiapp.core.metrics import PREFERENCE_METRICS, EvalRow, JsonlWriter, TrainRow
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


class GracefulStop(TrainerCallback):
    """SIGTERM asks for a stop; all ranks agree at a step boundary, save, then end training."""

    def __init__(self):
        self.requested = False
        self.stopped = False
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame):
        self.requested = True

    def on_step_end(self, args, state, control, **kwargs):
        flag = torch.tensor([1.0 if self.requested else 0.0], device=_sync_device())
        if _distributed():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True
        return control


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


class RunRecorder(TrainerCallback):
    """Writes metrics.jsonl and events.jsonl (rank 0 only) and per-rank memory. `loss_is_nll`:
    the loss is a token cross-entropy (eval rows then carry its perplexity); not for preference losses."""

    def __init__(self, run_dir: Path, host: str, loss_is_nll: bool = True):
        self.run_dir = Path(run_dir)
        self.host = host
        self.loss_is_nll = loss_is_nll
        self.metrics = None
        self.events = None
        self._last_time = None
        self._last_tokens = 0
        self._last_step = 0
        self.samples: list[dict] = []

    def _is_writer(self, state) -> bool:
        return state.is_world_process_zero

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        phases.enter("first step")
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

    def _rank_memory(self) -> dict:
        mine = memory_snapshot()
        mine["host"] = self.host
        # node rank: DeepSpeed's launcher sets CROSS_RANK, torchrun GROUP_RANK
        mine["node"] = int(os.environ.get("CROSS_RANK") or os.environ.get("GROUP_RANK") or 0)
        gathered = [mine]
        if _distributed():
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
        return {f"rank{i}": m for i, m in enumerate(gathered)}

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
