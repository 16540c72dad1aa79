"""The step agreement on two real gloo ranks: GracefulStop sums the ranks' token counts on the
asynchronous all_reduce it starts every few steps (at once when steps are long), both ranks stop at
the same step after a real SIGTERM to one of them, and RunRecorder writes every step's row with the
exact token total."""

import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.multiprocessing as mp

from tuiapp.core.plan.launcher import free_port


def _tokens(rank: int, step: int) -> int:
    return 100 * step + rank + 1  # different on each rank and step


def _rank(rank: int, port: int, run_dir: str, steps: int, signal_at: int, step_s: float, queue) -> None:
    import torch
    import torch.distributed as dist
    from transformers import TrainerControl, TrainerState

    from tuiapp.trainer.loop import callbacks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    args = SimpleNamespace(world_size=2, device=torch.device("cpu"), train_batch_size=1)
    state, control = TrainerState(), TrainerControl()
    state.is_world_process_zero, state.max_steps = rank == 0, steps
    stopper = callbacks.GracefulStop()
    recorder = callbacks.RunRecorder(Path(run_dir), "test", agreement=stopper)
    stopper.on_train_begin(args, state, control)
    recorder.on_train_begin(args, state, control, model=torch.nn.Linear(2, 2))
    intervals, written = set(), []
    metrics = Path(run_dir) / "metrics.jsonl"
    for step in range(1, steps + 1):
        time.sleep(step_s)  # the step's work
        for micro in range(2):
            stopper.add_tokens(torch.tensor(_tokens(rank, step) + micro))
        if rank == 1 and step == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        state.global_step = step
        stopper.on_step_end(args, state, control)
        recorder.on_step_end(args, state, control)
        recorder.on_log(args, state, control, logs={"loss": 1.0, "learning_rate": 1e-3})
        intervals.add(stopper._every)
        if rank == 0:
            written.append(len(metrics.read_text().splitlines()))
        if control.should_training_stop:
            break
    stopper.settle(state)  # the checkpoint a stop saves
    recorder.on_save(args, state, control)
    stopper.on_train_end(args, state, control)
    recorder.on_train_end(args, state, control)
    queue.put({"rank": rank, "stopped_at": state.global_step, "tokens": state.num_input_tokens_seen,
               "intervals": sorted(intervals), "written": written})
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow  # over ~5 s on 2 cores
@pytest.mark.parametrize("step_s, steps, signal_at", [(0.1, 80, 30), (1.05, 6, 3)], ids=["short-steps", "long-steps"])
def test_two_ranks_agree_on_the_stop_step_and_every_rows_token_total(tmp_path, step_s, steps, signal_at):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path), steps, signal_at, step_s, queue))
             for r in range(2)]
    for proc in procs:
        proc.start()
    results = sorted((queue.get(timeout=120) for _ in procs), key=lambda r: r["rank"])
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0

    stop = results[0]["stopped_at"]
    assert results[1]["stopped_at"] == stop  # the same step on both ranks
    every = max(results[0]["intervals"])
    if step_s < 1:  # agreements every few steps, read one agreement later
        assert every > 1
        assert signal_at < stop <= signal_at + 2 * every + 1 < steps
        held = [s - w for s, w in enumerate(results[0]["written"], 1)]  # rows waiting for their totals
        assert max(held) >= 1 and max(held) <= 2 * every + 1
    else:  # long steps: agreed at once, so the stop lands on the signal's step and rows are never held
        assert every == 1 and stop == signal_at
        assert results[0]["written"] == list(range(1, stop + 1))

    def total(step):
        return sum(2 * _tokens(rank, s) + 1 for rank in range(2) for s in range(1, step + 1))

    assert results[0]["tokens"] == results[1]["tokens"] == total(stop)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["tokens"]) for r in rows] == [(s, total(s)) for s in range(1, stop + 1)]
    assert all(r["tokens_per_s"] > 0 for r in rows[1:])


def test_one_process_writes_each_row_at_once_with_its_tokens(tmp_path):
    import torch
    from transformers import TrainerControl, TrainerState

    from tuiapp.trainer.loop import callbacks

    args = SimpleNamespace(world_size=1, device=torch.device("cpu"), train_batch_size=1)
    state, control = TrainerState(), TrainerControl()
    state.is_world_process_zero, state.max_steps = True, 5
    stopper = callbacks.GracefulStop()
    recorder = callbacks.RunRecorder(tmp_path, "test", agreement=stopper)
    stopper.on_train_begin(args, state, control)
    recorder.on_train_begin(args, state, control, model=torch.nn.Linear(2, 2))
    for step in range(1, 6):
        stopper.add_tokens(torch.tensor(10 * step))
        state.global_step = step
        stopper.on_step_end(args, state, control)
        recorder.on_step_end(args, state, control)
        recorder.on_log(args, state, control, logs={"loss": 1.0})
        rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [(r["step"], r["tokens"]) for r in rows] == [(s, 5 * s * (s + 1)) for s in range(1, step + 1)]
