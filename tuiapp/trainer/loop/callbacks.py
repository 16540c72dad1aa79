"""Trainer callbacks: the rank-0 metrics/events writer, graceful stop, and eval samples."""

from __future__ import annotations

import atexit
import functools
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

from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder.metrics import (
    PREFERENCE_METRICS,
    EvalRow,
    JsonlWriter,
    TrainRow,
    rank_memory_path,
    read_jsonl,
    read_rank_memory,
    write_rank_memory,
)
from tuiapp.core.run_folder.rundata import MetricsWriter
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.trainer import phases
from tuiapp.trainer.loop.optimizers import describe
from tuiapp.trainer.loop.resume import pause_at


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _sync_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_process: list[psutil.Process] = []


@functools.cache
def _cuda() -> bool:
    return torch.cuda.is_available()


def _this_process() -> psutil.Process:
    if not _process or _process[0].pid != os.getpid():
        _process[:] = [psutil.Process()]
    return _process[0]


def memory_snapshot() -> dict:
    """This rank's memory: CUDA allocator figures, or process RSS on CPU."""
    rss = _this_process().memory_info().rss
    if _cuda():
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


AGREE_EVERY_S = 1.0  # how often the ranks agree on the stop flag and the token counts (at most once a step)
MAX_STEPS_BETWEEN_AGREEMENTS = 100


class GracefulStop(TrainerCallback):
    """SIGTERM asks for a stop; all ranks agree at a step boundary, save, then end training. The
    same agreement sums the ranks' token counts, so a step makes no other collective of llmtui's.

    No rank waits for the others: at an agreement step every rank starts one asynchronous
    all_reduce (SUM) of [its stop flag, rank 0's proposed interval, its token count per step since
    the last agreement] on a host (gloo) group, and reads the one it started at the agreement
    before, done by then. Agreements come every `_every` steps, which rank 0 sets from the step time
    (about every AGREE_EVERY_S) and every rank learns from the all_reduce, so all of them stop at the
    same step, within about two intervals of the signal. When steps take AGREE_EVERY_S or more
    (`_every` 1) the ranks wait for the all_reduce at once: a fraction of a millisecond per long
    step, and a stop or a row is never held back a whole step. `tokens_at` holds the run's token total
    through each recent step once it is known. CUDA counts reach the host through a pinned copy read
    an interval later, so nothing waits for the device. `settle` (eval, checkpoint, train end; every
    rank calls it) folds in everything still on its way. One process agrees with itself every step
    (a CUDA count, read an interval later, holds its rows back only when steps are short)."""

    def __init__(self):
        self.requested = False
        self.stopped = False
        self.tokens_at: dict[int, int] = {}  # step → tokens through it, every rank's (recent steps)
        self._group = None
        self._cuda = False
        self._several = False  # more than one rank: they agree through an all_reduce
        self._every = 1  # steps between agreements, the same on every rank
        self._next_agreement = 0
        self._agreed_at = None  # (time, step) of the last agreement started
        self._pending = None  # (work, buffer, first step of its counts)
        self._local = None  # this rank's tokens counted since the last step end (a tensor)
        self._counts: list = []  # this rank's count per step since the last agreement
        self._counts_from = 0  # the step of _counts[0]
        self._staged = None  # CUDA: (pinned counts, event, first step) of the interval before
        self._agreed_stop = False
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame):
        self.requested = True

    source_count = 0  # a mixture's sources, whose tokens are summed too (source_totals)
    _sources = None  # this rank's tokens per source so far (a tensor, on the batch's device)

    def add_source_tokens(self, counts: torch.Tensor) -> None:
        """A mixture's micro batch: its tokens per source on this rank; no host sync."""
        self._sources = counts if self._sources is None else self._sources + counts.to(self._sources.device)

    def source_totals(self) -> list[int]:
        """Every rank's tokens per source so far, one blocking all_reduce (CUDA: a device sync); every
        rank calls it at the same train log, where the loss is read from the device anyway."""
        local = (self._sources.detach().to("cpu", torch.int64).clone() if self._sources is not None
                 else torch.zeros(self.source_count, dtype=torch.int64))
        if self._several:
            dist.all_reduce(local, op=dist.ReduceOp.SUM, group=self._group)
        return local.tolist()

    def add_tokens(self, count: torch.Tensor) -> None:
        """A micro batch's non-padding tokens on this rank; no host sync."""
        self._local = count if self._local is None else self._local + count.to(self._local.device)

    def on_train_begin(self, args, state, control, **kwargs):
        self._cuda = torch.device(args.device).type == "cuda"
        self._several = _distributed() and dist.get_world_size() > 1  # one rank agrees with itself
        if self._several:
            self._group = _host_group()

    def _fold(self, state, flag: int, every: int, first: int, counts: list[int]) -> None:
        self._agreed_stop = self._agreed_stop or flag > 0
        self._every = every or self._every
        for offset, count in enumerate(counts):
            state.num_input_tokens_seen += count
            self.tokens_at[first + offset] = state.num_input_tokens_seen
        while len(self.tokens_at) > 2 * MAX_STEPS_BETWEEN_AGREEMENTS + 8:
            del self.tokens_at[next(iter(self.tokens_at))]

    def _collect(self, state) -> None:
        """Fold in the all_reduce started at the agreement before (every rank started it)."""
        if self._pending is not None:
            work, buffer, first = self._pending
            self._pending = None
            work.wait()
            flag, every, *counts = buffer.tolist()  # a host tensor: no device sync
            self._fold(state, flag, every, first, counts)

    def _ready_counts(self, now: bool = False) -> tuple[int, list[int]]:
        """(first step, counts) ready on the host: on CPU the steps since the last agreement; on
        CUDA those are copied to pinned memory now and the interval copied last time is read, or
        with `now` (steps of a second or more, where a device sync per agreement costs nothing
        worth saving) every count so far, read at once."""
        counts, first = self._counts, self._counts_from
        self._counts = []
        if not self._cuda:
            return first, [int(c) for c in counts]
        ready, self._staged = self._staged, None
        earlier, earlier_from = [], first
        if ready is not None:
            ready[1].synchronize()  # recorded an interval ago
            earlier, earlier_from = ready[0].tolist(), ready[2]
        if now:
            return earlier_from, earlier + [int(c) for c in counts]
        if counts:
            device = torch.device("cuda", torch.cuda.current_device())
            stacked = torch.stack([torch.as_tensor(c, dtype=torch.int64, device=device) for c in counts])
            host = torch.empty(len(counts), dtype=torch.int64, pin_memory=True)
            host.copy_(stacked, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._staged = (host, event, first)
        return earlier_from, earlier

    def _propose_every(self, step: int) -> int:
        """Rank 0: steps per AGREE_EVERY_S at the step time since the last agreement."""
        now = time.monotonic()
        last, self._agreed_at = self._agreed_at, (now, step)
        if last is None or step <= last[1]:
            return 1
        step_s = (now - last[0]) / (step - last[1])
        return max(1, min(MAX_STEPS_BETWEEN_AGREEMENTS, int(AGREE_EVERY_S / max(step_s, 1e-6))))

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if not self._counts:
            self._counts_from = step
        local, self._local = self._local, None
        self._counts.append(local if local is not None else 0)
        flag = 1 if self.requested else 0
        if not self._several:  # no all_reduce; the interval only decides how a CUDA count is read
            at_once = self._every == 1
            self._fold(state, flag, self._propose_every(step), *self._ready_counts(now=at_once))
        elif step >= self._next_agreement:
            self._collect(state)
            at_once = self._every == 1  # steps of AGREE_EVERY_S or more: waiting costs nothing
            first, counts = self._ready_counts(now=at_once)
            every = self._propose_every(step) if dist.get_rank() == 0 else 0
            buffer = torch.tensor([flag, every, *counts], dtype=torch.int64)
            work = dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self._group, async_op=True)
            self._pending = (work, buffer, first)
            if at_once:  # the flag and the counts now: rows are not held back a long step
                self._collect(state)
            self._next_agreement = step + self._every
        if self._agreed_stop:
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def settle(self, state) -> None:
        """Fold in the agreement in flight and this rank's counts not sent yet (one blocking
        all_reduce), so state.num_input_tokens_seen counts every step so far. Every rank calls it at
        the same point."""
        self._collect(state)
        first, counts = self._ready_counts(now=True)  # a CUDA count waits for the device: rare
        if counts:
            buffer = torch.tensor(counts, dtype=torch.int64)
            if self._several:
                dist.all_reduce(buffer, op=dist.ReduceOp.SUM, group=self._group)
            self._fold(state, 0, 0, first, buffer.tolist())

    def on_evaluate(self, args, state, control, **kwargs):
        self.settle(state)

    def on_train_end(self, args, state, control, **kwargs):
        self.settle(state)


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


def online_eval_rewards(logs: dict) -> dict:
    """grpo/rloo's rewards on the held-out prompts (TRL logs them as eval_reward, eval_rewards/NAME/mean...
    in the eval's log call, not in the metrics handed to on_evaluate)."""
    return {k: v for k, v in logs.items() if (k in ("eval_reward", "eval_reward_std") or k.startswith("eval_rewards/"))
            and isinstance(v, (int, float)) and not isinstance(v, bool)}


MEMORY_EVERY_S = 2.0  # how often a rank rewrites its ranks/memory-<rank>.json
MEMORY_SAMPLE_S = 1.0  # how often a rank reads its own memory (a metrics row carries the latest)
END_EVENTS = ev.END_KINDS  # the trainer writes no metrics row after these
EVAL_PROGRESS_EVERY_S = 1.0  # how often rank 0 writes an eval_progress event while it evaluates


def _source_tokens_at(path: Path, step: int, keys: list[str]) -> dict[str, int]:
    """Each source's tokens in the last train row at or before `step` of an earlier attempt."""
    try:
        rows = read_jsonl(path)
    except OSError:
        return {}
    for row in reversed(rows):
        if row.get("step", step + 1) <= step and f"tokens/{keys[0]}" in row:
            return {key: int(row.get(f"tokens/{key}") or 0) for key in keys}
    return {}


class RunRecorder(TrainerCallback):
    """Writes metrics.jsonl and events.jsonl (rank 0 only). Each rank writes its own memory to
    ranks/memory-<rank>.json (read at most every MEMORY_SAMPLE_S, written at most every
    MEMORY_EVERY_S, no collective); rank 0's rows carry its latest figures and the others' files.
    `loss_is_nll`: the loss is a token cross-entropy (eval rows then carry its perplexity); not for
    preference losses.

    With an `agreement` (GracefulStop, which sums the ranks' tokens) a train row is held until its
    step's token total has arrived (on several ranks, an agreement or two later: about a second, or
    at once when steps take longer); without one the state's count is current and rows are written
    at once."""

    def __init__(self, run_dir: Path, host: str, loss_is_nll: bool = True, agreement: GracefulStop | None = None):
        self.run_dir = Path(run_dir)
        self.host = host
        self.loss_is_nll = loss_is_nll
        self.agreement = agreement
        self.active_parameters = 0  # the base's parameters a token goes through (set by the trainer)
        self.source_keys: list[str] = []  # a mixture's source labels: rows get tokens/<label> (set by the trainer)
        self._source_base: dict[str, int] = {}  # resumed: each source's tokens before this attempt
        self._held: list[tuple[TrainRow, float]] = []  # rows waiting for their step's token total
        self._samples_per_step = 0
        self.metrics = None
        self.events = None
        self._last_time = None
        self._last_tokens = 0
        self._last_step = 0
        self._memory_written = 0.0
        self._memory_sampled = 0.0
        self._memory: dict = {}
        # node rank: DeepSpeed's launcher sets CROSS_RANK, torchrun GROUP_RANK
        self._node = int(os.environ.get("CROSS_RANK") or os.environ.get("GROUP_RANK") or 0)
        self._others: dict = {}  # rank 0: the other ranks' latest memory files
        self.rank = int(os.environ.get("RANK", "0"))
        self.samples: list[dict] = []
        self.extra_eval: dict = {}  # what other callbacks add to the next eval row (benchmark scores)
        self._eval_batches = 0  # batches of the evaluation under way, and when its progress was written
        self._eval_started = self._eval_written = 0.0

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
            if self.source_keys and state.global_step:  # resumed: the sources' tokens go on from the checkpoint
                self._source_base = _source_tokens_at(RunDir(self.run_dir).metrics, state.global_step,
                                                      self.source_keys)
            self.metrics = MetricsWriter(self.run_dir)  # keeps metrics.columns current: readers parse no long file
            atexit.register(self.metrics.close)  # a rank that exits through the interpreter (not os._exit)
            self.events = JsonlWriter(RunDir(self.run_dir).events)
            total = trainable = 0
            for param in model.parameters():
                n = getattr(param, "ds_numel", param.numel())
                total += n
                trainable += n if param.requires_grad else 0
            self.events.write({
                "event": ev.STARTED,
                "step": state.global_step,
                "max_steps": state.max_steps,
                "world_size": args.world_size,
                "params": total,
                "trainable_params": trainable,
                "device": str(args.device),
            })
        self._samples_per_step = args.train_batch_size * max(1, args.world_size)
        self._last_time = time.time()
        self._last_tokens = state.num_input_tokens_seen
        self._last_step = state.global_step

    def _rank_memory(self, force: bool = False) -> dict:
        """This rank's memory, sampled at most every MEMORY_SAMPLE_S and written to its file at most
        every MEMORY_EVERY_S; on rank 0 every rank's latest figures as a row's `mem`."""
        now = time.monotonic()
        if force or now - self._memory_sampled >= MEMORY_SAMPLE_S:
            self._memory_sampled = now
            self._memory = {**memory_snapshot(), "host": self.host, "node": self._node}
        if force or now - self._memory_written >= MEMORY_EVERY_S:
            self._memory_written = now
            try:
                write_rank_memory(self.run_dir, self.rank, self._memory)
            except OSError:
                pass  # a full disk must not end training; the memory column just lags
            if self.rank == 0 and _distributed():
                self._others = read_rank_memory(self.run_dir)
        if self.rank != 0:
            return {}
        memory = {**self._others, f"rank{self.rank}": self._memory}
        return dict(sorted(memory.items(), key=lambda item: int(item[0][4:])))

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if self._held:
            self._write_rows(state)
        if not getattr(self, "_first", False):
            self._first = True
            phases.enter("training")
            if self.events is not None:  # with what stepped the weights: its class, wrappers and state bytes
                stepped = describe(optimizer) if optimizer is not None else {}
                self.events.write({"event": ev.FIRST_STEP, "step": state.global_step, **stepped})

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = dict(logs or {})
        memory = self._rank_memory()
        train_row = "loss" in logs and "train_loss" not in logs
        sources = self.agreement.source_totals() if train_row and self.source_keys and self.agreement else None
        if not self._is_writer(state) or self.metrics is None:
            return
        if not train_row:  # eval rows are written in on_evaluate; the final summary is not a step
            self.extra_eval.update(online_eval_rewards(logs))  # grpo/rloo log their eval rewards just before it
            return
        row: TrainRow = {
            "step": state.global_step,
            "max_steps": state.max_steps,
            "epoch": logs.pop("epoch", state.epoch),
            "loss": logs.pop("loss", None),
            "lr": logs.pop("learning_rate", None),
            "grad_norm": logs.pop("grad_norm", None),
            "mem": memory,
        }
        for key in ("num_input_tokens_seen", "train_runtime", "train_tokens_per_second"):
            logs.pop(key, None)
        row.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})
        if isinstance(logs.get("moe/load"), list):  # each expert's share of the routed tokens (trainer.moe)
            row["moe/load"] = logs["moe/load"]
        row.update(preference_metrics(logs))
        if sources is not None:  # a mixture: each source's tokens so far (they add up to `tokens`)
            row.update({f"tokens/{key}": self._source_base.get(key, 0) + count
                        for key, count in zip(self.source_keys, sources, strict=True)})
        self._held.append((row, time.time()))
        self._write_rows(state)

    def _write_rows(self, state, flush: bool = False) -> None:
        """Writes the held rows whose step's token total is known (all of them on `flush`, once
        the agreement settled), with tokens/s, samples/s and step time since the last row."""
        totals = self.agreement.tokens_at if self.agreement is not None else {}
        while self._held:
            row, now = self._held[0]
            tokens = totals.get(row["step"])
            if tokens is None and (self.agreement is None or flush):
                tokens = state.num_input_tokens_seen
            elif tokens is None:
                break
            self._held.pop(0)
            dt = max(now - (self._last_time or now), 1e-9)
            steps = row["step"] - self._last_step
            row.update({
                "tokens": tokens,
                "tokens_per_s": (tokens - self._last_tokens) / dt if steps > 0 else None,
                "samples_per_s": steps * self._samples_per_step / dt if steps > 0 else None,
                "step_time": dt / steps if steps > 0 else None,
            })
            if self.active_parameters and row["tokens_per_s"]:  # 6 FLOPs per active parameter per token
                row["model_tflops"] = 6 * self.active_parameters * row["tokens_per_s"] / 1e12
            self.metrics.write(row)
            self._last_time, self._last_tokens, self._last_step = now, tokens, row["step"]
            pause_at(f"step:{row['step']}", self.run_dir)  # tests only (LLMTUI_PAUSE_AT)

    def _flush(self, state) -> None:
        if self.metrics is not None and self._held:
            self._write_rows(state, flush=True)

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        """An eval batch is done: `eval_progress` events (examples done of the total, seconds so far)
        on the first batch, the last, and at most every EVAL_PROGRESS_EVERY_S between."""
        if not self._is_writer(state) or self.events is None:
            return
        now = time.monotonic()
        self._eval_batches += 1
        if self._eval_batches == 1:
            self._eval_started = now
        batches = _length(eval_dataloader)
        last = batches is not None and self._eval_batches >= batches
        if self._eval_batches > 1 and not last and now - self._eval_written < EVAL_PROGRESS_EVERY_S:
            return
        self._eval_written = now
        total = _length(getattr(eval_dataloader, "dataset", None))
        done = self._eval_batches * args.eval_batch_size * max(1, args.world_size)
        self.events.write({"event": ev.EVAL_PROGRESS, "step": state.global_step,
                           "done": min(done, total) if total else done, "total": total,
                           "elapsed_s": round(now - self._eval_started, 3)})

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._eval_batches = 0
        extra, self.extra_eval = self.extra_eval, {}
        if not self._is_writer(state) or self.metrics is None:
            return
        self._flush(state)  # the agreement settled in its own on_evaluate, called first
        loss = (metrics or {}).get("eval_loss")
        row: EvalRow = {"split": "eval", "step": state.global_step, "epoch": state.epoch, "eval_loss": loss}
        if isinstance(loss, (int, float)) and math.isfinite(loss) and self.loss_is_nll:
            row["perplexity"] = math.exp(min(loss, 50.0))
        row.update({f"eval_{k}": v for k, v in preference_metrics(metrics or {}, "eval_").items()})
        row.update(extra)
        if self.samples:
            row["samples"] = self.samples
        self.metrics.write(row)
        self.events.write({"event": ev.EVAL, "step": state.global_step, "eval_loss": loss})

    def on_save(self, args, state, control, **kwargs):
        if self._is_writer(state) and self.events is not None:
            self._flush(state)  # the agreement settled before the checkpoint was written
            self.events.write({"event": ev.CHECKPOINT, "step": state.global_step})

    def on_train_end(self, args, state, control, **kwargs):
        self._rank_memory(force=True)  # each rank's file ends with its peak over the whole run (rows lag it)
        if self._is_writer(state):
            self._flush(state)  # the agreement settled in its own on_train_end, called first
            if self.metrics is not None:
                self.metrics.save()

    def event(self, state, record: dict) -> None:
        if self._is_writer(state) and self.events is not None:
            self.events.write(record)
            if record.get("event") in END_EVENTS and self.metrics is not None:
                self.metrics.save()  # every row is written (a last evaluation's too): the columns hold them all


def _length(sized) -> int | None:
    try:
        return len(sized)
    except TypeError:  # an iterable (streaming) dataset or loader has no length
        return None


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
