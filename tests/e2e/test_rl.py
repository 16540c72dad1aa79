"""Online RL end to end (issue 27) through `llmtui run`, the real launcher and TRL's GRPO/RLOO trainers on a
CPU rank: tiny-grpo's curve goes on after a stop and resume (tests/e2e/test_rl_learns.py: the presets learn); RLOO with a LoRA adapter is driven by a user's
reward function and a reward model from a `reward` run, and the function's exception at step 3 fails the
run naming its file and line; a broken reward file is refused before anything launches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.helpers import (
    kill_group,
    llmtui,
    metrics,
    only_run,
    run_info,
    short_rl_preset,
    steps_reached,
    wait_for,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def one_thread(monkeypatch):
    """One intra-op thread per rank: a 1M-parameter model on a shared 2-core machine runs its many small
    generate/forward calls several times faster than with two contending threads."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def said(result, run_dir: Path | None = None) -> str:
    log = (run_dir / "stdout.log").read_text(errors="replace")[-4000:] if run_dir and (run_dir / "stdout.log").exists() \
        else ""
    return result.stdout[-3000:] + result.stderr[-3000:] + log


MECHANICS = ("--set", "model.name=tiny", "--set", "train.max_steps=16", "--set", "train.micro_batch=16",
             "--set", "train.save_steps=8")  # the preset on the bundled model: no tiny-rl-format run needed


def test_tiny_grpo_across_a_stop_and_resume(runs_dir, one_thread):
    llmtui("run", "recipes/tiny-grpo.toml", *MECHANICS, "--detach", runs_dir=runs_dir, check=True)
    run = only_run(runs_dir)
    try:
        wait_for(lambda: steps_reached(run, 4), timeout=600, what="4 steps")
        stopped = llmtui("stop", run.name, runs_dir=runs_dir, timeout=300)
        assert stopped.returncode == 0 and run_info(run)["status"] == "stopped", stopped.stdout + stopped.stderr
        # the stop's checkpoint; on a loaded machine the step-8 save may come before the stop lands
        step = max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("checkpoint-*"))
        assert 4 <= step < 16
        result = llmtui("resume", run.name, runs_dir=runs_dir, timeout=900)
        assert result.returncode == 0, said(result, run)
    finally:
        kill_group(run)
    assert run_info(run)["status"] == "succeeded"
    rows = [r for r in metrics(run) if r.get("split", "train") == "train"]
    assert [r["step"] for r in rows] == list(range(1, 17))
    for key in ("rewards/format/mean", "rewards/format/std", "rewards/answer/mean", "reward", "completions/mean_length",
                "completions/clipped_ratio", "entropy", "tokens"):
        assert key in rows[-1], key
    evals = [r["step"] for r in metrics(run) if r.get("split") == "eval"]
    assert evals == [0, 16], evals  # train.eval_on_start: the base's, once (not again on resume), and the last
    done = [d for d in lines(run / "completions.jsonl") if d.get("split") != "eval"]
    assert len(done) == 16 * 16 and {d["step"] for d in done} == set(range(1, 17))  # none twice after the resume
    assert set(done[0]["rewards"]) == {"format", "answer"} and " odd" in done[0]["prompt"]
    assert all(d["tokens"] <= 4 and isinstance(d["completion"], str) for d in done)
    fmt = [r["rewards/format/mean"] for r in rows]
    assert sum(d["rewards"]["format"] for d in done[-16:]) / 16 == pytest.approx(fmt[-1], abs=1e-6)
    event = next(e for e in lines(run / "events.jsonl") if e.get("event") == "generation")
    assert event["backend"] == "transformers" and event["num_generations"] == 8
    shown = llmtui("show", run.name, runs_dir=runs_dir)
    assert shown.returncode == 0 and "rewards   reward " in shown.stdout and "format " in shown.stdout, shown.stdout
    assert (run / "final" / "llmtui.json").is_file()


REWARDS_PY = '''\
CALLS = []


def my_reward(prompts, completions, answer, **kwargs):
    CALLS.append(1)
    if len(CALLS) == 3:
        return [1 / 0 for _ in completions]
    return [float(any(ch.isdigit() for ch in c)) for c in completions]
'''


def test_rloo_lora_with_a_user_function_and_a_reward_run_then_a_failure_at_step_3(runs_dir, tmp_path, one_thread):
    rm = llmtui("run", "recipes/tiny-reward.toml", "--set", "train.max_steps=2", "--set", "train.eval_steps=0",
                "--set", "train.save_steps=0", "--set", "dataset.eval_split=0.0", runs_dir=runs_dir, timeout=600)
    assert rm.returncode == 0, rm.stdout[-3000:] + rm.stderr[-2000:]
    reward_file = tmp_path / "rewards.py"
    reward_file.write_text(REWARDS_PY)
    recipe = short_rl_preset("tiny-rloo", 5)
    recipe += f"""
[[method.rewards]]
kind = "python"
function = "{reward_file}:my_reward"
name = "mine"

[[method.rewards]]
kind = "model"
model = "run:tiny-reward"
weight = 0.5
"""
    path = tmp_path / "rloo.toml"
    path.write_text(recipe)  # [[method.rewards]] headers are absolute: these join the preset's two
    result = llmtui("run", str(path), runs_dir=runs_dir, timeout=600)
    run = next(p for p in runs_dir.iterdir() if p.is_dir() and "tiny-rloo" in p.name)
    assert result.returncode == 1, said(result, run)
    info = run_info(run)
    assert info["status"] == "failed"
    reason = info.get("reason") or ""
    assert f"{reward_file}:7" in reason and "ZeroDivisionError" in reason and "step 3" in reason, reason
    frozen = (run / "recipe.toml").read_text()
    assert "run:tiny-reward" not in frozen and "/final" in frozen  # the reward model frozen as its folder
    done = lines(run / "completions.jsonl")
    assert {d["step"] for d in done} == {1, 2}  # steps 1 and 2 were scored by all three rewards
    assert set(done[0]["rewards"]) == {"format", "answer", "mine", "model"}
    assert all(isinstance(d["rewards"]["model"], float) for d in done)
    rows = [r for r in metrics(run) if r.get("split", "train") == "train"]
    assert {"rewards/mine/mean", "rewards/model/mean"} <= set(rows[0])


ENV_PY = """\
class Counter:
    def reset(self, **row):
        self.answer = row["answer"]

    def add(self, a: int, b: int) -> str:
        \"\"\"Add two numbers.

        Args:
            a: the first number
            b: the second number
        \"\"\"
        return str(a + b)

    def get_reward(self) -> float:
        return 0.25  # the environment's own score of its rollout: fixed, so the test can find it
"""


def test_an_environment_that_scores_its_rollouts_is_logged_under_its_class_beside_the_recipes_rewards(
        runs_dir, tmp_path, one_thread):
    """TRL adds a user environment's get_reward after the recipe's rewards: its column keeps the class's name
    in the metrics and completions.jsonl, and the recipe's rewards keep theirs."""
    (tmp_path / "env.py").write_text(ENV_PY)
    recipe = short_rl_preset("tiny-grpo", 2)
    recipe += f"""
[method.environment]
class = "{tmp_path / 'env.py'}:Counter"
"""
    recipe = recipe.replace("max_completion_length = 4", "max_completion_length = 16")
    path = tmp_path / "grpo-env.toml"
    path.write_text(recipe)
    result = llmtui("run", str(path), runs_dir=runs_dir, timeout=600)
    run = only_run(runs_dir)
    assert result.returncode == 0, said(result, run)
    done = lines(run / "completions.jsonl")
    assert done and all(set(d["rewards"]) == {"answer", "format", "Counter"} for d in done), done[:2]
    assert all(d["rewards"]["Counter"] == 0.25 for d in done)
    rows = [r for r in metrics(run) if r.get("split", "train") == "train"]
    assert rows and all(r["rewards/Counter/mean"] == 0.25 and "rewards/answer/mean" in r for r in rows), rows


@pytest.mark.parametrize("source, words", [
    ("def my_reward(completions, **kw)\n    return [0.0] * len(completions)\n", ["rewards.py:1", "SyntaxError"]),
    ("def other(completions, **kw):\n    return []\n", ["no function 'my_reward'", "other"]),
])
def test_a_broken_reward_file_exits_2_before_launch(runs_dir, tmp_path, source, words):
    (tmp_path / "rewards.py").write_text(source)
    recipe = (ROOT / "recipes" / "tiny-grpo.toml").read_text().replace('name = "run:tiny-rl-format"', 'name = "tiny"')
    recipe = recipe.replace("[[method.rewards]]             # shaping", f"""[[method.rewards]]
kind = "python"
function = "{tmp_path / 'rewards.py'}:my_reward"

[[method.rewards]]             # shaping""")
    path = tmp_path / "broken.toml"
    path.write_text(recipe)
    result = llmtui("run", str(path), runs_dir=runs_dir, timeout=120)
    assert result.returncode == 2, said(result)
    out = result.stdout + result.stderr
    assert "method.rewards.1.function" in out and all(w in out for w in words), out
    assert not [p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
