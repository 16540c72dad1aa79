"""The step agreement on two real gloo ranks: GracefulStop sums the ranks' token counts on the
asynchronous all_reduce it starts every few steps, both ranks stop at the same step after a real
SIGTERM to one of them, and RunRecorder writes every step's row with the exact token total."""

import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import torch.multiprocessing as mp

from tuiapp.core.launcher import free_port

STEPS, SIGNAL_AT, STEP_S = 120, 30, 0.02


def _tokens(rank: int, step: int) -> int:
    return 100 * step + rank + 1  # different on each rank and step


def _rank(rank: int, port: int, run_dir: str, queue) -> None:
    import torch
    import torch.distributed as dist
    from transformers import TrainerControl, TrainerState

    from tuiapp.trainer import callbacks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    args = SimpleNamespace(world_size=2, device=torch.device("cpu"), train_batch_size=1)
    state, control = TrainerState(), TrainerControl()
    state.is_world_process_zero, state.max_steps = rank == 0, STEPS
    stopper = callbacks.GracefulStop()
    recorder = callbacks.RunRecorder(Path(run_dir), "test", agreement=stopper)
    stopper.on_train_begin(args, state, control)
    recorder.on_train_begin(args, state, control, model=torch.nn.Linear(2, 2))
    intervals = set()
    for step in range(1, STEPS + 1):
        time.sleep(STEP_S)  # the step's work
        for micro in range(2):
            stopper.add_tokens(torch.tensor(_tokens(rank, step) + micro))
        if rank == 1 and step == SIGNAL_AT:
            os.kill(os.getpid(), signal.SIGTERM)
        state.global_step = step
        stopper.on_step_end(args, state, control)
        recorder.on_step_end(args, state, control)
        recorder.on_log(args, state, control, logs={"loss": 1.0, "learning_rate": 1e-3})
        intervals.add(stopper._every)
        if control.should_training_stop:
            break
    stopper.settle(state)  # the checkpoint a stop saves
    recorder.on_save(args, state, control)
    stopper.on_train_end(args, state, control)
    recorder.on_train_end(args, state, control)
    queue.put({"rank": rank, "stopped_at": state.global_step, "tokens": state.num_input_tokens_seen,
               "intervals": sorted(intervals)})
    dist.barrier()
    dist.destroy_process_group()


def test_two_ranks_agree_on_the_stop_step_and_every_rows_token_total(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, str(tmp_path), queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = sorted((queue.get(timeout=120) for _ in procs), key=lambda r: r["rank"])
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0

    stop = results[0]["stopped_at"]
    assert results[1]["stopped_at"] == stop  # the same step on both ranks
    every = max(results[0]["intervals"])
    assert every > 1  # agreements came every few steps, not every step
    assert SIGNAL_AT < stop <= SIGNAL_AT + 2 * every + 1

    def total(step):
        return sum(2 * _tokens(rank, s) + 1 for rank in range(2) for s in range(1, step + 1))

    assert results[0]["tokens"] == results[1]["tokens"] == total(stop)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["tokens"]) for r in rows] == [(s, total(s)) for s in range(1, stop + 1)]
    assert all(r["tokens_per_s"] > 0 for r in rows[1:])
