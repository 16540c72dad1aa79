"""`llmtui doctor`'s verdict on which rank holds the others up (core.doctor.behind_rank)."""

from tuiapp.core.doctor import RankState, behind_rank


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
