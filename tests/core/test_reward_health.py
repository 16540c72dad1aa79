"""The run's headline reward is the task's (primary) reward, and a shaping reward that saturates while
the primary stays flat is flagged as reward hacking in `llmtui show` and the run view, with the samples
that show it. Real run folders (RunStore), their metrics and completions written by the trainer's
writers (JsonlWriter) in the trainer's row format: the format reward of a hacking run goes
0.02 -> 1.0 on `666666666666` while the answer reward stays 0 (issue 46's measured tiny-grpo run)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tuiapp.cli.main import main
from tuiapp.core.common.errors import UserError
from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.run_folder import reward_health
from tuiapp.core.run_folder.completions import completions_path
from tuiapp.core.run_folder.metrics import JsonlWriter
from tuiapp.core.store.runs import RunStore
from tuiapp.ui.primary_reward import primary_reward_key
from tuiapp.ui.screens.run_view import reward_hacking_lines

REWARDS = [{"kind": "format", "pattern": r"-?\d+", "match": "coverage"}, {"kind": "answer", "column": "answer"}]
RECIPE = {"name": "hack", "model": {"name": "tiny"}, "dataset": {"name": "demo:arith"},
          "method": {"kind": "grpo", "rewards": REWARDS}}
STEPS = 16


def online_run(tmp_path, fmt, answer, completion="666666666666", recipe=RECIPE):
    """A finished grpo run: STEPS train rows with TRL's reward keys, 8 generations a step."""
    run = RunStore(tmp_path).create(recipe_from_dict(recipe))
    now = time.time()
    run.update(status="succeeded", started=now - 120, ended=now)
    with JsonlWriter(run.metrics_path) as rows, JsonlWriter(completions_path(run.path)) as gens:
        for step in range(1, STEPS + 1):
            f, a = fmt(step), answer(step)
            rows.write({"step": step, "max_steps": STEPS, "loss": 0.01, "grad_norm": 0.3, "time": now - 100 + step,
                        "reward": f + a, "reward_std": 0.2, "rewards/format/mean": f, "rewards/format/std": 0.1,
                        "rewards/answer/mean": a, "rewards/answer/std": 0.1, "completions/mean_length": 12.0})
            for i in range(8):
                right = a >= 0.5 and i % 2 == 0
                gens.write({"step": step, "prompt": "What is 2 + 3?", "completion": "5" if right else completion,
                            "rewards": {"format": 1.0 if step > 4 else f, "answer": 1.0 if right else 0.0},
                            "reward": 1.0, "advantage": 0.0, "tokens": 12, "clipped": True})
    return run


def hacking(step):
    return min(1.0, 0.02 + step * 0.12)  # 0.02 -> 1.0: the digit coverage is learnt


def test_a_format_reward_saturating_while_the_answer_stays_flat_is_flagged_with_its_samples(tmp_path, capsys):
    run = online_run(tmp_path, hacking, lambda step: 0.0)
    assert main(["--runs-dir", str(tmp_path), "show", run.id]) == 0
    out = capsys.readouterr().out
    assert "primary   answer (primary) 0.000 -> 0.000 · total 0.140 -> 1.000 · format 0.140 -> 1.000" in out
    assert "! reward hacking? format rose" in out and "while answer (primary) stayed 0.00 -> 0.00" in out
    assert out.count("step 16: '666666666666' format 1.00 · answer 0.00") == 1  # the samples, each once
    lines = reward_hacking_lines(run.path, RECIPE)  # what the run view's header adds
    assert lines[0].startswith("reward hacking? format rose") and "666666666666" in lines[1]


def test_a_run_whose_primary_rises_is_not_flagged(tmp_path, capsys):
    run = online_run(tmp_path, hacking, lambda step: min(0.9, 0.05 * step))
    assert main(["--runs-dir", str(tmp_path), "show", run.id]) == 0
    out = capsys.readouterr().out
    assert "primary   answer (primary) 0.050 -> 0.800" in out and "hacking" not in out
    assert reward_hacking_lines(run.path, RECIPE) == []


def test_a_flat_run_without_a_saturated_shaping_reward_or_too_few_rows_is_not_flagged():
    rows = [{"step": s, "rewards/format/mean": 0.3, "rewards/answer/mean": 0.0} for s in range(1, 17)]
    assert reward_health.reward_hacking(rows, RECIPE) == []  # learns nothing: not hacking
    rows = [{"step": s, "rewards/format/mean": hacking(s * 4), "rewards/answer/mean": 0.0} for s in range(1, 5)]
    assert reward_health.reward_hacking(rows, RECIPE) == []  # four rows: no fifths yet
    saturated_from_start = [{"step": s, "rewards/format/mean": 1.0, "rewards/answer/mean": 0.0} for s in range(1, 17)]
    assert reward_health.reward_hacking(saturated_from_start, RECIPE) == []  # nothing was learnt towards it


def test_primary_true_picks_the_headline_and_two_primaries_are_refused():
    marked = [{**REWARDS[0], "primary": True}, REWARDS[1]]
    recipe = recipe_from_dict({**RECIPE, "method": {"kind": "grpo", "rewards": marked}})
    assert recipe.method.rewards[0].primary and not recipe.method.rewards[1].primary
    dumped = recipe.model_dump()
    assert primary_reward_key(dumped) == "rewards/format/mean" == reward_health.primary_reward_key(dumped)
    assert primary_reward_key(RECIPE) == "rewards/answer/mean"  # default: the answer reward
    assert primary_reward_key({"method": {"kind": "grpo", "rewards": [REWARDS[0]]}}) == "reward"  # else the total
    both = [{**REWARDS[0], "primary": True}, {**REWARDS[1], "primary": True}]
    with pytest.raises(UserError) as caught:
        recipe_from_dict({**RECIPE, "method": {"kind": "grpo", "rewards": both}})
    assert "2 rewards are marked primary (format, answer)" in str(caught.value)


def test_the_rows_of_a_real_tiny_grpo_run_that_hacked_its_format_reward_are_flagged(tmp_path, capsys):
    """tests/fixtures/tiny_grpo_hacking.json: the reward rows and completions a real 16-step run of the
    landed tiny-grpo.toml wrote on CPU (format 0.008 -> 1.0 on '666666666666', answer 0.0 throughout)."""
    real = json.loads((Path(__file__).parents[1] / "fixtures" / "tiny_grpo_hacking.json").read_text())
    run = RunStore(tmp_path).create(recipe_from_dict(RECIPE))
    run.update(status="succeeded", started=time.time() - 600, ended=time.time())
    with JsonlWriter(run.metrics_path) as rows, JsonlWriter(completions_path(run.path)) as gens:
        for row in real["metrics"]:
            rows.write(row)
        for generation in real["completions"]:
            gens.write(generation)
    assert main(["--runs-dir", str(tmp_path), "show", run.id]) == 0
    out = capsys.readouterr().out
    assert "! reward hacking? format rose 0.00 -> 1.00 while answer (primary) stayed" in out
    assert "step 16: '666666666666' format 1.00 · answer 0.00" in out
    healthy = [{**row, "rewards/answer/mean": row["rewards/format/mean"] * 0.6} for row in real["metrics"]]
    assert reward_health.reward_hacking(healthy, RECIPE) == []  # the same run had the answer followed


def test_the_held_out_line_reads_the_primary_on_the_eval_rows_from_the_base_on(tmp_path, capsys):
    """train.eval_on_start: the eval row of step 0 is the base's, the last the trained model's; grpo's
    eval rows carry TRL's eval_rewards/NAME/mean (written by the trainer's recorder)."""
    run = online_run(tmp_path, lambda step: 0.5, lambda step: min(0.9, 0.05 * step))
    with JsonlWriter(run.metrics_path) as rows:
        for step, answer in ((0, 0.1), (8, 0.3), (16, 0.45)):
            rows.write({"split": "eval", "step": step, "eval_loss": 0.0, "eval_reward": answer + 0.1,
                        "eval_rewards/answer/mean": answer, "eval_rewards/format/mean": 0.5})
    assert main(["--runs-dir", str(tmp_path), "show", run.id]) == 0
    out = capsys.readouterr().out
    assert "held out  answer (primary) 0.100 (step 0, before training) -> 0.450 (step 16)" in out
    assert "primary   answer (primary) 0.050 -> 0.800" in out  # the train rows' line is the train rows'
    rows = [{"split": "eval", "step": 4, "eval_reward": 0.2}]  # no primary reward: the total
    assert reward_health.held_out_summary(rows, {"method": {"rewards": [REWARDS[0]]}}) == "total 0.200 (step 4)"
    assert reward_health.held_out_summary([], RECIPE) is None
