"""Online RL (grpo, rloo) before launch: reward tables, built-in scorers, rules, prompt data and a
user's reward function checked in a subprocess."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tuiapp.core.common.errors import RecipeError, RecipeErrors, UserError
from tuiapp.core.config.recipe import DatasetSpec, load_recipe, parse_recipe
from tuiapp.core.config.rewards import (
    AnswerReward,
    FormatReward,
    LengthReward,
    ToolCallReward,
    answers_match,
    final_answer,
    score_answer,
    score_format,
    score_json,
    score_length,
    score_tool_call,
)
from tuiapp.core.machine.gpus import cuda_available
from tuiapp.core.prelaunch import door, rl
from tuiapp.core.store.runs import RunStore

ROOT = Path(__file__).resolve().parents[2]

BASE = """
name = "rl"
[dataset]
name = "demo:arith"
[method]
kind = "{kind}"
{method}
[[method.rewards]]
kind = "format"
pattern = '-?\\d+'
match = "coverage"
{rewards}
[train]
max_seq_len = 128
{train}
[launch]
gpus = 1
"""


def recipe(kind="grpo", method="", rewards="", train=""):
    method = method if "num_generation" in method else "num_generations = 4\n" + method
    train = train if "micro_batch" in train else "micro_batch = 8\n" + train
    method = method if "max_completion_length" in method else "max_completion_length = 16\n" + method
    return parse_recipe(BASE.format(kind=kind, method=method, rewards=rewards, train=train), "rl.toml")


def keys(findings, level="error"):
    return {f.key for f in findings if f.level == level}


# ---------------------------------------------------------------- schema


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_both_methods_parse_with_their_defaults_and_an_adapter(kind):
    r = recipe(kind, method="max_completion_length = 32", rewards="[method.adapter]\nkind = 'lora'\nrank = 4")
    assert r.method.kind == kind and r.method.adapter.rank == 4 and r.method.num_generations == 4
    assert parse_recipe(r.to_toml(), "again.toml") == r  # round trip through the frozen TOML
    assert r.method.beta == (0.0 if kind == "grpo" else 0.05)  # TRL's defaults


@pytest.mark.parametrize("text, key, fix", [
    ("num_generations = 1", "method.num_generations", None),
    ("temperature = 0", "method.temperature", None),
    ("top_p = 1.5", "method.top_p", None),
    ("beta = -1", "method.beta", None),
    ("epsilon = 0", "method.epsilon", None),
    ("loss_type = 'ppo'", "method.loss_type", "use 'grpo', 'dr_grpo', 'dapo'"),
    ("scale_rewards = 'yes'", "method.scale_rewards", "use 'group', 'batch' or 'none'"),
    ("generation_backend = 'sglang'", "method.generation_backend", None),
    ("max_completion_length = 0", "method.max_completion_length", None),
    ("num_iterations = 0", "method.num_iterations", None),
    ("vllm_gpu_memory_utilization = 1.5", "method.vllm_gpu_memory_utilization", None),
    ("num_generation = 4", "method.num_generation", "did you mean 'num_generations'?"),
])
def test_each_method_key_is_validated(text, key, fix):
    with pytest.raises(RecipeError) as info:
        recipe(method=text)
    assert info.value.key == key and info.value.file == "rl.toml"
    if fix:
        assert fix in info.value.fix


def test_rloo_refuses_grpo_only_keys():
    with pytest.raises(RecipeError) as info:
        recipe("rloo", method="loss_type = 'dapo'")
    assert info.value.key == "method.loss_type" and "unknown key" in info.value.message


@pytest.mark.parametrize("rewards, key, words", [
    ("[[method.rewards]]\nkind = 'answer'\ncolum = 'answer'", "method.rewards.1.colum", "did you mean 'column'?"),
    ("[[method.rewards]]\nkind = 'format'\npattern = '('", "method.rewards.1.pattern", "not a valid regex"),
    ("[[method.rewards]]\nkind = 'format'", "method.rewards.1", "set one of pattern"),
    ("[[method.rewards]]\nkind = 'format'\ntags = ['<b>']", "method.rewards.1.tags", "not a tag name"),
    ("[[method.rewards]]\nkind = 'python'\nfunction = 'rewards.py'", "method.rewards.1.function", "FILE.py:NAME"),
    ("[[method.rewards]]\nkind = 'length'\ntarget = 0", "method.rewards.1.target", None),
    ("[[method.rewards]]\nkind = 'model'", "method.rewards.1.model", None),
    ("[[method.rewards]]\nkind = 'format'\npattern = 'x'", "method.rewards", "two rewards are labelled 'format'"),
    ("[[method.rewards]]\nkind = 'answer'\nweight = 1000", "method.rewards.1.weight", None),
])
def test_each_reward_key_is_validated(rewards, key, words):
    with pytest.raises((RecipeError, RecipeErrors)) as info:
        recipe(rewards=rewards)
    errors = info.value.errors if isinstance(info.value, RecipeErrors) else [info.value]
    assert any(e.key == key and (words is None or words in f"{e.message} {e.fix}") for e in errors), \
        [(e.key, e.message, e.fix) for e in errors]


def test_unknown_reward_kind_and_no_rewards_are_errors():
    with pytest.raises(RecipeError) as info:
        recipe(rewards="[[method.rewards]]\nkind = 'lenght'")
    assert info.value.key == "method.rewards.1.kind" and "unknown reward kind 'lenght'" in info.value.message
    assert info.value.fix == "did you mean 'length'?"
    bare = parse_recipe('[method]\nkind = "grpo"\n', "rl.toml")  # parses, like every method kind
    error = next(f for f in rl.rules(bare, ranks=1, cuda=False) if f.key == "method.rewards")
    assert "has none" in error.message and "[[method.rewards]]" in error.fix


# ---------------------------------------------------------------- built-in scorers


def test_format_modes():
    number = FormatReward(pattern=r"-?\d+", match="full")
    assert score_format(number, " 42\n") == 1.0 and score_format(number, "42 apples") == 0.0
    assert score_format(FormatReward(pattern=r"\d+", match="search"), "it is 42") == 1.0
    cover = FormatReward(pattern=r"\d+", match="coverage")
    assert score_format(cover, "ab12") == 0.5 and score_format(cover, "") == 0.0 and score_format(cover, "12") == 1
    tags = FormatReward(tags=["think", "answer"])
    assert score_format(tags, "<think>7+5</think>\n<answer>12</answer>") == 1.0
    assert score_format(tags, "<think>7+5</think> 12") == 0.25  # 2 of 4 tags, half credit
    assert score_format(tags, "12") == 0.0


@pytest.mark.parametrize("text, expected", [
    ("The answer is 12.", "12"), ("so \\boxed{3/4}", "3/4"), ("#### 1,000", "1,000"),
    ("<answer>7</answer> maybe 8", "7"), ("7 then 8 then 9", "9"), ("no number", "no number"),
])
def test_final_answer(text, expected):
    assert final_answer(text) == expected


def test_answers_compare_numbers_as_numbers():
    assert answers_match("1,000", "1000.0") and answers_match("3/4", "0.75") and answers_match("$5", "5")
    assert not answers_match("12", "13") and answers_match("Paris.", "paris") and not answers_match("", "")
    spec = AnswerReward(column="answer")
    assert score_answer(spec, "The answer is 45", {"answer": "45"}) == 1.0
    assert score_answer(spec, "44", {"answer": "45"}) == 0.0
    assert score_answer(spec, "45", {}) is None  # not applicable: left out of the total


def test_answers_compare_as_mathematics_with_math_verify():
    spec = AnswerReward(column="answer")
    assert score_answer(spec, r"so \boxed{\frac{1}{2}}", {"answer": "0.5"}) == 1.0  # nested braces: a fraction
    assert score_answer(spec, r"The answer is $\boxed{x+1}$", {"answer": "1+x"}) == 1.0
    assert score_answer(spec, r"\boxed{\sqrt{4}}", {"answer": "2"}) == 1.0
    assert score_answer(spec, r"\boxed{\{1, 2\}}", {"answer": r"\{2, 1\}"}) == 1.0
    assert score_answer(spec, r"\boxed{\frac{1}{3}}", {"answer": "0.5"}) == 0.0
    assert score_answer(spec, r"\boxed{x-1}", {"answer": "1+x"}) == 0.0
    assert score_answer(AnswerReward(column="answer", math=False), r"\boxed{x+1}", {"answer": "1+x"}) == 0.0


def test_length_modes():
    assert score_length(LengthReward(target=10), 10) == 1.0 and score_length(LengthReward(target=10), 15) == 0.5
    assert score_length(LengthReward(target=10, mode="at_most"), 8) == 0.0
    assert score_length(LengthReward(target=10, mode="at_most"), 20) == -1.0
    assert score_length(LengthReward(target=10, mode="at_least"), 5) == -0.5


def test_json_and_tool_call():
    assert score_json('```json\n{"a": 1}\n```') == 1.0 and score_json("{a: 1}") == 0.0
    tools = '[{"type": "function", "function": {"name": "add", "parameters": {"required": ["a", "b"]}}}]'
    spec = ToolCallReward()
    good = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    assert score_tool_call(spec, good, {"tools": tools}) == 1.0
    assert score_tool_call(spec, good.replace(', "b": 2', ""), {"tools": tools}) == 0.5
    assert score_tool_call(spec, good.replace("add", "mul"), {"tools": tools}) == 0.25
    assert score_tool_call(spec, "<tool_call>{oops</tool_call>", {"tools": tools}) == 0.0
    assert score_tool_call(ToolCallReward(tools=["add"]), good, {}) == 1.0


# ---------------------------------------------------------------- rules


def test_group_divisibility_names_the_key_and_a_fix():
    found = rl.rules(recipe(train="micro_batch = 6"), ranks=1, cuda=False)
    error = next(f for f in found if f.key == "train.micro_batch")
    assert "multiple of method.num_generations (4)" in error.message and "micro_batch = 8" in error.fix
    assert not keys(rl.rules(recipe(train="micro_batch = 2"), ranks=2, cuda=False))  # 2 x 2 ranks = 4
    assert not keys(rl.rules(recipe(train="micro_batch = 2\ngrad_accum = 2"), ranks=1, cuda=False))
    evals = rl.rules(recipe(train="micro_batch = 2\ngrad_accum = 2\neval_steps = 5"), ranks=1, cuda=False)
    assert "train.micro_batch" in keys(evals)  # evals take micro_batch x ranks without accumulation


def test_rules_before_launch():
    assert "train.micro_batch" in keys(rl.rules(recipe(train="micro_batch = 'auto'"), ranks=1, cuda=False))
    too_long = recipe(method="max_completion_length = 200")
    assert "method.max_completion_length" in keys(rl.rules(too_long, ranks=1, cuda=False))
    assert "method.epsilon_high" in keys(rl.rules(recipe(method="epsilon_high = 0.1"), ranks=1, cuda=False),
                                         "warning")
    assert "train.packing" in keys(rl.rules(recipe(train="packing = true"), ranks=1, cuda=False), "warning")
    piped = recipe().model_copy(deep=True)
    piped.launch.strategy = "pipeline"
    assert "launch.strategy" in keys(rl.rules(piped, ranks=1, cuda=False))


def test_vllm_is_refused_on_cpu_with_the_fix_and_needs_its_package_on_cuda():
    vllm = recipe(method="generation_backend = 'vllm'")
    error = next(f for f in rl.rules(vllm, ranks=1, cuda=False) if f.key == "method.generation_backend")
    assert "CUDA" in error.message and "generation_backend = 'transformers'" in error.fix
    missing = rl.rules(vllm, ranks=1, cuda=True, vllm_installed=False)
    assert "pip install vllm" in next(f.fix for f in missing if f.key == "method.generation_backend")
    assert "method.generation_backend" not in keys(rl.rules(vllm, ranks=1, cuda=True, vllm_installed=True))


def test_json_schema_file_is_checked(tmp_path):
    r = recipe(rewards=f"[[method.rewards]]\nkind = 'json'\njson_schema = '{tmp_path / 'none.json'}'")
    assert "method.rewards.1.json_schema" in keys(rl.rules(r, ranks=1, cuda=False))


# ---------------------------------------------------------------- data


def test_prompt_records_from_each_layout():
    spec = DatasetSpec(name="x")
    text = rl.prompt_record({"prompt": "2+2?", "answer": "4"}, {}, "x")
    assert text == {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"}
    chat = rl.prompt_record({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                                          {"role": "assistant", "content": "a"}], "answer": "a"}, {}, "x")
    assert [t["role"] for t in chat["prompt"]] == ["system", "user"] and chat["answer"] == "a"
    alpaca = rl.prompt_record({"instruction": "Add", "input": "2 and 2", "output": "4"}, {}, "x")
    assert alpaca["prompt"][0]["content"] == "Add\n2 and 2" and alpaca["output"] == "4"
    mapped = rl.prompt_record({"q": "hi", "gold": 1}, {"prompt": "q"}, "x")
    assert mapped == {"prompt": [{"role": "user", "content": "hi"}], "gold": 1}
    with pytest.raises(UserError) as info:
        rl.prompt_record({"text": "no prompt"}, spec.columns, "data.jsonl record 0")
    assert info.value.key == "dataset.columns" and "prompt = 'question'" in info.value.fix


def test_demo_arith_has_prompts_and_answers():
    records = rl.prompt_records(DatasetSpec(name="demo:arith"))
    assert len(records) == 1000 and all(r["answer"].lstrip("-").isdigit() for r in records)
    assert records[0]["prompt"][0]["role"] == "user" and "number only" in records[0]["prompt"][0]["content"]


def test_an_answer_column_the_data_lacks_is_an_error(tmp_path):
    r = recipe(rewards="[[method.rewards]]\nkind = 'answer'\ncolumn = 'solution'")
    found = door.recipe_findings(r, RunStore(tmp_path), base_dir=ROOT)
    error = next(f for f in found if f.key == "method.rewards.1.column")
    assert "'solution'" in error.message and "answer" in error.message


def test_sft_data_without_prompts_is_refused(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "plain"}\n')
    r = recipe().model_copy(deep=True)
    r.dataset.name = str(data)
    found = door.recipe_findings(r, RunStore(tmp_path), base_dir=ROOT)
    assert "dataset.columns" in keys(found)


def test_a_reward_model_from_a_run_that_does_not_exist_names_its_key(tmp_path):
    r = recipe(rewards="[[method.rewards]]\nkind = 'model'\nmodel = 'run:no-such-rm'")
    with pytest.raises(UserError) as info:
        door.resolve_recipe(r, RunStore(tmp_path))
    assert info.value.key == "method.rewards.1.model" and "no-such-rm" in info.value.message


# ---------------------------------------------------------------- a user's reward function


def python_findings(tmp_path, source: str, function: str = "my_reward"):
    (tmp_path / "rewards.py").write_text(source)
    records = rl.prompt_records(DatasetSpec(name="demo:arith"))[:4]
    return rl.check_python_reward(f"rewards.py:{function}", records, tmp_path, "method.rewards.0.function")


def test_a_good_reward_function_passes(tmp_path):
    source = "def my_reward(prompts, completions, answer, **kwargs):\n    return [float(c == a) for c, a in " \
             "zip(completions, answer)]\n"
    assert python_findings(tmp_path, source) == []


def test_the_function_is_never_imported_here(tmp_path):
    source = "import sys\nsys.modules['llmtui_marker'] = 1\ndef my_reward(completions, **kw):\n    return [0.0] * " \
             "len(completions)\n"
    assert python_findings(tmp_path, source) == [] and "llmtui_marker" not in sys.modules


@pytest.mark.parametrize("source, function, words", [
    ("def my_reward(completions, **kw)\n    return []\n", "my_reward", ["rewards.py:1", "SyntaxError"]),
    ("def my_rewards(completions, **kw):\n    return []\n", "my_reward", ["no function 'my_reward'"]),
    ("def my_reward(completions, **kw):\n    x = 1\n    return [1 / 0 for c in completions]\n", "my_reward",
     ["rewards.py:3", "ZeroDivisionError"]),
    ("def my_reward(completions, **kw):\n    return 1.0\n", "my_reward", ["returned 1.0", "4 completions"]),
    ("def my_reward(completions, **kw):\n    return ['good'] * 4\n", "my_reward", ["returned ['good'"]),
    ("raise ImportError('needs numpy 9')\n", "my_reward", ["rewards.py:1", "ImportError"]),
])
def test_a_broken_reward_function_names_file_and_line(tmp_path, source, function, words):
    found = python_findings(tmp_path, source, function)
    assert len(found) == 1 and found[0].level == "error" and found[0].key == "method.rewards.0.function"
    text = f"{found[0].message} {found[0].fix}"
    assert all(w in text for w in words), text


def test_a_missing_reward_file_is_an_error(tmp_path):
    found = rl.check_python_reward("nope.py:f", [], tmp_path, "method.rewards.0.function")
    assert "not found" in found[0].message


def test_validate_runs_the_check(tmp_path):
    (tmp_path / "rewards.py").write_text("def my_reward(completions, **kw):\n    return [None] * len(completions)\n")
    r = recipe(rewards="[[method.rewards]]\nkind = 'python'\nfunction = 'rewards.py:my_reward'")
    assert not door.has_errors(door.recipe_findings(r, RunStore(tmp_path / "runs"), base_dir=tmp_path))
    (tmp_path / "rewards.py").write_text("def my_reward(completions, **kw):\n    return {}[1]\n")
    found = door.recipe_findings(r, RunStore(tmp_path / "runs"), base_dir=tmp_path)
    assert "method.rewards.1.function" in keys(found)


def test_show_summarises_rewards_first_to_last():
    rows = [{"step": 1, "loss": 0.0}, {"step": 2, "reward": 0.1, "rewards/format/mean": 0.1,
                                        "rewards/answer/mean": 0.0, "completions/mean_length": 12.0},
            {"step": 3, "reward": 0.9, "rewards/format/mean": 0.8, "rewards/answer/mean": 0.1, "kl": 0.01,
             "completions/mean_length": 6.5, "completions/clipped_ratio": 0.25}]
    assert rl.reward_summary(rows) == ("reward 0.100 -> 0.900 · format 0.100 -> 0.800 · answer 0.000 -> 0.100 · "
                                       "length 6.5 (25% clipped) · kl 0.0100")
    assert rl.reward_summary([{"step": 1, "loss": 2.0}]) is None  # not an online RL run


def test_the_gpu_grpo_preset_generates_with_vllm():
    r = load_recipe(ROOT / "recipes" / "gpu-qwen-0.5b-grpo-lora.toml")
    assert r.method.generation_backend == "vllm" and r.method.adapter.kind == "lora"
    assert "method.generation_backend" in keys(rl.rules(r, ranks=1, cuda=False))  # refused on CPU, with the fix
    assert not keys(rl.rules(r, ranks=1, cuda=True, vllm_installed=True))


@pytest.mark.skipif(not cuda_available(), reason="needs a CUDA GPU")
def test_the_gpu_grpo_preset_passes_its_rules_on_this_gpu():
    pytest.importorskip("vllm")
    assert not keys(rl.rules(load_recipe(ROOT / "recipes" / "gpu-qwen-0.5b-grpo-lora.toml")))


def test_the_estimate_counts_a_frozen_start_only_for_a_kl_penalty_on_every_weight():
    from tuiapp.core.plan.estimate import TINY_CONFIG, estimate_recipe

    def reference(method, adapter=""):
        r = recipe(method=method, rewards=adapter)
        return estimate_recipe(r, dict(TINY_CONFIG), 1, 1, cuda=False).memory.reference

    assert reference("beta = 0.0") == 0 and reference("beta = 0.04") > 0
    assert reference("beta = 0.04", "[method.adapter]\nkind = 'lora'") == 0  # the base, adapter off


def test_a_reward_model_must_be_a_reward_runs_model(tmp_path):
    sft = tmp_path / "sft-final"
    sft.mkdir()
    (sft / "config.json").write_text("{}")
    (sft / "llmtui.json").write_text('{"method": "sft"}')
    empty = tmp_path / "empty"
    empty.mkdir()
    for model, words in ((str(sft), "final model of a sft run"), (str(empty), "no config.json"),
                         ("no/such/folder", "not found")):
        r = recipe(rewards=f"[[method.rewards]]\nkind = 'model'\nmodel = '{model}'")
        found = door.recipe_findings(r, RunStore(tmp_path / "runs"), base_dir=tmp_path)
        assert any(f.key == "method.rewards.1.model" and words in f.message for f in found), found
    (sft / "llmtui.json").write_text('{"method": "reward"}')
    r = recipe(rewards=f"[[method.rewards]]\nkind = 'model'\nmodel = '{sft}'")
    assert "method.rewards.1.model" not in keys(door.recipe_findings(r, RunStore(tmp_path / "runs"),
                                                                         base_dir=tmp_path))
