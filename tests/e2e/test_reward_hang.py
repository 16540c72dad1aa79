"""A user's reward function that hangs during GRPO training (it passed the pre-launch check) ends the
run within its timeout, naming the function, its file:line and the line it hung on: real launcher,
real TRL trainer on a CPU rank."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import kill_group, llmtui, only_run, run_info, short_rl_preset

pytestmark = pytest.mark.slow


HANGS_AT_STEP_2 = '''\
import time

CALLS = []


def stuck(completions, **kwargs):
    CALLS.append(1)
    if len(CALLS) == 2:
        time.sleep(3600)
    return [0.0] * len(completions)
'''


def test_a_reward_that_hangs_in_training_fails_the_run_within_its_timeout(runs_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "rewards.py").write_text(HANGS_AT_STEP_2)
    recipe = short_rl_preset("tiny-grpo", 3)
    recipe += f'\n[[method.rewards]]\nkind = "python"\nfunction = "{tmp_path / "rewards.py"}:stuck"\ntimeout_s = 3\n'
    path = tmp_path / "grpo.toml"
    path.write_text(recipe)
    result = llmtui("run", str(path), runs_dir=runs_dir, timeout=400)
    run = only_run(runs_dir)
    kill_group(run)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    reason = run_info(run).get("reason") or ""
    where = tmp_path / "rewards.py"
    assert f"rewards.py:stuck ({where}:6) did not return within 3s at step 2" in reason, reason
    assert f"it was at {where}:9" in reason, reason
