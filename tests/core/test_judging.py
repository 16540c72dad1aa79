"""LLM-as-judge without a model: verdicts read (or counted invalid), win rates with Wilson
intervals, bootstrap intervals of ratings, prompt sets and the summary lines."""

import pytest

from tuiapp.core.after import judging
from tuiapp.core.common.errors import UserError


@pytest.mark.parametrize("reply, verdict", [
    ("[[A]]", "A"), ("My verdict: [[B]].", "B"), ("[[C]]", "tie"), ("[[tie]]", "tie"), ("B", "B"), (" a. ", "A"),
    ("Verdict: tie", "tie"), ("[[A]] or maybe [[B]]", None), ("Assistant A is better", None), ("", None),
    ("the capital of France is Paris", None),
])
def test_pairwise_verdicts(reply, verdict):
    assert judging.parse_pairwise(reply) == verdict


@pytest.mark.parametrize("reply, rating", [
    ("Rating: [[7]]", 7.0), ("[[10]]", 10.0), ("8", 8.0), ("Rating: 6/10", 6.0), ("[[11]]", None),
    ("[[3]] then [[4]]", None), ("good", None),
])
def test_ratings(reply, rating):
    assert judging.parse_rating(reply) == rating


def test_win_rates_and_intervals():
    summary = judging.pairwise_summary(["win", "win", "loss", "tie", None])
    assert (summary["n"], summary["valid"], summary["invalid"]) == (5, 4, 1)
    assert summary["win_rate"] == 0.5 and summary["score"] == 0.625
    low, high = summary["win_rate_ci95"]
    assert 0.15 < low < 0.5 < high < 0.85  # Wilson, n = 4
    assert judging.wilson(0, 0) is None and judging.wilson(10, 10)[1] == pytest.approx(1.0)
    none = judging.pairwise_summary([None, None])
    assert none["win_rate"] is None and none["invalid"] == 2
    rated = judging.single_summary([7.0, 8.0, None, 9.0])
    assert rated["mean"] == 8.0 and rated["invalid"] == 1
    assert 7.0 <= rated["mean_ci95"][0] <= 8.0 <= rated["mean_ci95"][1] <= 9.0
    assert judging.bootstrap_mean([7.0, 8.0, 9.0]) == judging.bootstrap_mean([7.0, 8.0, 9.0])


def test_prompt_sets(tmp_path):
    demo = judging.read_prompts(judging.DEMO_PROMPTS, 5)
    assert len(demo) == 5 and all(item["reference"] for item in demo)
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert judging.read_prompts("p.txt", 0, tmp_path) == [{"prompt": "one"}, {"prompt": "two"}]
    (tmp_path / "p.jsonl").write_text('{"question": "q", "answer": "a"}\n{"nothing": 1}\n')
    with pytest.raises(UserError) as found:
        judging.read_prompts("p.jsonl", 0, tmp_path)
    assert found.value.line == 2
    with pytest.raises(UserError, match="prompt file not found"):
        judging.read_prompts("gone.txt", 0, tmp_path)


def test_summary_lines_report_invalid_verdicts():
    result = {"mode": "pairwise", "against": "base", "judge": "j",
              "summary": judging.pairwise_summary(["win", None, "loss", "win"])}
    text = "\n".join(judging.summary_lines(result))
    assert "win rate 66.7% (95% CI" in text and "2 won, 1 lost, 0 tied of 4" in text
    assert "1 of 4 verdicts could not be read" in text


def test_an_endpoint_that_is_not_there_is_refused():
    from tuiapp.core.store.runs import RunStore

    with pytest.raises(UserError, match="lists no model"):
        judging.resolve_judge("http://127.0.0.1:9/v1", RunStore("/nonexistent-runs"))
