"""`llmtui doctor`'s verdict on which rank holds the others up (core.lifecycle.doctor.behind_rank)."""

import subprocess
import sys

from tuiapp.core.lifecycle.doctor import RankState, behind_rank


def _rank(rank: int, phase: str, since: float, state: str = "running") -> RankState:
    return RankState(rank, 1000 + rank, "host", phase, since, state)


def test_a_single_rank_or_ranks_in_one_phase_hold_nobody_up():
    # one rank training was reported as "behind: rank 0 — it is still in 'training' after 14s"
    assert behind_rank([_rank(0, "training", 1.0)]) is None
    assert behind_rank([_rank(0, "training", 1.0), _rank(1, "training", 2.0)]) is None
    assert behind_rank([]) is None


def test_the_rank_earliest_in_start_up_or_stopped_is_behind():
    late = _rank(1, "loading model", 5.0)
    assert behind_rank([_rank(0, "first step", 1.0), late]) is late
    stopped = _rank(1, "training", 5.0, state="stopped")
    assert behind_rank([_rank(0, "training", 1.0), stopped]) is stopped


def test_doctor_of_an_ended_run_says_it_ended_not_that_it_runs_elsewhere(runs):
    # a succeeded run was told to "run it on the machine that runs them"
    done = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(runs), "doctor",
                           "20260101-000218-sft-f004"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "has ended (succeeded)" in done.stderr and "llmtui show 20260101-000218-sft-f004" in done.stderr
    assert "machine that runs them" not in done.stderr and "Traceback" not in done.stderr
