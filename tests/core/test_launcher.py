from pathlib import Path

import pytest

from tuiapp.core.errors import RunError
from tuiapp.core.launcher import deepspeed_argv, plan_ranks, supervisor_argv
from tuiapp.core.recipe import LaunchSpec


def test_deepspeed_argv_golden():
    argv = deepspeed_argv(Path("/r/run1"), 2, None, 29555, python="/py")
    assert argv == ["/py", "-m", "deepspeed.launcher.runner", "--master_port", "29555", "--num_gpus", "2",
                    "--enable_each_rank_log", "/r/run1/ranks", "--module", "tuiapp.trainer", "--run-dir", "/r/run1"]
    argv = deepspeed_argv(Path("/r/run1"), 2, [1, 3], 29555, resume=True, python="/py")
    assert argv[5:7] == ["--include", "localhost:1,3"] and argv[-1] == "--resume"


def test_supervisor_argv_golden():
    assert supervisor_argv(Path("/r/x"), python="/py") == ["/py", "-m", "tuiapp.core.supervisor", "/r/x"]


@pytest.mark.parametrize(
    "gpus, cuda, expected",
    [("all", 0, (1, None)), (2, 0, (2, None)), ([0, 1], 0, (2, None)), ("all", 4, (4, None)), ([1, 2], 4, (2, [1, 2]))],
)
def test_plan_ranks(gpus, cuda, expected):
    assert plan_ranks(LaunchSpec(gpus=gpus), cuda) == expected


def test_plan_ranks_rejects_missing_gpus():
    with pytest.raises(RunError) as info:
        plan_ranks(LaunchSpec(gpus=8), 2)
    assert info.value.key == "launch.gpus"
    with pytest.raises(RunError):
        plan_ranks(LaunchSpec(gpus=[5]), 2)


def test_master_port_of_a_recorded_command():
    from tuiapp.core.launcher import master_port_of

    assert master_port_of(["python", "-m", "deepspeed.launcher.runner", "--master_port", "29501"]) == "29501"
    assert master_port_of(["--master_port=7"]) == "7"
    assert master_port_of(None) is None and master_port_of(["--master_port"]) is None
