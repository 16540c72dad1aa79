"""Validation reads what it needs: a bounded sample of a large file (head, tail, random offsets),
binary and NUL content refused with the file and the line or byte offset, sizes counted without
loading. Large files are sparse (truncate): they cost no disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from tuiapp.core.common.errors import DatasetError
from tuiapp.core.config.recipe import DatasetSpec
from tuiapp.core.data import datafiles
from tuiapp.core.data.datasets import inspect_dataset

GB2 = 2 * 1024**3


def sparse(path: Path, size: int = GB2, head: bytes = b"", at: dict[int, bytes] | None = None) -> Path:
    """A file of `size` bytes, zeros (a hole) except `head` and the bytes in `at`."""
    with path.open("wb") as handle:
        handle.write(head)
        for offset, data in (at or {}).items():
            handle.seek(offset)
            handle.write(data)
        handle.truncate(size)
    return path


def lines(n: int, start: int = 0) -> bytes:
    return "".join(json.dumps({"text": f"document {i} " + "word " * (i % 40)}) + "\n"
                   for i in range(start, start + n)).encode()


def refused(path: Path, **spec) -> tuple[DatasetError, float, float]:
    """(error, seconds, peak MB of Python allocations) of inspecting a dataset that must be refused."""
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(DatasetError) as caught:
            inspect_dataset(DatasetSpec(name=str(path), **spec))
        return caught.value, time.perf_counter() - started, tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", ["corpus.jsonl", "corpus.txt", "corpus.json", "corpus.csv"])
def test_a_2gb_zero_filled_file_is_refused_at_once_in_bounded_memory(tmp_path, name):
    path = sparse(tmp_path / name)
    error, seconds, peak_mb = refused(path)
    assert "NUL byte at offset 0" in error.message and error.file == str(path) and error.line == 1
    assert seconds < 2.0 and peak_mb < 32, (seconds, peak_mb)


def test_a_hole_inside_a_large_file_is_named_by_its_offset(tmp_path):
    head = lines(2000)
    path = sparse(tmp_path / "holes.jsonl", size=64 * 1024**2, head=head, at={60 * 1024**2: lines(2000)})
    error, seconds, _ = refused(path)
    assert "NUL byte at offset" in error.message and error.file == str(path)
    offset = int(error.message.rsplit(" ", 1)[1])
    assert len(head) <= offset < 60 * 1024**2 and seconds < 2.0


def read_bytes_of_this_process() -> int:
    with open("/proc/self/io") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("rchar"))


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs /proc/self/io")
def test_a_large_valid_file_is_sampled_and_counted_from_its_size(tmp_path):
    block = lines(5000)
    path = tmp_path / "big.jsonl"
    with path.open("wb") as handle:
        while handle.tell() < 48 * 1024**2:
            handle.write(block)
    real_count = path.stat().st_size // len(block) * 5000
    before = read_bytes_of_this_process()
    info = inspect_dataset(DatasetSpec(name=str(path)), limit=3)
    read = read_bytes_of_this_process() - before
    assert info.sampled and info.format == "text" and info.size == path.stat().st_size
    assert abs(info.count - real_count) / real_count < 0.05, (info.count, real_count)
    assert read < 4 * 1024**2, f"read {read} bytes of a {info.size} byte file"
    assert info.examples[0] == {"text": "document 0 "}


def test_a_bad_line_in_the_head_of_a_large_file_names_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(datafiles, "WHOLE_BYTES", 1000)
    path = tmp_path / "bad.jsonl"
    path.write_bytes(lines(10) + b'{"text": "cut\n' + lines(10000))
    error, _, _ = refused(path)
    assert "not valid JSON" in error.message and error.line == 11


def test_a_bad_record_deep_in_a_sampled_chunk_names_its_offset(tmp_path, monkeypatch):
    monkeypatch.setattr(datafiles, "WHOLE_BYTES", 1000)
    body = lines(30000)
    tail = b'{"text": ["not", "text"]}\n' * 20000  # the tail chunk holds only bad records
    path = tmp_path / "bad.jsonl"
    path.write_bytes(body + tail)
    error, _, _ = refused(path)
    assert "byte offset" in error.message and "holds a list" in error.message
    assert int(error.message.split("byte offset ")[1].split(":")[0]) >= len(body)


def test_the_heads_of_large_csv_json_and_parquet_files(tmp_path, monkeypatch):
    monkeypatch.setattr(datafiles, "WHOLE_BYTES", 1000)
    records = [{"instruction": f"q{i:06d} " * 20, "output": f"a{i:06d}"} for i in range(5000)]
    (tmp_path / "a.json").write_text(json.dumps(records, indent=1))
    with (tmp_path / "a.csv").open("w") as handle:
        handle.write("question,answer\n" + "".join(f"q{i:06d},a{i:06d}\n" for i in range(50000)))
    for name, fmt, count, spec in [("a.json", "alpaca", 5000, {}),
                                   ("a.csv", "alpaca", 50000, {"columns": {"prompt": "question",
                                                                            "response": "answer"}})]:
        info = inspect_dataset(DatasetSpec(name=str(tmp_path / name), **spec))
        assert info.sampled and info.format == fmt and abs(info.count - count) / count < 0.1, (name, info.count)
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"text": f"doc {i}"} for i in range(50000)]), tmp_path / "t.parquet")
    info = inspect_dataset(DatasetSpec(name=str(tmp_path / "t.parquet")))
    assert info.sampled and info.count == 50000 and info.format == "text"


def test_a_small_file_with_a_nul_byte_names_the_line(tmp_path):
    path = tmp_path / "small.txt"
    path.write_bytes(b"one\ntwo\nthr\0ee\n")
    error, _, _ = refused(path)
    assert error.line == 3 and "NUL byte at offset 11" in error.message


@pytest.mark.parametrize("command", ["validate", "run"])
def test_the_cli_refuses_a_2gb_sparse_file_fast_and_creates_nothing(tmp_path, command):
    sparse(tmp_path / "corpus.jsonl")
    (tmp_path / "r.toml").write_text('name = "big"\n[model]\nname = "tiny"\n[dataset]\nname = "corpus.jsonl"\n[method]\nkind = "pretrain"\n'
                                     '[launch]\ngpus = 1\n')
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tuiapp.cli", command, "r.toml"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "LLMTUI_RUNS_DIR": str(tmp_path / "runs")})
    seconds = time.perf_counter() - started
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert f"{tmp_path / 'corpus.jsonl'}:1: binary content: a NUL byte at offset 0" in text
    assert not any((tmp_path / "runs").glob("*")) if (tmp_path / "runs").exists() else True
    assert seconds < 20, seconds  # the interpreter's start included; the check itself is milliseconds


# ---------------------------------------------------------------- streaming the records (the trainer's read)


def test_iter_records_streams_what_load_records_reads(tmp_path):
    from tuiapp.core.data.datasets import iter_records, load_records

    (tmp_path / "t.jsonl").write_bytes(lines(50))
    (tmp_path / "t.txt").write_text("\ufefffirst\n\n  \nsecond\r\nthird\n")
    for name, spec in [("t.jsonl", {}), ("t.txt", {}), ("t.jsonl", {"max_samples": 7})]:
        dataset = DatasetSpec(name=str(tmp_path / name), **spec)
        assert list(iter_records(dataset)) == load_records(dataset), name
    (tmp_path / "bad.jsonl").write_bytes(lines(80) + b"{oops\n")
    with pytest.raises(DatasetError) as caught:
        list(iter_records(DatasetSpec(name=str(tmp_path / "bad.jsonl"))))
    assert caught.value.line == 81 and "not valid JSON" in caught.value.message
    (tmp_path / "nul.txt").write_bytes(b"fine\nbad\0line\n")
    with pytest.raises(DatasetError) as caught:
        list(iter_records(DatasetSpec(name=str(tmp_path / "nul.txt"))))
    assert caught.value.line == 2 and "NUL byte at offset 8" in caught.value.message


@pytest.mark.slow  # over ~5 s on 2 cores
def test_iter_records_memory_does_not_grow_with_the_file(tmp_path):
    from tuiapp.core.data.datasets import iter_records

    block = lines(5000)
    path = tmp_path / "big.jsonl"
    with path.open("wb") as handle:
        for _ in range(40):  # about 40 MB
            handle.write(block)
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_records(DatasetSpec(name=str(path))))
        peak_mb = tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()
    assert count == 200000 and peak_mb < 8, peak_mb
