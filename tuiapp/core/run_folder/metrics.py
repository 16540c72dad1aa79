"""JSON-lines files of the run directory: one writer and one reader own the format.

The writer appends one object per line and flushes each line. The reader reads only new bytes
by offset, keeps a partial last line for later, and skips malformed lines, so a file truncated
or corrupted by a crash never breaks the CLI or the TUI.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Literal, TypedDict

import orjson

from tuiapp.core.run_folder.rundir import RunDir

# Preference tuning (dpo, simpo, cpo, orpo, kto, reward): metric keys of train rows, and of eval
# rows with an "eval_" prefix. rewards/* are the implicit rewards (beta * log-ratio; the reward
# model's scores), accuracies the fraction of pairs whose chosen answer scores higher; kl is KTO's.
PREFERENCE_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "kl")
RL_METRICS = ("reward", "reward_std")  # grpo/rloo: the weighted total reward of a step's completions


class RankMemory(TypedDict, total=False):
    """One rank's memory in a train row's `mem` (CUDA allocator figures, or RSS on CPU)."""

    device: str
    allocated: int
    reserved: int
    peak: int
    rss: int
    host: str
    node: int


class TrainRow(TypedDict, total=False):
    """A metrics.jsonl line of a logging step (rank 0). Preference methods add PREFERENCE_KEYS."""

    time: float
    step: int
    max_steps: int
    epoch: float
    loss: float | str  # NaN/inf are written as strings
    lr: float
    grad_norm: float
    tokens: int
    tokens_per_s: float | None
    samples_per_s: float | None
    step_time: float | None
    mem: dict[str, RankMemory]  # "rank0" -> memory


class EvalRow(TypedDict, total=False):
    """A metrics.jsonl line of an evaluation."""

    time: float
    split: Literal["eval"]
    step: int
    epoch: float
    eval_loss: float | str
    perplexity: float
    samples: list[dict]  # {prompt, answer} of the recipe's sample prompts


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so the line stays valid."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class JsonlWriter:
    """Appends JSON objects to a file, one per line, flushed per line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")

    def encode(self, record: dict) -> bytes:
        """The line written for a record: its time first (unless it has one), NaN/inf as strings."""
        record = {"time": time.time(), **record}
        return orjson.dumps(_clean(record), option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS)

    def write(self, record: dict) -> None:
        self._file.write(self.encode(record))
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def parse_record(line: bytes | str) -> dict | None:
    """One JSON-lines record: the object, or None for a malformed line or one that is not an object."""
    try:
        record = orjson.loads(line)  # ~5x json.loads; NaN/inf are written as strings
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


class JsonlReader:
    """Reads new complete lines of a growing JSON-lines file by byte offset."""

    def __init__(self, path: str | Path, max_line_bytes: int = 1 << 20):
        self.path = Path(path)
        self.offset = 0
        self.malformed = 0
        self._partial = b""
        self._max_line = max_line_bytes
        self._inode = None

    def read_new(self) -> list[dict]:
        try:
            stat = self.path.stat()
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return []
        if self._inode is not None and stat.st_ino != self._inode or stat.st_size < self.offset:
            self.offset, self._partial = 0, b""  # replaced or truncated: start again
        self._inode = stat.st_ino
        if stat.st_size == self.offset:
            return []
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read(stat.st_size - self.offset)
        except OSError:
            return []
        self.offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > self._max_line:
            self._partial = b""
            self.malformed += 1
        if len(lines) > 64 and max(map(len, lines)) <= self._max_line:
            try:  # one parse of the whole chunk (a few times faster than line by line)
                records = orjson.loads(b"[" + b",".join(lines) + b"]")
                if all(type(r) is dict for r in records):
                    return records
            except orjson.JSONDecodeError:
                pass  # a blank or broken line: line by line, skipping it
        records = []
        for line in lines:
            record = self._parse(line)
            if record is not None:
                records.append(record)
        return records

    def _parse(self, line: bytes) -> dict | None:
        line = line.strip()
        if not line:
            return None
        if len(line) > self._max_line:
            self.malformed += 1
            return None
        record = parse_record(line)
        if record is None:
            self.malformed += 1
        return record

    def read_all(self) -> list[dict]:
        self.offset, self._partial = 0, b""
        return self.read_new()


def read_jsonl(path: str | Path) -> list[dict]:
    return JsonlReader(path).read_all()


def as_number(value: Any) -> float | None:
    """A metric value as a float (NaN/inf strings included), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def device_peak(device: Any) -> float | None:
    """One rank's memory in a metrics row's `mem`: its peak, else its RSS (CPU ranks)."""
    if not isinstance(device, dict):
        return None
    return as_number(device.get("peak")) or as_number(device.get("rss"))


def peak_memory(row: dict) -> float | None:
    """The largest per-rank peak (or RSS) of a metrics row."""
    mem = row.get("mem")
    if not isinstance(mem, dict):
        return None
    peaks = [p for p in map(device_peak, mem.values()) if p is not None]
    return max(peaks) if peaks else None


def train_rows(records: list[dict]) -> list[TrainRow]:
    return [r for r in records if r.get("split", "train") == "train" and as_number(r.get("step")) is not None]


def eval_rows(records: list[dict]) -> list[EvalRow]:
    return [r for r in records if r.get("split") == "eval" and as_number(r.get("step")) is not None]


def dedupe_steps(rows: list[dict]) -> list[dict]:
    """Keep the last row written for each (split, step): a resumed run rewrites steps."""
    steps = [r.get("step") for r in rows]
    if all(type(s) is int for s in steps) and all(a < b for a, b in zip(steps, steps[1:], strict=False)):
        return list(rows)  # the usual case: written once, in order
    latest: dict[tuple, dict] = {}
    for row in rows:
        latest[(row.get("split", "train"), row.get("step"))] = row
    return sorted(latest.values(), key=lambda r: (as_number(r.get("step")) or 0))


def summarize(records: list[dict]) -> dict:
    """Summary figures of a run's metrics for tables and the CLI."""
    train = dedupe_steps(train_rows(records))
    evals = dedupe_steps(eval_rows(records))
    losses = [as_number(r.get("loss")) for r in train]
    eval_losses = [as_number(r.get("eval_loss")) for r in evals]
    finite_eval = [v for v in eval_losses if v is not None and math.isfinite(v)]
    speeds = [as_number(r.get("tokens_per_s")) for r in train]
    speeds = [v for v in speeds if v is not None and math.isfinite(v)]
    peaks = [p for p in (peak_memory(r) for r in train) if p is not None]
    last = train[-1] if train else {}
    return {
        "step": as_number(last.get("step")),
        "max_steps": as_number(last.get("max_steps")),
        "epoch": as_number(last.get("epoch")),
        "last_loss": losses[-1] if losses else None,
        "best_eval_loss": min(finite_eval) if finite_eval else None,
        "tokens_per_s": sorted(speeds)[len(speeds) // 2] if speeds else None,
        "tokens": as_number(last.get("tokens")),
        "peak_mem": max(peaks) if peaks else None,
        "nonfinite_loss": any(v is not None and not math.isfinite(v) for v in losses),
        "last_time": as_number(last.get("time")),
        **preference_best(train, evals),
        "recent_reward": recent_reward(train),
    }


def recent_reward(train: list[dict]) -> float | None:
    """An online RL run's reward now: the mean total `reward` of its last 10% of train rows that
    carry one (at least the last row); None for other runs."""
    values = [v for v in (as_number(r.get("reward")) for r in train) if v is not None and math.isfinite(v)]
    return recent_mean(values)


def recent_mean(values: list[float]) -> float | None:
    """The mean of the last 10% of values (at least one)."""
    if not values:
        return None
    recent = values[-max(1, len(values) // 10):]
    return sum(recent) / len(recent)


PREFERENCE_WINDOW = 10  # train rows averaged before taking the best (one micro batch is noisy)


def preference_best(train: list[dict], evals: list[dict]) -> dict:
    """best_accuracy and best_margin of a preference run (None for other runs): the highest of
    its eval rows when they have them, else the highest running mean of its train rows."""
    out: dict[str, float | None] = {}
    for name, key in (("best_accuracy", "rewards/accuracies"), ("best_margin", "rewards/margins")):
        values = [v for v in (as_number(r.get("eval_" + key)) for r in evals) if v is not None and math.isfinite(v)]
        if not values:
            values = running_means(
                [v for v in (as_number(r.get(key)) for r in train) if v is not None and math.isfinite(v)])
        out[name] = max(values) if values else None
    return out


def running_means(values: list[float], window: int = PREFERENCE_WINDOW) -> list[float]:
    """Means of each window of consecutive values (the means so far while fewer than window)."""
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        out.append(total / min(index + 1, window))
    return out


def rank_memory_path(run_dir: str | Path, rank: int) -> Path:
    """Where a rank keeps its latest memory figures: ranks/memory-<rank>.json (replaced whole)."""
    return RunDir(run_dir).rank_memory(rank)


def write_rank_memory(run_dir: str | Path, rank: int, memory: RankMemory) -> None:
    """A rank's memory figures, replaced atomically (no fsync: a crash only loses a reading)."""
    path = rank_memory_path(run_dir, rank)
    tmp = path.with_name(f".{path.name}.tmp")
    text = json.dumps(memory, separators=(",", ":"))
    try:
        try:
            tmp.write_text(text, encoding="utf-8")
        except FileNotFoundError:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError:  # a full disk (ENOSPC): no half-written temp file is left behind
        tmp.unlink(missing_ok=True)
        raise


def read_rank_memory(run_dir: str | Path) -> dict[str, RankMemory]:
    """Every rank's latest memory figures as a train row's `mem`: {"rank0": {...}, ...}."""
    out: dict[str, RankMemory] = {}
    for path in RunDir(run_dir).rank_memories():
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            rank = int(path.stem.split("-", 1)[1])
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            out[f"rank{rank}"] = record
    return dict(sorted(out.items(), key=lambda item: int(item[0][4:])))


SOURCE_TOKENS_PREFIX = "tokens/"  # a mixture's train rows: tokens/<source label> (the source's tokens so far)


def source_tokens(row: dict) -> dict[str, float]:
    """A mixture's tokens per source in a train row, by source label ({} for one dataset)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        number = as_number(value) if key.startswith(SOURCE_TOKENS_PREFIX) else None
        if number is not None:
            out[key[len(SOURCE_TOKENS_PREFIX):]] = number
    return out


def source_tokens_text(row: dict) -> str:
    """'facts 12,345 (74%) · chat 4,321 (26%)': each source's tokens so far and its share ('' for one
    dataset)."""
    counts = source_tokens(row)
    total = sum(counts.values())
    return " · ".join(f"{label} {count:,.0f} ({count / total:.0%})" if total else f"{label} 0"
                      for label, count in counts.items())
