"""Driving the real CLI, launcher and trainer from tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def llmtui(*args: str, runs_dir: Path, timeout: float = 600, check: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs_dir), *args]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} -> {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


def spawn_llmtui(*args: str, runs_dir: Path, new_session: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs_dir), *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=new_session)


def only_run(runs_dir: Path) -> Path:
    runs = [p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]  # .queue, .trash...
    assert len(runs) == 1, runs
    return runs[0]


def run_info(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in metrics(run_dir) if r.get("split", "train") == "train"]


def steps_reached(run_dir: Path, count: int) -> bool:
    """True once a run has logged `count` steps; fails fast (with the log) if the run ended."""
    if len(train_steps(run_dir)) >= count:
        return True
    status = run_info(run_dir).get("status") if (run_dir / "run.json").exists() else None
    if status in ("failed", "stopped", "succeeded"):
        log = (run_dir / "stdout.log").read_text(errors="replace")[-4000:] if (run_dir / "stdout.log").exists() else ""
        raise AssertionError(f"run ended as {status} before step {count}:\n{log}")
    return False


def wait_for(predicate, timeout: float = 300, interval: float = 0.5, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def group_pids(pgid: int) -> list[int]:
    pids = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                pids.append(proc.pid)
        except (ProcessLookupError, psutil.Error, OSError):
            pass
    return pids


def rank_pids(run_dir: Path) -> list[int]:
    """Pids of the trainer ranks of a run (by command line)."""
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "tuiapp.trainer" in cmd and str(run_dir) in cmd and "deepspeed.launcher.runner" not in cmd \
                and not any("deepspeed.launcher.launch" in c for c in cmd):
            pids.append(proc.pid)
    return pids


def stop_after(run_dir: Path, steps: int, runs_dir: Path, timeout: float = 600) -> tuple[int, str]:
    """`llmtui stop` once a run has logged `steps` steps, certainly before it ends: its ranks are
    paused (SIGSTOP) until the supervisor has heard the stop, so the SIGTERM waits for them and a
    tiny run cannot finish its last steps in the seconds the stop command takes to start.
    Returns the stop command's exit code and output."""
    wait_for(lambda: steps_reached(run_dir, steps), timeout=timeout, interval=0.05, what=f"{steps} steps")
    ranks = rank_pids(run_dir)
    assert ranks, "no rank process found"
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    try:
        stopper = spawn_llmtui("stop", run_dir.name, runs_dir=runs_dir)
        wait_for(lambda: run_info(run_dir).get("stop_requested") or stopper.poll() is not None,
                 timeout=120, interval=0.1, what="the supervisor to record the stop")
    finally:
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
    output, _ = stopper.communicate(timeout=timeout)
    return stopper.returncode, output


def kill_group(run_dir: Path) -> None:
    """Test cleanup: never leave a run behind."""
    from tuiapp.core.machine import shm

    try:
        info = run_info(run_dir)
    except (OSError, ValueError):
        return
    if info.get("pgid"):
        try:
            os.killpg(info["pgid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        else:  # until the killed processes are gone (a group of zombies only waits to be reaped)
            deadline = time.monotonic() + 5
            while group_pids(info["pgid"]) and time.monotonic() < deadline:
                time.sleep(0.02)
    shm.reclaim(info.get("master_port"))  # a SIGKILLed supervisor could not free its ranks' buffers


def kill_runs(runs_dir: Path) -> None:
    """Test cleanup: end every run of a runs folder."""
    for run_dir in runs_dir.iterdir():
        if run_dir.is_dir() and not run_dir.name.startswith("."):
            kill_group(run_dir)


def short_rl_preset(preset: str, max_steps: int) -> str:
    """recipes/PRESET.toml (tiny-grpo, tiny-rloo) on the bundled tiny model: max_steps of 16 completions,
    without its evaluations (tests that watch training steps or count reward calls)."""
    text = (ROOT / "recipes" / f"{preset}.toml").read_text()
    for old, new in (("max_steps = 40", f"max_steps = {max_steps}"), ('name = "run:tiny-rl-format"', 'name = "tiny"'),
                     ("micro_batch = 64", "micro_batch = 16"), ("eval_on_start = true", "eval_on_start = false"),
                     ("eval_steps = 40", "eval_steps = 0")):
        assert old in text, (preset, old)
        text = text.replace(old, new)
    return text


def run_preset(recipe: str, runs_dir: Path, name: str, *extra: str, timeout: float = 900) -> Path:
    """`llmtui run RECIPE [EXTRA...]` (`--set` overrides, say) to the end; the new run folder whose name
    holds `name`, asserted succeeded."""
    before = set(runs_dir.iterdir()) if runs_dir.exists() else set()
    result = llmtui("run", recipe, *extra, runs_dir=runs_dir, timeout=timeout)
    run = next(p for p in runs_dir.iterdir() if p not in before and p.is_dir() and name in p.name)
    log = (run / "stdout.log").read_text(errors="replace")[-3000:] if (run / "stdout.log").exists() else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:] + log
    assert run_info(run)["status"] == "succeeded"
    return run


def reward_fifths(run: Path, key: str) -> tuple[float, float]:
    """The mean of a train metric over the first fifth of the logged steps, and over the last fifth."""
    values = [r[key] for r in metrics(run) if r.get("split", "train") == "train" and key in r]
    fifth = len(values) // 5
    return sum(values[:fifth]) / fifth, sum(values[-fifth:]) / fifth


def held_out_evals(run: Path, key: str = "eval_rewards/answer/mean") -> list[tuple[int, float]]:
    """(step, reward on the held-out prompts) of the run's eval rows."""
    return [(r["step"], r[key]) for r in metrics(run) if r.get("split") == "eval"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post_json(url: str, body: dict, token: str | None = None, timeout: float = 120) -> tuple[int, dict]:
    """(HTTP status, JSON answer) of a POST to a served model; an error status is returned, not raised."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
