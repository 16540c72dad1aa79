"""completions.jsonl (online RL): a line as the trainer writes it -> a Generation; the file followed
by offset: new lines only, a partial line waits, broken lines are skipped, a resume's rewrite
starts again; metrics.recent_reward, the history's reward."""

from __future__ import annotations

import json

from tuiapp.core.run_folder.atomic import atomic_write_text
from tuiapp.core.run_folder.completions import COMPLETIONS_FILE, GenerationsTail, parse_generation, parse_line
from tuiapp.core.run_folder.metrics import JsonlWriter, recent_reward

ROW = {"step": 3, "prompt": "What is 2 + 3?", "completion": "5", "rewards": {"format": 1.0, "answer": None},
       "reward": 1.0, "advantage": 0.71, "tokens": 2, "clipped": False}


def test_a_trainer_row_parses_to_a_generation():
    generation = parse_generation({"time": 1.5, **ROW})
    assert generation.step == 3 and generation.prompt == "What is 2 + 3?" and generation.completion == "5"
    assert generation.rewards == {"format": 1.0, "answer": None} and generation.reward == 1.0
    assert generation.advantage == 0.71 and generation.tokens == 2 and not generation.clipped
    assert generation.split == "train" and generation.time == 1.5
    evaluated = parse_generation({**ROW, "split": "eval", "reward": "nan", "clipped": True})
    assert evaluated.split == "eval" and evaluated.reward is None and evaluated.clipped  # NaN is written as a string
    assert parse_generation({**ROW, "step": "3"}) is None and parse_generation([ROW]) is None
    assert parse_line("{broken") is None and parse_line("") is None and parse_line(json.dumps(ROW)).step == 3


def test_the_tail_reads_new_generations_and_starts_again_after_a_rewrite(tmp_path):
    tail = GenerationsTail(tmp_path)
    assert tail.read_new() == ([], False)  # no file yet
    path = tmp_path / COMPLETIONS_FILE
    with JsonlWriter(path) as writer:
        for step in (1, 2):
            writer.write({**ROW, "step": step})
    found, reset = tail.read_new()
    assert reset and [g.step for g in found] == [1, 2]
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("not json\n" + json.dumps({**ROW, "step": 3}) + "\n" + json.dumps({**ROW, "step": 4})[:20])
    found, reset = tail.read_new()
    assert not reset and [g.step for g in found] == [3]  # the broken line skipped, the partial one waits
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({**ROW, "step": 4})[20:] + "\n")
    assert [g.step for g in tail.read_new()[0]] == [4]
    atomic_write_text(path, json.dumps({**ROW, "step": 1}) + "\n")  # a resume drops the steps past its checkpoint
    found, reset = tail.read_new()
    assert reset and [g.step for g in found] == [1]


def test_the_first_read_of_a_long_file_takes_only_its_end(tmp_path):
    with JsonlWriter(tmp_path / COMPLETIONS_FILE) as writer:
        for step in range(1, 2001):
            writer.write({**ROW, "step": step})
    found, reset = GenerationsTail(tmp_path, initial_bytes=16 * 1024).read_new()
    assert reset and found[-1].step == 2000 and 50 < len(found) < 200
    assert [g.step for g in found] == list(range(found[0].step, 2001))  # no fragment of a cut line


def test_recent_reward_is_the_mean_of_the_last_tenth_of_rows():
    rows = [{"step": s, "reward": float(s)} for s in range(1, 31)]
    assert recent_reward(rows) == (28 + 29 + 30) / 3
    assert recent_reward(rows[:5]) == 5.0  # at least the last row
    assert recent_reward([{"step": 1, "loss": 2.0}]) is None  # not an RL run
    assert recent_reward([{"step": 1, "reward": "nan"}, {"step": 2, "reward": 0.5}]) == 0.5
