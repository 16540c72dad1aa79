"""Run history as data: one RunRow per run directory, and the loader a worker thread drives.
No Textual here: the loader runs in a thread and only returns values; the screen posts them as
messages. The filter/sort/mark model of the table is in history_model.py.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

from tuiapp.core.common.methods import is_rl
from tuiapp.core.run_folder import benchmarks, evals, rundir
from tuiapp.core.run_folder.metrics import (
    PREFERENCE_WINDOW,
    JsonlReader,
    as_number,
    dedupe_steps,
    eval_rows,
    peak_memory,
    preference_best,
    recent_mean,
    running_means,
    summarize,
    train_rows,
)
from tuiapp.core.run_folder.progress import fmt_duration
from tuiapp.core.run_folder.rundata import SUMMARISE_MIN_BYTES, RunData, columns_cache, numpy_module, read_run_data
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.run_folder.runstate import STALL_WINDOW, StatusView, error_log, status_view, steps_counting, why_text
from tuiapp.core.store import meta
from tuiapp.core.store.runs import ACTIVE, Run, RunStore
from tuiapp.ui.primary_reward import TOTAL_KEY, primary_reward_key
from tuiapp.ui.run_panes import flag_text

SPARK_POINTS = 48  # losses kept per row for the sparkline
STATUSES = rundir.STATUSES  # created, starting, running, stopping, stopped, succeeded, failed, unknown


@dataclass
class RunRow:
    """What the history table and the compare summary show of one run."""

    id: str
    path: Path
    name: str = ""
    status: str = "unknown"
    method: str = ""
    model: str = ""
    dataset: str = ""
    description: str = ""
    started: float | None = None  # the first attempt's start
    ended: float | None = None
    created: float | None = None
    reason: str | None = None
    error: dict | None = None  # the root cause of a failure: {rank, type, message, log}
    phase: str | None = None  # start-up phase while starting
    phase_since: float | None = None
    hang: dict | None = None  # a start-up phase that made no progress
    orphans: bool = False  # ranks outlived their supervisor
    stop_requested: float | None = None
    attempts: list[dict] = field(default_factory=list)  # every attempt (rundir.attempts_of)
    attempt_count: int = 0
    step: float | None = None
    max_steps: float | None = None
    last_loss: float | None = None
    best_eval_loss: float | None = None
    eval_ppl: float | None = None  # the latest `llmtui eval` (runs/<id>/evals/): the tuned and base perplexity
    eval_base_ppl: float | None = None
    bench: dict = field(default_factory=dict)  # {task: main metric}: the last eval's benchmarks, else `eval --benchmark`
    best_accuracy: float | None = None  # preference runs: reward accuracy and margin (metrics.preference_best)
    best_margin: float | None = None
    reward: float | None = None  # grpo/rloo runs: the mean reward of the last 10% of steps (metrics.recent_mean)
    reward_key: str = TOTAL_KEY  # which: the task's reward (primary_reward), else the total
    held_out: float | None = None  # grpo/rloo runs: that reward on the held-out prompts at the last evaluation
    tokens_per_s: float | None = None
    peak_mem: float | None = None
    last_time: float | None = None
    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)  # last few row times (stall check)
    summarized: bool = False
    unreadable: int = 0  # lines of metrics.jsonl that are not JSON records (a broken or foreign file)
    # what the user says about it (meta.json) and where it stands in the experiment manager
    display_name: str | None = None
    tags: list[str] = field(default_factory=list)
    note: str = ""
    archived: bool = False
    group: dict | None = None  # a sweep's run: {id, name, index, keys, values}
    queue_position: int | None = None  # 1-based place of a queued run in the device queue

    @property
    def title(self) -> str:
        """The name it is shown with: the display name the user gave it, else its recipe's."""
        return self.display_name or self.name

    def metrics_note(self) -> str:
        """'' when metrics.jsonl reads well; else how much of it could not be read."""
        if not self.unreadable:
            return ""
        lines = f"{self.unreadable} line{'s' if self.unreadable != 1 else ''}"
        if self.step is None and not self.losses:
            return f"metrics unreadable ({lines} of metrics.jsonl are not JSON records)"
        return f"{lines} of metrics.jsonl unreadable"

    def held_out_text(self) -> str:
        """'held out answer 0.730': an RL run's headline reward on its held-out prompts ('' when none)."""
        if self.held_out is None:
            return ""
        name = self.reward_key.removeprefix("rewards/").removesuffix("/mean") if self.reward_key != TOTAL_KEY else "total"
        return f"held out {name} {self.held_out:.3f}"

    @property
    def group_id(self) -> str | None:
        return self.group.get("id") if isinstance(self.group, dict) and self.group.get("id") else None

    def duration(self, now: float) -> float | None:
        """Time spent running, summed over every attempt (rundir.duration_s)."""
        return rundir.duration_s(rundir.RunRecord(attempts=self.attempts, ended=self.ended, status=self.status), now)

    def time_text(self, now: float) -> str:
        """Time spent over every attempt, and how many there were: '3m55s ×3'."""
        seconds = self.duration(now)
        if seconds is None:
            return ""
        return fmt_duration(seconds) + (f" ×{self.attempt_count}" if self.attempt_count > 1 else "")

    def view(self, now: float) -> StatusView:
        if steps_counting(self.status, rundir.RunRecord(attempts=self.attempts, started=self.started), self.step_times):
            return status_view("running", now, orphans=self.orphans, step_times=self.step_times)
        return status_view(self.status, now, phase=self.phase, phase_since=self.phase_since, hang=self.hang,
                           orphans=self.orphans, stop_requested=self.stop_requested, step_times=self.step_times,
                           queue_position=self.queue_position)

    def stalled(self, now: float) -> bool:
        return self.view(now).key == "stalled"

    def display_status(self, now: float) -> str:
        return self.view(now).key

    def why(self) -> str | None:
        """The root cause of a failure, else the reason, in one line."""
        return why_text(rundir.RunRecord(status=self.status, error=self.error, reason=self.reason))

    def state(self) -> tuple:
        """What the status cell and detail line show, to tell a changed row from the same."""
        return (self.status, self.phase, self.phase_since, self.hang, self.orphans, self.stop_requested,
                self.attempt_count, self.ended, self.reason, self.error, self.queue_position, self.display_name,
                tuple(self.tags), self.note, self.archived, str(self.group))

    def matches(self, text: str) -> bool:
        """Every word of the filter: `tag:NAME` needs that tag, any other word must appear in the
        name, display name, id, method, model, dataset, status, tags, note or sweep name."""
        words = text.lower().split()
        tags = {t.lower() for t in self.tags}
        if any(w.startswith("tag:") and w[4:] and w[4:] not in tags for w in words):
            return False
        haystack = " ".join((self.name, self.display_name or "", self.id, self.method, self.model, self.dataset,
                             self.description, self.status, self.phase or "", "hung" if self.hang else "",
                             "orphaned" if self.orphans else "", " ".join(self.tags), self.note,
                             str((self.group or {}).get("name") or ""))).lower()
        return all(word in haystack for word in words if not (word.startswith("tag:") and word[4:]))


def row_from_record(path: Path, record: rundir.RunRecord, notes: dict | None = None,
                    queue_position: int | None = None) -> RunRow:
    """A row of run.json (its record) and, when given, meta.json (`notes`: tags, note, display
    name, archived) and the run's place in the device queue."""
    status = str(record.status or "unknown")
    hang = record.hang
    notes = notes or {}
    group = record.group
    return RunRow(
        id=path.name,
        path=path,
        name=str(record.name or path.name),
        status=status,
        method=str(record.method or ""),
        model=str(record.model_ref or record.model or ""),
        dataset=str(record.dataset or ""),
        description=str((record.recipe or {}).get("description") or ""),
        reward_key=primary_reward_key(record.recipe) if is_rl(record.method) else TOTAL_KEY,
        started=as_number(rundir.first_started(record)),
        ended=as_number(record.ended),
        created=as_number(record.created),
        reason=record.reason,
        error=record.error,
        phase=record.phase if status == "starting" else None,
        phase_since=as_number(record.phase_since),
        hang=hang if status == "starting" else None,
        orphans=record.orphans,
        stop_requested=as_number(record.stop_requested),
        attempts=rundir.attempts_of(record),
        attempt_count=rundir.attempt_count(record),
        display_name=str(notes["display_name"]) if notes.get("display_name") else None,
        tags=list(notes.get("tags") or []),
        note=str(notes.get("note") or ""),
        archived=bool(notes.get("archived")),
        group=group if isinstance(group, dict) and group.get("id") else None,
        queue_position=queue_position if status == "queued" else None,
    )


def with_meta(row: RunRow, notes: dict) -> RunRow:
    """The row with what meta.json says now (after a tag, note, rename or archive)."""
    return replace(row, display_name=str(notes["display_name"]) if notes.get("display_name") else None,
                   tags=list(notes.get("tags") or []), note=str(notes.get("note") or ""),
                   archived=bool(notes.get("archived")))


def queue_positions(runs_root: Path) -> dict[str, int]:
    """Every queued run's 1-based place in the device queue (one read of the queue folder)."""
    from tuiapp.core.store import queue  # only when a queued run is listed: kept off the start-up

    return {entry.run_id: index for index, entry in enumerate(queue.waiting(runs_root), start=1)}


def with_metrics(row: RunRow, records: list[dict]) -> RunRow:
    """The row with its summary figures and sparkline taken from all its metrics records."""
    summary = summarize(records)
    evaluated = evals.latest(row.path)
    train = dedupe_steps(train_rows(records))
    losses = [as_number(r.get("loss")) for r in train]
    finite = [v for v in losses if v is not None and math.isfinite(v)]
    times = [as_number(r.get("time")) for r in train[-STALL_WINDOW:]]
    return replace(
        row,
        step=summary["step"],
        max_steps=summary["max_steps"],
        last_loss=summary["last_loss"],
        best_eval_loss=eval_loss_of(row, summary["best_eval_loss"]),
        eval_ppl=evals.number(evaluated, "tuned", "perplexity"),
        eval_base_ppl=evals.number(evaluated, "base", "perplexity"),
        best_accuracy=summary["best_accuracy"],
        best_margin=summary["best_margin"],
        reward=(summary["recent_reward"] if row.reward_key == TOTAL_KEY else recent_mean(
            [v for v in (as_number(r.get(row.reward_key)) for r in train) if v is not None and math.isfinite(v)]))
        if is_rl(row.method) else None,
        held_out=held_out_reward(row, eval_rows(records)),
        tokens_per_s=summary["tokens_per_s"],
        peak_mem=summary["peak_mem"],
        last_time=summary["last_time"],
        losses=_thin(finite, SPARK_POINTS),
        step_times=[t for t in times if t is not None],
        bench=bench_summary(row.path, [r for r in records if r.get("split") == "eval"]),
        summarized=True,
    )


def with_run_data(row: RunRow, data: RunData) -> RunRow:
    """`with_metrics` from a run's metrics in columns (read_run_data): a long run's summary
    without a Python loop over its rows (peak memory is kept in GB there: equal to ~1e-6)."""
    last = data.last_train
    accuracies, margins = data.series["rewards/accuracies"].ys, data.series["rewards/margins"].ys
    train = [{"rewards/accuracies": a} for a in accuracies] + [{"rewards/margins": m} for m in margins]
    best = preference_best(train, data.eval_records) if train or data.eval_records else {}
    peaks = [max(s.ys) for s in data.memory.values() if len(s)]
    evaluated = evals.latest(row.path)
    return replace(
        row,
        step=data.steps[-1] if data.steps else None,
        max_steps=as_number(last.get("max_steps")),
        last_loss=as_number(last.get("loss")),
        best_eval_loss=eval_loss_of(row, data.best_eval()),
        eval_ppl=evals.number(evaluated, "tuned", "perplexity"),
        eval_base_ppl=evals.number(evaluated, "base", "perplexity"),
        best_accuracy=best.get("best_accuracy"),
        best_margin=best.get("best_margin"),
        # the task's reward (its rewards/NAME/mean series), the total for a run that logged no such key
        reward=recent_mean(data.series.get(row.reward_key, data.series[TOTAL_KEY]).ys) if is_rl(row.method) else None,
        held_out=held_out_reward(row, data.eval_records),
        tokens_per_s=_upper_median(data.series["tokens_per_s"].ys),
        peak_mem=max(peaks) * 1e9 if peaks else None,
        last_time=as_number(last.get("time")),
        losses=_thin(list(data.loss.ys), SPARK_POINTS),
        step_times=[t for t in data.times[-STALL_WINDOW:] if not math.isnan(t)],
        bench=bench_summary(row.path, data.eval_records),
        summarized=True,
    )


def eval_loss_of(row: RunRow, best: float | None) -> float | None:
    """The best eval loss a row shows: None for a grpo/rloo run, whose eval loss (TRL's, on the
    held-out prompts) says nothing about the task; its held-out reward is its headline (`held_out`)."""
    return None if is_rl(row.method) else best


def held_out_reward(row: RunRow, eval_records: list[dict]) -> float | None:
    """A grpo/rloo run's headline reward (row.reward_key) on the held-out prompts: its value in the
    last eval row that scored it (reward_health.held_out_brief's last figure); None for other runs."""
    if not is_rl(row.method):
        return None
    key = "eval_" + row.reward_key
    values = [as_number(r.get(key)) for r in eval_records]
    found = [v for v in values if v is not None and math.isfinite(v)]
    return found[-1] if found else None


def bench_summary(path: Path | None, eval_records: list[dict]) -> dict:
    """{task: its main metric}: the benchmarks of the run's last evaluation that scored them, else
    the final model's in its latest `llmtui eval --benchmark`."""
    found = benchmarks.latest_scores(eval_records)
    if not found and path is not None:
        latest = benchmarks.latest(path)
        tuned = [m for m in (latest or {}).get("models") or [] if isinstance(m, dict) and m.get("model") != "base"]
        found = (tuned[-1].get("scores") or {}) if tuned else {}
    return benchmarks.headline(found)


def _upper_median(values) -> float | None:
    """summarize's tokens/s (sorted(values)[n // 2]), with numpy's partition when it can."""
    if not len(values):
        return None
    np = numpy_module()
    if np is None:
        return sorted(values)[len(values) // 2]
    return float(np.partition(np.frombuffer(values, dtype=np.float64), len(values) // 2)[len(values) // 2])


def _thin(values: list[float], count: int) -> list[float]:
    if len(values) <= count:
        return values
    step = len(values) / count
    return [values[min(len(values) - 1, int(i * step))] for i in range(count - 1)] + [values[-1]]


class LiveSummary:
    """The summary of a growing metrics file, kept up to date from new records alone, so a
    long live run costs the same on every poll (no re-reading, bounded memory). Figures match
    `with_metrics` except tokens/s, the median of the last few thousand steps."""

    def __init__(self) -> None:
        self.last: dict = {}
        self.best_eval: float | None = None
        self.peak: float | None = None
        self.speeds: deque[float] = deque(maxlen=4096)
        self.losses: list[float] = []
        self.stride = 1
        self.seen = 0
        self.times: deque[float] = deque(maxlen=STALL_WINDOW)
        self.preference = PreferenceBest()
        self.rewards: list[float] = []  # an online RL run's total reward per step (a float a step)
        self.each_reward: dict[str, list[float]] = {}  # and each reward's mean, by metrics key
        self.held_out: dict[str, float] = {}  # the last eval row's value of each reward, by metrics key (eval_...)

    @classmethod
    def from_data(cls, data: RunData) -> "LiveSummary":
        """The summary of the rows in `data` (a long run read in columns), to go on from."""
        live = cls()
        live.last = data.last_train
        live.best_eval = data.best_eval()
        peaks = [max(s.ys) for s in data.memory.values() if len(s)]
        live.peak = max(peaks) * 1e9 if peaks else None
        live.speeds.extend(data.series["tokens_per_s"].ys[-live.speeds.maxlen:])
        losses = data.loss.ys
        live.seen = len(losses)
        while len(losses) // live.stride > 8 * SPARK_POINTS:
            live.stride *= 2
        live.losses = list(losses[live.stride - 1 :: live.stride])
        live.times.extend(t for t in data.times[-STALL_WINDOW:] if not math.isnan(t))
        live.preference = PreferenceBest.from_data(data)
        live.rewards = list(data.series["reward"].ys)
        for record in data.eval_records:
            live._held_out(record)
        return live

    def add(self, records: list[dict]) -> None:
        for record in records:
            split = record.get("split", "train")
            self.preference.add(record, split)
            if split == "eval":
                value = as_number(record.get("eval_loss"))
                if value is not None and math.isfinite(value):
                    self.best_eval = value if self.best_eval is None else min(self.best_eval, value)
                self._held_out(record)
            elif split == "train" and "step" in record:
                self._train(record)

    def _held_out(self, record: dict) -> None:
        for key, value in record.items():
            if key == "eval_" + TOTAL_KEY or key.startswith("eval_rewards/"):
                number = as_number(value)
                if number is not None and math.isfinite(number):
                    self.held_out[key] = number

    def _train(self, record: dict) -> None:
        self.last = record
        loss = as_number(record.get("loss"))
        if loss is not None and math.isfinite(loss):
            self.seen += 1
            if self.seen % self.stride == 0:
                self.losses.append(loss)
                if len(self.losses) > 8 * SPARK_POINTS:  # keep every other one from now on
                    self.losses = self.losses[::2]
                    self.stride *= 2
        reward = as_number(record.get("reward"))
        if reward is not None and math.isfinite(reward):
            self.rewards.append(reward)
            for key, value in record.items():
                if key.startswith("rewards/") and key.endswith("/mean") and isinstance(value, (int, float)):
                    self.each_reward.setdefault(key, []).append(value)
        speed = as_number(record.get("tokens_per_s"))
        if speed is not None and math.isfinite(speed):
            self.speeds.append(speed)
        value = peak_memory(record)
        if value is not None:
            self.peak = value if self.peak is None else max(self.peak, value)
        when = as_number(record.get("time"))
        if when is not None:
            self.times.append(when)

    def apply(self, row: RunRow) -> RunRow:
        last = self.last
        speeds = sorted(self.speeds)
        return replace(
            row,
            step=as_number(last.get("step")),
            max_steps=as_number(last.get("max_steps")),
            last_loss=as_number(last.get("loss")),
            best_eval_loss=eval_loss_of(row, self.best_eval),
            best_accuracy=self.preference.best("best_accuracy"),
            best_margin=self.preference.best("best_margin"),
            reward=recent_mean(self.each_reward.get(row.reward_key, self.rewards)) if is_rl(row.method) else None,
            held_out=self.held_out.get("eval_" + row.reward_key) if is_rl(row.method) else None,
            tokens_per_s=speeds[len(speeds) // 2] if speeds else None,
            peak_mem=self.peak,
            last_time=as_number(last.get("time")),
            losses=_thin(self.losses, SPARK_POINTS),
            step_times=list(self.times),
            summarized=True,
        )


class PreferenceBest:
    """core's preference_best kept up to date record by record (eval rows win once there are any)."""

    KEYS = {"best_accuracy": "rewards/accuracies", "best_margin": "rewards/margins"}

    def __init__(self) -> None:
        self.windows = {name: deque(maxlen=PREFERENCE_WINDOW) for name in self.KEYS}
        self.train_best: dict[str, float] = {}
        self.eval_best: dict[str, float] = {}

    @classmethod
    def from_data(cls, data: RunData) -> "PreferenceBest":
        best = cls()
        for name, key in cls.KEYS.items():
            values = data.series[key].ys
            best.windows[name].extend(values[-PREFERENCE_WINDOW:])
            if len(values):
                best.train_best[name] = max(running_means(list(values)))
            found = [v for v in (as_number(r.get("eval_" + key)) for r in data.eval_records)
                     if v is not None and math.isfinite(v)]
            if found:
                best.eval_best[name] = max(found)
        return best

    def add(self, record: dict, split: str) -> None:
        for name, key in self.KEYS.items():
            if split == "eval":
                value = as_number(record.get("eval_" + key))
                if value is not None and math.isfinite(value):
                    self.eval_best[name] = max(value, self.eval_best.get(name, value))
            elif split == "train":
                value = as_number(record.get(key))
                if value is not None and math.isfinite(value):
                    window = self.windows[name]
                    window.append(value)
                    mean = sum(window) / len(window)
                    self.train_best[name] = max(mean, self.train_best.get(name, mean))

    def best(self, name: str) -> float | None:
        return self.eval_best.get(name, self.train_best.get(name))


POLL_SHARE = 250  # finished runs whose files one poll looks at (every run within len/POLL_SHARE polls)


class Rotation:
    """A bounded share of a long list per poll, in turn: with 10,000 finished runs a poll stats
    250 of them (each is looked at every 40 polls, ~80 s; with up to 250 runs, every poll) instead
    of all 10,000 every 2 s, which kept a core 12-19 % busy doing nothing (1,000 a poll: 11-13 %).
    Lists up to `size` are taken whole."""

    def __init__(self, size: int = POLL_SHARE) -> None:
        self.size = size
        self.start = 0

    def take(self, items: list) -> list:
        if len(items) <= self.size:
            return items
        start = self.start % len(items)
        out = items[start : start + self.size]
        if len(out) < self.size:
            out += items[: self.size - len(out)]
        self.start = start + self.size
        return out


class HistoryLoader:
    """Reads the runs folder for the home screen: the screen reads the first screenful with it,
    then one worker thread owns it."""

    def __init__(self, root: Path):
        self.store = RunStore(root)
        self.known: dict[str, tuple[float, float]] = {}  # run id -> (run.json, meta.json) mtimes when last read
        self.active: dict[str, tuple[JsonlReader, LiveSummary, RunRow]] = {}
        self.removed: list[str] = []  # run folders gone since the last poll (deleted to the trash)
        self._positions: dict[str, int] | None = None  # the queue, read at most once per load or poll
        self.rotation = Rotation()  # finished runs' files: a share of them per poll, in turn
        self._listed: int | None = None  # the runs folder's mtime (ns) when last listed

    def _position(self, run: Run) -> int | None:
        if run.status != "queued":
            return None
        if self._positions is None:
            self._positions = queue_positions(self.store.root)
        return self._positions.get(run.id)

    def _row(self, path: Path, run: Run) -> RunRow:
        return row_from_record(path, run.record, meta.read_meta(path), self._position(run))

    def scan(self) -> list[str]:
        """Run folders (ids) not seen before, newest first (ids start with the UTC time). A folder
        made or removed in the runs folder changes its mtime: while that stays, no listing of 10,000
        entries is needed (unless it changed within the last second, as coarse as a kernel tick)."""
        try:
            listed = os.stat(self.store.root).st_mtime_ns
        except OSError:
            listed = None
        if listed is not None and listed == self._listed and time.time() - listed / 1e9 > 1.0:
            return []
        self._listed = listed
        fresh = [name for name in self.store.run_names() if name not in self.known]
        fresh.reverse()
        return fresh

    def load_infos(self, names: list[str], batch: int, max_batch: int | None = None) -> Iterator[list[RunRow]]:
        """run.json of each folder, in batches; active runs get their liveness checked. Batches
        double up to max_batch: the first rows show at once, and 10,000 runs take few messages."""
        rows: list[RunRow] = []
        max_batch = max_batch or batch
        self._positions = None
        for name in names:
            path = self.store.root / name
            self.known[name] = _stamp(path)
            run = Run(path).load()
            if run.status in ACTIVE:
                run.refresh_truth()
            rows.append(self._row(path, run))
            if len(rows) >= batch:
                yield rows
                rows = []
                batch = min(max_batch, batch * 2)
        if rows:
            yield rows

    def summarize(self, row: RunRow) -> RunRow:
        """Read a run's metrics once; active runs keep their reader for later polls. A long run
        (over SUMMARISE_MIN_BYTES) is read in columns: those its trainer keeps, else the TUI's
        cache of them (made here on the first read), and the lines written since."""
        path = RunDir(row.path).metrics
        try:
            long = path.stat().st_size >= SUMMARISE_MIN_BYTES
        except OSError:
            long = False
        if long:
            data, reader = read_run_data(path, columns_cache(row.path))
            summarized = replace(with_run_data(row, data), unreadable=reader.malformed)
            live = LiveSummary.from_data(data) if row.status in ACTIVE else None
        else:
            reader = JsonlReader(path)
            records = reader.read_new()
            summarized = replace(with_metrics(row, records), unreadable=reader.malformed)
            live = LiveSummary() if row.status in ACTIVE else None
            if live is not None:
                live.add(records)
        if live is not None:
            self.active[row.id] = (reader, live, summarized)
        return summarized

    def poll(self) -> list[RunRow]:
        """Rows that changed since the last poll: active runs' status, metrics, notes or queue
        place, and finished runs whose run.json or meta.json was rewritten (resumed, tagged from
        the CLI, say). Folders that are gone are listed in `removed`."""
        changed = []
        self.removed = []
        self._positions = None
        for run_id in self.rotation.take([run_id for run_id in self.known if run_id not in self.active]):
            seen = self.known.get(run_id)
            if seen is None:
                continue
            path = self.store.root / run_id
            stamp = _stamp(path)
            if stamp != seen:
                if stamp == (0.0, 0.0) and not path.is_dir():
                    del self.known[run_id]
                    self.removed.append(run_id)
                    continue
                self.known[run_id] = stamp
                changed.append(self.summarize(self._row(path, Run(path).load())))
        for run_id, (reader, live, row) in list(self.active.items()):
            if not row.path.is_dir():
                del self.active[run_id]
                self.known.pop(run_id, None)
                self.removed.append(run_id)
                continue
            run = Run(row.path).load().refresh_truth()
            fresh = self._row(row.path, run)
            new = reader.read_new()
            live.add(new)
            if fresh.status not in ACTIVE:  # finished: exact figures from the whole file, once
                del self.active[run_id]
                self.known[run_id] = _stamp(row.path)
                changed.append(self.summarize(fresh))
            elif new or fresh.state() != row.state():
                row = replace(live.apply(fresh), unreadable=reader.malformed)
                self.active[run_id] = (reader, live, row)
                changed.append(row)
        return changed


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _stamp(path: Path) -> tuple[float, float]:
    """When a run's run.json and meta.json last changed (0.0 for a missing file)."""
    return _mtime(RunDir(path).record), _mtime(RunDir(path).meta)


def detail_text(row: RunRow, now: float) -> str:
    """The history's line under the table for the highlighted run: what its status means (the
    phase of a start, a flag's hint, the root cause of a failure), else its id and description."""
    view = row.view(now)
    if view.flagged:
        text = flag_text(view)
    elif view.key in ("starting", "stopping", "queued"):
        text = view.label
    elif row.status in ("failed", "stopped"):
        text = row.why() or row.status
        log = error_log(row.error, row.path) if row.status == "failed" else None
        if log:
            text += f" · log: {log}"
    else:
        text = row.id
    # what the user said about it comes before the recipe's description
    extra = " · ".join(t for t in (row.metrics_note(), " ".join(f"#{tag}" for tag in row.tags), row.note,
                                   "archived" if row.archived else "", row.description if text == row.id else "") if t)
    return f"{view.mark} {row.title}: {text}" + (f" · {extra}" if extra else "")
