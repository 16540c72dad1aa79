"""The online RL presets learn their task's (primary) reward on CPU (issue 46), end to end through `llmtui run`:
tiny-rl-format (SFT: one digit, then the end of the turn, right 1 time in 10) -> tiny-grpo and tiny-rloo on
demo:digits raise the answer reward >= 3x from the first fifth of the logged steps to the last, are not
flagged for reward hacking, and answer demo:digits-heldout (phrasings never trained on) better than their
base: in the run's own evaluations (train.eval_on_start: step 0 is the base), which `llmtui show` reports,
and in `llmtui eval`'s exact match; a recipe built to hack (a format reward that any digit string fills,
from the random tiny model) is flagged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.helpers import held_out_evals, llmtui, reward_fifths, run_info, run_preset

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

HACK = """name = "hack"
[model]
name = "tiny"
[dataset]
name = "demo:arith"
[method]
kind = "grpo"
num_generations = 8
max_completion_length = 12
beta = 0.0
loss_type = "dapo"
[[method.rewards]]
kind = "format"
pattern = '-?\\d+'
match = "coverage"
[[method.rewards]]
kind = "answer"
column = "answer"
weight = 0.0
[train]
max_steps = 16
micro_batch = 16
learning_rate = 1e-2
scheduler = "constant"
warmup_ratio = 0.0
save_steps = 0
[launch]
gpus = 1
"""


def _held_out(run: Path, runs_dir: Path) -> tuple[float, float]:
    """(base, tuned) exact match on demo:digits-heldout: the default data of a demo:digits run."""
    result = llmtui("eval", run.name, "--gen-limit", "100", "--json", runs_dir=runs_dir, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["data"] == "demo:digits-heldout", out
    return out["models"]["base"]["exact_match"], out["models"]["tuned"]["exact_match"]


def test_the_rl_presets_raise_their_primary_reward_and_beat_their_base_held_out(runs_dir, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # many small generate calls: one thread per rank is faster here
    sft = run_preset("recipes/tiny-rl-format.toml", runs_dir, "tiny-rl-format")
    figures = {}
    for preset in ("tiny-grpo", "tiny-rloo"):
        run = run_preset(f"recipes/{preset}.toml", runs_dir, preset)
        assert Path(run_info(run)["model"]) == sft / "final"
        first, last = reward_fifths(run, "rewards/answer/mean")
        evals = held_out_evals(run)
        assert [step for step, _ in evals] == [0, 40], evals  # before training (the base), after the last step
        base, tuned = (_held_out(run, runs_dir) if preset == "tiny-grpo" else
                       (evals[0][1], evals[-1][1]))  # llmtui eval's greedy exact match, or the run's own evals
        figures[preset] = (first, last, evals, base, tuned)
        assert last >= 3 * first and last >= 0.25, (preset, first, last)  # the task's reward, not the format's
        shown = llmtui("show", run.name, runs_dir=runs_dir)
        assert shown.returncode == 0 and "answer (primary)" in shown.stdout and "reward hacking" not in shown.stdout
        assert "best eval" not in shown.stdout  # TRL's eval loss of an RL run says nothing of the task
        assert f"held out  answer (primary) {evals[0][1]:.3f} (step 0, before training) -> " in shown.stdout
        assert evals[-1][1] > evals[0][1] and tuned > base, (preset, evals, base, tuned)
    print(figures)
    (runs_dir / "hack.toml").write_text(HACK)
    hack = run_preset(str(runs_dir / "hack.toml"), runs_dir, "hack")
    shown = llmtui("show", hack.name, runs_dir=runs_dir)
    assert "! reward hacking? format rose" in shown.stdout, shown.stdout


@pytest.mark.extended  # three runs, ~7 min on 2 cores: over the full tier's budget
def test_tiny_agent_learns_that_the_calculator_pays(runs_dir, monkeypatch):
    """tiny-agent-sft (the call and copying numbers, every transcript calling the calculator) -> tiny-agent-mix
    (1 transcript in 6 calls it, the others guess: the base calls it ~1 time in 6) -> tiny-agent (GRPO with the
    built-in calculator environment): the answer reward (primary) rises >= 3x from the first fifth of the steps
    to the last, because the model calls the tool more (TRL's tools/call_frequency); the held-out problems are
    answered better than by the base, in the run's own evaluations; not flagged for reward hacking; rollouts
    are logged as turns (call, tool, model)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the SFT steps: large enough batches for two threads
    sft = run_preset("recipes/tiny-agent-sft.toml", runs_dir, "tiny-agent-sft")
    mix = run_preset("recipes/tiny-agent-mix.toml", runs_dir, "tiny-agent-mix")
    assert Path(run_info(mix)["model"]) == sft / "final"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # many small generate calls
    run = run_preset("recipes/tiny-agent.toml", runs_dir, "tiny-agent")
    assert Path(run_info(run)["model"]) == mix / "final"
    first, last = reward_fifths(run, "rewards/answer/mean")
    calls = reward_fifths(run, "tools/call_frequency")
    evals = held_out_evals(run)
    print({"answer": (first, last), "calls": calls, "held out": evals})
    assert last >= 3 * first and last >= 0.3, (first, last)
    assert calls[1] > 2 * calls[0], calls  # it learned to use the tool
    assert [step for step, _ in evals] == [0, 40] and evals[1][1] >= 2 * evals[0][1], evals
    shown = llmtui("show", run.name, "--generations", "2", runs_dir=runs_dir)
    assert shown.returncode == 0 and "answer (primary)" in shown.stdout and "reward hacking" not in shown.stdout
    assert f"held out  answer (primary) {evals[0][1]:.3f} (step 0, before training) -> " in shown.stdout
    assert "call" in shown.stdout and "calculate" in shown.stdout, shown.stdout[-3000:]
