import json
import operator
import subprocess
import sys

import pytest

from tuiapp.core.common.errors import DatasetError
from tuiapp.core.data import demo_data
from tuiapp.core.data.demo_data import DEMO_DATASETS, demo_records, facts_eval_pairs


def _question(record: dict) -> str:
    return f"{record['instruction']}\n{record['input']}" if record["input"] else record["instruction"]


def test_every_demo_is_deterministic():
    for name in DEMO_DATASETS:
        assert demo_records(name) == demo_records(name)


def test_facts_are_short_alpaca_records():
    records = demo_records("demo:facts")
    assert 1300 <= len(records) <= 1700
    assert all(set(r) == {"instruction", "input", "output"} for r in records)
    assert max(len(r["output"]) for r in records) < 60
    # every fact is asked several ways
    outputs = [r["output"] for r in records]
    assert min(outputs.count(o) for o in set(outputs)) >= 4


def test_eval_pairs_use_held_out_phrasings_of_trained_facts():
    records = demo_records("demo:facts")
    trained_questions = {_question(r) for r in records}
    trained_answers = {r["output"] for r in records}
    pairs = facts_eval_pairs()
    assert len(pairs) >= 100
    assert ("Which city is the capital of France?", "The capital of France is Paris.") in pairs
    for question, answer in pairs:
        assert question not in trained_questions
        assert answer in trained_answers


def test_chat_is_multi_turn_messages():
    records = demo_records("demo:chat")
    assert len(records) == 800
    with_system = 0
    for record in records:
        roles = [m["role"] for m in record["messages"]]
        if roles[0] == "system":
            with_system += 1
            roles = roles[1:]
        assert roles in (["user", "assistant"] * 2, ["user", "assistant"] * 3)
        assert all(m["content"] for m in record["messages"])
    assert 0 < with_system < len(records)


def test_text_is_paragraphs_of_fact_sentences():
    records = demo_records("demo:text")
    assert len(records) == 2000
    assert all(set(r) == {"text"} and r["text"].count(".") >= 3 for r in records)
    assert any("Paris is the capital of France." in r["text"] for r in records)


def test_unknown_demo_suggests_a_name():
    with pytest.raises(DatasetError) as info:
        demo_records("demo:fact")
    assert "demo:facts" in str(info.value)


def test_core_data_modules_import_no_heavy_libraries():
    code = (
        "import sys, tuiapp.core.data.datasets, tuiapp.core.data.demo_data\n"
        "heavy = {'torch', 'transformers', 'datasets', 'deepspeed', 'textual', 'pyarrow'}\n"
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_version_is_a_string_for_cache_keys():
    assert isinstance(demo_data.DEMO_VERSION, str) and demo_data.DEMO_VERSION


def test_arith_prefs_prefer_the_bare_answer():
    problems = {r["prompt"]: r["answer"] for r in demo_records("demo:arith")}
    pairs = demo_records("demo:arith-prefs")
    assert len(pairs) == 600 and all(set(p) == {"prompt", "chosen", "rejected"} for p in pairs)
    assert all(problems[p["prompt"]] == p["chosen"] != p["rejected"] for p in pairs)
    assert any(p["rejected"].lstrip("-").isdigit() for p in pairs) and any(" " in p["rejected"] for p in pairs)


def test_digits_ask_whether_a_digit_is_odd_and_hold_out_two_phrasings():
    records = demo_records("demo:digits")
    assert len(records) == 1000 and all(set(r) == {"prompt", "answer", "guess"} for r in records)
    for r in records:
        digit = int(next(ch for ch in r["prompt"] if ch.isdigit()))
        assert r["answer"] == str(digit % 2) and r["guess"] in "0123456789"
    assert 0.4 < sum(r["answer"] == "1" for r in records) / 1000 < 0.6
    assert 0.05 < sum(r["guess"] == r["answer"] for r in records) / 1000 < 0.15  # the format step's targets: chance
    held = demo_records("demo:digits-heldout")
    assert len(held) == 200 and all(r["output"] in ("0", "1") and not r["input"] for r in held)
    trained = {demo_data.DIGIT_PHRASINGS.index(p) for p in demo_data.DIGIT_PHRASINGS
               if any(p.split("{d}")[0] == r["prompt"][:len(p.split("{d}")[0])] and p.split("{d}")[1] in r["prompt"]
                      for r in records)}
    assert trained == set(range(len(demo_data.DIGIT_PHRASINGS) - 2))
    assert not {r["instruction"] for r in held} & {r["prompt"] for r in records}


def _solved(prompt: str) -> str:
    """The answer of 'What is A OP B?', worked out here (not by the calculator the data comes from)."""
    a, op, b = prompt.removeprefix("What is ").removesuffix("?").split()
    return str({"+": operator.add, "-": operator.sub, "*": operator.mul}[op](int(a), int(b)))


def test_calc_problems_are_right_and_the_held_out_ones_never_trained_on():
    problems = demo_records("demo:calc")
    held = demo_records("demo:calc-heldout")
    transcripts = demo_records("demo:calc-tools")
    assert len(problems) == 1000 and len(held) == 200 and len(transcripts) == 16000
    for row in problems + held:
        a, _, b = row["prompt"].removeprefix("What is ").removesuffix("?").split()
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert row["answer"] == _solved(row["prompt"])
    trained = {r["prompt"] for r in problems} | {t["messages"][0]["content"] for t in transcripts}
    assert not trained & {r["prompt"] for r in held}
    user, call, result, answer = transcripts[0]["messages"]
    assert [t["role"] for t in (user, call, result, answer)] == ["user", "tool_call", "tool", "assistant"]
    assert json.loads(call["content"])["arguments"]["expression"] == user["content"][len("What is "):-1]
    assert result["content"] == answer["content"]


def test_calc_guesses_answer_at_once_and_are_almost_never_right():
    """demo:calc-guess: the problems answered without the calculator, by another problem's answer (tiny-agent-mix
    mixes them with demo:calc-tools, so its base seldom calls the tool)."""
    guesses = demo_records("demo:calc-guess")
    held = {r["prompt"] for r in demo_records("demo:calc-heldout")}
    assert len(guesses) == 4000 and all(json.loads(g["tools"])[0]["function"]["name"] == "calculate" for g in guesses)
    right = 0
    for record in guesses:
        user, answer = record["messages"]
        assert (user["role"], answer["role"]) == ("user", "assistant") and user["content"] not in held
        right += answer["content"] == _solved(user["content"])
        int(answer["content"])  # a number, as the calculator writes it
    assert right / len(guesses) < 0.01
