"""The device queue, without a daemon: each run's own supervisor waits for its turn, claims its
devices under one lock, and releases them when it ends.

Files under <runs>/.queue/:
  lock              flock held while a supervisor decides and claims (a few ms)
  waiting/<id>.json  a queued run: {priority, order, enqueued, slots, devices}; order is FIFO
                     (the enqueue time) unless `llmtui queue move` changed it
  claims/<id>.json   devices a started run holds: {devices, slots, host, pid, pid_create_time, pgid}
Every started run claims (queued or not), so runs outside the queue count too. A waiting entry
whose supervisor is gone is ignored and removed; so is a claim, once no process of the
supervisor's group (its ranks, which can outlive it) is left. A model `llmtui serve` serves
claims too, as `<id>.serve` owned by its server (tuiapp.core.store.served).

Devices are GPU ids with CUDA; without CUDA each run takes one of `slots` slots (default 1,
LLMTUI_QUEUE_SLOTS or --slots).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tuiapp.core.machine import runlock
from tuiapp.core.machine.gpus import GpuInfo
from tuiapp.core.machine.procs import group_processes, process_alive
from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.rundir import RunDir

QUEUE_DIR = ".queue"
SLOTS_ENV = "LLMTUI_QUEUE_SLOTS"
FOREIGN_ENV = "LLMTUI_QUEUE_FOREIGN_MB"  # a GPU with a foreign process using more than this is busy
POLL_S = 1.0


def default_slots() -> int:
    try:
        return max(1, int(os.environ.get(SLOTS_ENV, "1")))
    except ValueError:
        return 1


def foreign_threshold_bytes() -> int:
    try:
        return int(float(os.environ.get(FOREIGN_ENV, "512")) * 2**20)
    except ValueError:
        return 512 * 2**20


def queue_dir(runs_root: Path) -> Path:
    return Path(runs_root) / QUEUE_DIR


@contextmanager
def decision_lock(runs_root: Path):
    """The one lock under which supervisors decide and claim."""
    folder = queue_dir(runs_root)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, sort_keys=True))


# ---------------------------------------------------------------- waiting runs


@dataclass
class Waiting:
    run_id: str
    priority: int
    order: float
    enqueued: float
    slots: int
    devices: int | list[int]  # a count, or the GPU ids the recipe names

    @property
    def key(self) -> tuple:
        return (-self.priority, self.order, self.run_id)


def waiting_path(runs_root: Path, run_id: str) -> Path:
    return queue_dir(runs_root) / "waiting" / f"{run_id}.json"


def enqueue(runs_root: Path, run_id: str, *, priority: int = 0, slots: int | None = None,
            devices: int | list[int] = 1, now: float | None = None) -> Waiting:
    now = time.time() if now is None else now
    entry = Waiting(run_id, priority, now, now, slots or default_slots(), devices)
    _write(waiting_path(runs_root, run_id), vars(entry))
    return entry


def dequeue(runs_root: Path, run_id: str) -> None:
    waiting_path(runs_root, run_id).unlink(missing_ok=True)


def _alive(runs_root: Path, run_id: str) -> bool:
    """A queued run is alive while its supervisor holds the run's lock."""
    return bool(runlock.held(RunDir(Path(runs_root) / run_id).lock()))


def waiting(runs_root: Path, prune: bool = False) -> list[Waiting]:
    """Queued runs in the order they will start."""
    out = []
    for path in (queue_dir(runs_root) / "waiting").glob("*.json"):
        record = _read(path)
        run_id = path.stem
        if record is None or not _alive(runs_root, run_id):
            if prune:
                path.unlink(missing_ok=True)
            continue
        try:
            out.append(Waiting(run_id, int(record.get("priority", 0)), float(record["order"]),
                               float(record.get("enqueued", record["order"])), int(record.get("slots", 1)),
                               record.get("devices", 1)))
        except (KeyError, TypeError, ValueError):
            continue
    return sorted(out, key=lambda w: w.key)


def move(runs_root: Path, run_id: str, where: str) -> list[Waiting]:
    """Reorder a queued run: 'top', 'up', 'down' or 'bottom' (within its priority)."""
    with decision_lock(runs_root):
        queue = waiting(runs_root)
        ids = [w.run_id for w in queue]
        if run_id not in ids:
            raise KeyError(run_id)
        index = ids.index(run_id)
        me = queue[index]
        peers = [w for w in queue if w.priority == me.priority]
        at = peers.index(me)
        if where == "top" and at > 0:
            me.order = peers[0].order - 1.0
        elif where == "bottom" and at < len(peers) - 1:
            me.order = peers[-1].order + 1.0
        elif where == "up" and at > 0:
            me.order, peers[at - 1].order = peers[at - 1].order, me.order
            _write(waiting_path(runs_root, peers[at - 1].run_id), vars(peers[at - 1]))
        elif where == "down" and at < len(peers) - 1:
            me.order, peers[at + 1].order = peers[at + 1].order, me.order
            _write(waiting_path(runs_root, peers[at + 1].run_id), vars(peers[at + 1]))
        _write(waiting_path(runs_root, run_id), vars(me))
        return waiting(runs_root)


# ---------------------------------------------------------------- claims


def claim_path(runs_root: Path, run_id: str) -> Path:
    return queue_dir(runs_root) / "claims" / f"{run_id}.json"


def claims(runs_root: Path, host: str | None = None) -> dict[str, dict]:
    """Live claims of this host (a claim whose supervisor is gone is removed)."""
    host = host or socket.gethostname()
    out = {}
    for path in (queue_dir(runs_root) / "claims").glob("*.json"):
        record = _read(path)
        if record is None:
            continue
        if record.get("host") != host:
            continue
        if not process_alive(record.get("pid"), record.get("pid_create_time")) \
                and not group_processes(record.get("pgid")):  # ranks outliving their supervisor hold on
            path.unlink(missing_ok=True)
            continue
        out[path.stem] = record
    return out


def release(runs_root: Path, run_id: str) -> None:
    claim_path(runs_root, run_id).unlink(missing_ok=True)


def free_gpus(gpus: list[GpuInfo], held: set[int], foreign_bytes: int | None = None) -> list[int]:
    """GPU ids no llmtui run holds and no foreign process uses (beyond the threshold)."""
    limit = foreign_threshold_bytes() if foreign_bytes is None else foreign_bytes
    return [g.index for g in gpus
            if g.index not in held and sum(p.used_bytes for p in g.other_processes) <= limit]


def fit(want: int | list[int], *, cuda_gpus: list[GpuInfo], live: dict[str, dict], slots: int,
        foreign_bytes: int | None = None) -> list[int] | None:
    """The devices this run gets now, or None when it must wait. With CUDA: GPU ids (the ones
    the recipe names, or the lowest free ones); without: [] when a slot is free."""
    if not cuda_gpus:
        used = sum(int(c.get("slots_used", 1)) for c in live.values())
        return [] if used < slots else None
    held = {d for c in live.values() for d in c.get("devices") or []}
    free = free_gpus(cuda_gpus, held, foreign_bytes)
    if isinstance(want, list):
        return list(want) if all(d in free for d in want) else None
    return free[:want] if len(free) >= want else None


def write_claim(runs_root: Path, run_id: str, devices: list[int], pid: int, pid_create_time: float | None,
                pgid: int | None = None, slots_used: int = 1) -> None:
    """`slots_used`: CPU slots it takes (0 for a served model, see tuiapp.core.store.served)."""
    if pgid is None:
        try:
            pgid = os.getpgid(pid)  # the supervisor's group: its ranks', which may outlive it
        except ProcessLookupError:
            pgid = None
    _write(claim_path(runs_root, run_id), {"devices": devices, "slots_used": slots_used, "host": socket.gethostname(),
                                           "pid": pid, "pid_create_time": pid_create_time, "pgid": pgid,
                                           "since": time.time()})


def try_start(runs_root: Path, run_id: str, *, want: int | list[int], slots: int, queued: bool,
              cuda_gpus: list[GpuInfo], pid: int, pid_create_time: float) -> list[int] | None:
    """Under the queue lock: is it this run's turn, and do its devices fit? Then claim them.
    A run launched outside the queue claims what it asked for without waiting (it counts for
    the queue; it never waits on it)."""
    with decision_lock(runs_root):
        live = claims(runs_root)
        live.pop(run_id, None)
        if queued:
            ahead = waiting(runs_root, prune=True)
            if ahead and ahead[0].run_id != run_id:
                return None
            devices = fit(want, cuda_gpus=cuda_gpus, live=live, slots=slots)
            if devices is None:
                return None
        else:
            devices = list(want) if isinstance(want, list) else []
        write_claim(runs_root, run_id, devices, pid, pid_create_time)
        dequeue(runs_root, run_id)
        return devices


def position(runs_root: Path, run_id: str) -> int | None:
    """1-based place in the queue, or None when not queued."""
    for index, entry in enumerate(waiting(runs_root), start=1):
        if entry.run_id == run_id:
            return index
    return None
