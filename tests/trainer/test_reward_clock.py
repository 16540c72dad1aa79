"""Rewards under a clock: a user's reward function that hangs, or returns NaN/None for every
completion, ends the run naming the function and its file:line, or is skipped (scored None) per its
on_error. The real wrapper the GRPO/RLOO trainers call, on a real file of the user's, real SIGALRM."""

from __future__ import annotations

import time

import pytest

from tuiapp.core.config.rewards import PythonReward
from tuiapp.trainer.methods.rl import RewardFunctionError, _python_reward

SOURCE = '''\
import math
import time


def hangs(completions, **kwargs):
    time.sleep(600)
    return [1.0] * len(completions)


def nan(completions, **kwargs):
    return [math.nan] * len(completions)


def none(completions, **kwargs):
    return None


def sometimes(completions, **kwargs):
    return [None, 1.0][: len(completions)]
'''


def reward(tmp_path, name, **settings):
    (tmp_path / "rewards.py").write_text(SOURCE)
    spec = PythonReward(function=f"{tmp_path / 'rewards.py'}:{name}", **settings)
    return _python_reward(spec, tmp_path, [])


def call(func, count=2):
    return func(prompts=["p"] * count, completions=["a"] * count, completion_ids=[[1]] * count)


def test_a_hanging_reward_fails_within_its_timeout_naming_function_and_lines(tmp_path):
    func = reward(tmp_path, "hangs", timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(RewardFunctionError) as error:
        call(func)
    assert time.monotonic() - start < 5
    message = str(error.value)
    path = tmp_path / "rewards.py"
    assert f"rewards.py:hangs ({path}:5) did not return within 0.5s" in message
    assert f"it was at {path}:6" in message and "on_error = 'skip'" in message


def test_a_hanging_reward_is_skipped_when_asked(tmp_path, capsys):
    func = reward(tmp_path, "hangs", timeout_s=0.3, on_error="skip")
    assert call(func, 3) == [None, None, None]
    assert "did not return within 0.3s" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["nan", "none"])
def test_nan_or_none_for_every_completion_fails_the_step(tmp_path, name):
    with pytest.raises(RewardFunctionError) as error:
        call(reward(tmp_path, name))
    assert f"rewards.py:{name} ({tmp_path / 'rewards.py'}:" in str(error.value) and "NaN/None" in str(error.value)


def test_bad_steps_counts_calls_in_a_row_and_skip_goes_on(tmp_path):
    func = reward(tmp_path, "nan", bad_steps=3)
    call(func)
    call(func)
    with pytest.raises(RewardFunctionError) as error:
        call(func)
    assert "3 steps in a row" in str(error.value)
    skipping = reward(tmp_path, "nan", on_error="skip")
    assert call(skipping) == [None, None]
    assert call(reward(tmp_path, "sometimes")) == [None, 1.0]  # one completion scored: not a bad step
