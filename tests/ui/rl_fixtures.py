"""SYNTHETIC online RL runs (grpo/rloo) for the UI tests: a run folder whose metrics.jsonl rows carry
TRL's reward keys and whose completions.jsonl holds every generation, both in the exact format the
trainer writes (tuiapp/trainer/methods/rl.py's _write_completions; tests/e2e/test_rl.py checks it on a real
run). A real tiny GRPO run takes minutes, so the fast tier writes these files."""

from __future__ import annotations

from pathlib import Path

from ui_fixtures import synthetic_run

from tuiapp.core.run_folder.completions import completions_path
from tuiapp.core.run_folder.metrics import JsonlWriter, read_jsonl
from tuiapp.core.store.runs import Run

PROMPTS = ("What is 2 + 3? Reply with the number only.", "What is 7 - 4? Reply with the number only.")
ANSWERS = ("5", "3")


def generation_row(step: int, prompt: int, index: int, split: str = "train") -> dict:
    """One completions.jsonl line as _write_completions builds it: index 0 of each prompt answers right."""
    right = index == 0
    completion = ANSWERS[prompt] if right else f"the answer might be {step + index} or so\nor not"
    scores = {"format": 1.0 if right else 0.25, "answer": 1.0 if right else 0.0}
    row = {"step": step, "prompt": PROMPTS[prompt], "completion": completion, "rewards": scores,
           "reward": sum(scores.values()), "advantage": 1.5 if right else -0.5, "tokens": 1 if right else 12,
           "clipped": not right}
    if split == "eval":
        row["split"] = "eval"
    return row


def write_generations(run_dir: Path, steps: range, per_prompt: int = 4) -> None:
    with JsonlWriter(completions_path(run_dir)) as writer:
        for step in steps:
            for prompt in range(len(PROMPTS)):
                for index in range(per_prompt):
                    writer.write(generation_row(step, prompt, index))


def rl_run(root: Path, name: str, *, method: str = "grpo", steps: int = 5, status: str = "succeeded",
           index: int = 0, rewards: list[float] | None = None) -> Run:
    """A grpo/rloo run of `steps` logged steps: train rows with TRL's reward metrics (reward i is
    rewards[i], else 0.2 * step), and per_prompt generations of two prompts a step."""
    run = synthetic_run(root, name, method=method, status=status, steps=steps, eval_every=0, samples=False,
                        index=index)
    rows = read_jsonl(run.metrics_path)
    run.metrics_path.unlink()
    with JsonlWriter(run.metrics_path) as writer:
        for row in rows:
            step = row["step"]
            reward = rewards[step - 1] if rewards else round(0.2 * step, 3)
            writer.write({**row, "reward": reward, "reward_std": 0.4, "rewards/format/mean": reward / 2,
                          "rewards/format/std": 0.3, "rewards/answer/mean": reward / 2, "rewards/answer/std": 0.3,
                          "completions/mean_length": 6.5, "completions/clipped_ratio": 0.25, "entropy": 1.1})
    write_generations(run.path, range(1, steps + 1))
    return run
