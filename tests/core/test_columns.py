"""metrics.columns: the trainer's writer keeps a run's metrics in columns as it writes them, and
a reader sees every row of metrics.jsonl whatever state the columns are in (current, behind,
torn, of another file, absent)."""

from __future__ import annotations

import json
import math
import os
from array import array

import pytest

from tests.after_runs import sft_run
from tuiapp.core.run_folder import columns
from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.metrics import JsonlReader, JsonlWriter, read_jsonl
from tuiapp.core.run_folder.rundata import MetricsWriter, RunData, read_run_data


def rows(first: int, last: int) -> list[dict]:
    out = []
    for step in range(first, last + 1):
        out.append({"step": step, "max_steps": 10_000, "loss": 3.0 - step / 1e4, "lr": 1e-4, "tokens": step * 64,
                    "tokens_per_s": 1000.0 + step % 7, "mem": {"rank0": {"device": "cpu", "peak": 2e9 + step}}})
        if step % 100 == 0:
            out.append({"split": "eval", "step": step, "eval_loss": 2.0 - step / 1e5,
                        "samples": [{"prompt": "p", "answer": str(step)}]})
    out[len(out) // 2]["loss"] = math.nan  # written as "nan": a non-finite loss is kept as such
    return out


def parsed(metrics) -> RunData:
    """What a reader without any columns makes of metrics.jsonl: the truth to compare with."""
    data = RunData()
    data.extend(read_jsonl(metrics))
    return data


def values(column) -> list[str]:
    return [repr(v) for v in column]  # nan == nan


def same(a: RunData, b: RunData) -> None:
    assert a.records == b.records
    assert values(a.steps) == values(b.steps) and values(a.tokens) == values(b.tokens)
    assert values(a.times) == values(b.times)
    for key in a.series:
        assert list(a.series[key].xs) == list(b.series[key].xs), key
        assert list(a.series[key].ys) == list(b.series[key].ys), key
    assert list(a.eval_loss.ys) == list(b.eval_loss.ys) and list(a.eval_loss.xs) == list(b.eval_loss.xs)
    assert {k: list(v.ys) for k, v in a.memory.items()} == {k: list(v.ys) for k, v in b.memory.items()}
    assert a.evals == b.evals and a.eval_records == b.eval_records
    assert a.last_train == b.last_train and a.recent == b.recent and a.last_eval == b.last_eval
    assert a.samples == b.samples and a.samples_step == b.samples_step
    assert a.nonfinite_loss == b.nonfinite_loss and a.first_time == b.first_time


def write(writer, records) -> None:
    for record in records:
        writer.write(record)


def test_the_writer_keeps_the_columns_current_and_a_reader_parses_only_the_rows_after_them(tmp_path):
    run = tmp_path / "run"
    with MetricsWriter(run, every_rows=200, every_s=3600) as writer:
        write(writer, rows(1, 1000))
        header, _, _ = columns.load(columns.columns_path(run), run / "metrics.jsonl")
        assert 0 < header["covered"] <= (run / "metrics.jsonl").stat().st_size
        assert header["records"] >= writer.data.records + len(writer._pending) - 200  # never more than every_rows behind
    # closed: the columns hold every row, and the reader starts at the end of the file
    header, _, _ = columns.load(columns.columns_path(run), run / "metrics.jsonl")
    assert header["covered"] == (run / "metrics.jsonl").stat().st_size
    data, reader = read_run_data(run / "metrics.jsonl")
    same(data, parsed(run / "metrics.jsonl"))
    assert data.nonfinite_loss and data.records == 1010
    with JsonlWriter(run / "metrics.jsonl") as later:  # the file grows after the columns: new lines read on
        later.write({"step": 1001, "loss": 0.5})
    assert reader.read_new()[0]["step"] == 1001


def test_columns_behind_the_file_are_completed_from_its_tail(tmp_path):
    run = tmp_path / "run"
    writer = MetricsWriter(run, every_rows=10**9, every_s=10**9)
    write(writer, rows(1, 700))
    writer.save()
    write(writer, rows(701, 900))  # not in the columns yet: the trainer is still writing
    data, reader = read_run_data(run / "metrics.jsonl")
    same(data, parsed(run / "metrics.jsonl"))
    assert reader.offset == (run / "metrics.jsonl").stat().st_size and data.steps[-1] == 900
    writer.close()


@pytest.mark.parametrize("damage", ["truncated", "longer", "garbage", "empty", "header cut", "other version"])
def test_torn_or_foreign_columns_are_ignored(tmp_path, damage):
    run = tmp_path / "run"
    with MetricsWriter(run, every_rows=100, every_s=3600) as writer:
        write(writer, rows(1, 400))
    path = columns.columns_path(run)
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    if damage == "truncated":
        path.write_bytes(raw[: len(raw) - 12])
    elif damage == "longer":
        path.write_bytes(raw + b"\0" * 8)
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(raw)))
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "header cut":
        path.write_bytes(raw[: 8 + size // 2])
    else:
        header = json.loads(raw[8 : 8 + size])
        head = json.dumps({**header, "version": columns.VERSION + 1}).encode()
        path.write_bytes(len(head).to_bytes(8, "little") + head + raw[8 + size :])
    assert columns.load(path, run / "metrics.jsonl") is None
    data, _ = read_run_data(run / "metrics.jsonl")
    same(data, parsed(run / "metrics.jsonl"))
    assert data.steps[-1] == 400


def test_a_run_without_columns_is_read_whole(tmp_path):
    """Runs of an older llmtui have no metrics.columns."""
    run = tmp_path / "run"
    run.mkdir()
    with JsonlWriter(run / "metrics.jsonl") as writer:
        write(writer, rows(1, 300))
    data, reader = read_run_data(run / "metrics.jsonl")
    same(data, parsed(run / "metrics.jsonl"))
    assert not columns.columns_path(run).exists() and reader.offset == (run / "metrics.jsonl").stat().st_size


def test_columns_of_a_rewritten_file_are_ignored_and_a_resumed_writer_starts_from_its_rows(tmp_path):
    """A resume trims metrics.jsonl to its checkpoint (a new file): the old columns describe rows
    that are gone; the writer opened for the resume starts from the rows kept."""
    run = tmp_path / "run"
    with MetricsWriter(run, every_rows=100, every_s=3600) as writer:
        write(writer, rows(1, 500))
    kept = [r for r in read_jsonl(run / "metrics.jsonl") if r["step"] <= 300]
    atomic_write_text(run / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
    data, _ = read_run_data(run / "metrics.jsonl")
    assert data.steps[-1] == 300
    same(data, parsed(run / "metrics.jsonl"))
    with MetricsWriter(run, every_rows=100, every_s=3600) as writer:
        assert writer.data.steps[-1] == 300
        write(writer, rows(301, 600))
    data, reader = read_run_data(run / "metrics.jsonl")
    same(data, parsed(run / "metrics.jsonl"))
    assert data.steps[-1] == 600 and list(data.steps) == [float(s) for s in range(1, 601)]


def test_a_line_cut_by_a_crash_stays_apart_from_the_next(tmp_path):
    run = tmp_path / "run"
    with MetricsWriter(run) as writer:
        write(writer, rows(1, 5))
    with open(run / "metrics.jsonl", "ab") as handle:
        handle.write(b'{"step": 6, "lo')  # the process died mid-line
    with MetricsWriter(run) as writer:
        writer.write({"step": 6, "loss": 1.0})
    data, _ = read_run_data(run / "metrics.jsonl")
    whole = JsonlReader(run / "metrics.jsonl")
    assert [r["step"] for r in whole.read_all()] == [1, 2, 3, 4, 5, 6] and whole.malformed == 1
    assert list(data.steps) == [1, 2, 3, 4, 5, 6]
    same(data, parsed(run / "metrics.jsonl"))


def test_a_snapshot_holds_only_for_the_bytes_it_was_made_from(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n')
    path = tmp_path / "c.bin"
    assert columns.save(path, metrics, metrics.stat().st_size, {"x": 1}, [("a", array("d", [1.0, 2.0]))])
    header, arrays, _ = columns.load(path, metrics)
    assert header["x"] == 1 and list(arrays["a"]) == [1.0, 2.0]
    metrics.write_text('{"step": 2}\n')  # same length, other bytes (rewritten in place)
    assert columns.load(path, metrics) is None
    metrics.write_text("")  # shorter than the snapshot covers
    assert columns.load(path, metrics) is None
    assert not columns.save(tmp_path / "missing" / "x" / "c.bin", tmp_path / "nothing.jsonl", 0, {}, [])


@pytest.mark.slow
def test_a_real_runs_columns_hold_every_row_it_wrote(tmp_path_factory):
    """A real training run (the CLI, DeepSpeed, the Trainer) keeps metrics.columns, the last
    evaluation written after training included: a reader loads them and parses nothing."""
    run = sft_run(tmp_path_factory)
    metrics = run / "metrics.jsonl"
    header, _, _ = columns.load(columns.columns_path(run), metrics)
    assert header["covered"] == metrics.stat().st_size
    data, reader = read_run_data(metrics)
    assert reader.offset == metrics.stat().st_size
    same(data, parsed(metrics))
    assert len(data.loss) >= 30 and data.eval_records


def test_an_rl_runs_reward_means_have_series_in_rows_and_in_columns(tmp_path):
    """grpo/rloo log each reward's mean (rewards/NAME/mean): RunData keeps a series per reward, row
    by row, in bulk and through the columns, so a long run's task reward is charted and summarised."""
    run = tmp_path / "run"
    rl_rows = [{"step": s, "loss": 0.1, "reward": 1.0, "rewards/format/mean": 1.0, "rewards/answer/mean": s / 100}
               for s in range(1, 301)]
    with MetricsWriter(run, every_rows=50, every_s=3600) as writer:
        write(writer, rl_rows)
    single = RunData()
    for row in rl_rows:
        single.extend([row])  # row by row (the bulk path takes > 32 rows at once)
    for data in (parsed(run / "metrics.jsonl"), read_run_data(run / "metrics.jsonl")[0], single):
        assert list(data.series["rewards/answer/mean"].ys) == [s / 100 for s in range(1, 301)]
        assert list(data.series["rewards/format/mean"].ys) == [1.0] * 300
    assert "series:rewards/answer/mean:y" in columns.load(columns.columns_path(run), run / "metrics.jsonl")[1]
