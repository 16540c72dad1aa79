"""Tools under a clock in training (tuiapp.trainer.methods.tool_guard): a tool that raises, hangs or returns
garbage gives the rollout an error turn and a line in tool_errors.jsonl, and past tool_error_limit the
run fails naming the tool and its file:line; results are cut to the token budget. The built-in
environments compute and look up offline. Real functions, a real run folder, TRL's own schema builder."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.trainer.methods import environments
from tuiapp.trainer.methods.tool_guard import TOOL_ERRORS_FILE, Guard, ToolError


def divide(a: float, b: float) -> float:
    """Divide a by b.

    Args:
        a: The dividend.
        b: The divisor.
    """
    return a / b


def slow(seconds: float) -> str:
    """Sleep, then answer.

    Args:
        seconds: How long.
    """
    time.sleep(seconds)
    return "late"


def junk(x: int) -> object:
    """Return something that is not text.

    Args:
        x: Anything.
    """
    return object()


def test_a_raising_hanging_or_garbage_tool_gives_an_error_turn_then_fails_the_run_past_the_limit(tmp_path):
    """Past `limit` failed calls in a row the run fails; a call that works starts the count again (a policy's odd
    bad expression is not a broken tool); arguments the tool does not take are the model's mistake, never counted."""
    guard = Guard(timeout_s=0.3, output_tokens=4, limit=3, run_dir=tmp_path)
    tools = [guard.wrap(f) for f in (divide, slow, junk)]
    assert tools[0](a=6, b=3) == "2.0" and tools[0].__doc__ == divide.__doc__
    assert tools[0](a=1, b=0).startswith("error: raised ZeroDivisionError")
    assert tools[1](seconds=2) == "error: did not return within 0.3s"
    assert tools[2](x=1).startswith("error: returned object")
    guard.check()  # three in a row: at the limit, not past it
    assert tools[0](a=1, c=2).startswith("error: bad arguments: ") and guard.in_a_row == 3  # the model's call
    guard.check()
    assert tools[1](seconds=0.01) == "late" and guard.calls == 6 and guard.in_a_row == 0  # a call that works
    for _ in range(3):
        assert tools[0](a=1, b=0).startswith("error:")
    guard.check()  # three in a row again, after one that worked
    errors = [json.loads(line) for line in (tmp_path / TOOL_ERRORS_FILE).read_text().splitlines()]
    assert [e["kind"] for e in errors] == ["raised", "timeout", "garbage", "bad call", "raised", "raised", "raised"]
    assert errors[0]["at"].endswith("test_tool_guard.py:28")  # the line that raised
    assert tools[0](a=1, b=0).startswith("error:")
    with pytest.raises(ToolError) as failed:
        guard.check()
    assert "tool divide" in str(failed.value) and "test_tool_guard.py:28" in str(failed.value)
    assert "4 tool calls in a row failed, past method.tool_error_limit (3)" in str(failed.value)
    assert guard.cut("x" * 100) == "x" * 16 + "…"  # 4 tokens ~ 16 characters without a tokenizer


HUNG_TOOL_THEN_EXIT = textwrap.dedent("""
    import time
    from tuiapp.trainer.methods.tool_guard import Guard

    def hang() -> str:
        \"\"\"Never return.\"\"\"
        time.sleep(3600)

    print(Guard(timeout_s=0.3, output_tokens=8, limit=1).wrap(hang)(), flush=True)
""")


def test_a_tool_that_hangs_forever_does_not_keep_the_process_alive_after_its_timeout():
    # a rank that returns from main (no os._exit) must not wait on the hung call's thread at exit
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", HUNG_TOOL_THEN_EXIT], capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "error: did not return within 0.3s"
    assert time.monotonic() - started < 10


def test_the_built_in_environments_compute_and_look_up_offline_through_the_guard(tmp_path):
    (tmp_path / "facts.json").write_text('{"Capital of France": "Paris", "capital of Peru": "Lima"}')
    guard = Guard(timeout_s=5, output_tokens=64, limit=10, run_dir=tmp_path)
    calculator = recipe_from_dict({"name": "c", "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
                                   "method": {"kind": "grpo", "environment": {"builtin": "calculator"}}})
    env = environments.trainer_kwargs(calculator, tmp_path, guard)["environment_factory"]()
    env.reset(answer="84")
    assert env.calculate(expression="12 * (3 + 4)") == "84" and env.calculate(expression="7 / 2") == "3.5"
    assert env.calculate(expression="__import__('os')").startswith("error: raised ValueError: not arithmetic")
    assert env.calculate(expr="1 + 1") == "error: bad arguments: missing a required argument: 'expression'"
    assert guard.in_a_row == 1  # the model's bad call is not the tool's failure
    search = calculator.model_copy(update={"method": calculator.method.model_copy(update={
        "environment": calculator.method.environment.model_copy(update={"builtin": "kv_search",
                                                                        "file": "facts.json"})})})
    env = environments.trainer_kwargs(search, tmp_path, guard)["environment_factory"]()
    env.reset()
    assert env.search(key="capital of france") == "Paris"
    assert env.search(key="capital") == "not found; keys like it: capital of france, capital of peru"
    assert guard.errors == 2


@pytest.mark.slow
def test_trl_builds_the_guarded_tools_schema_and_masks_tool_results_out_of_the_loss():
    """The pinned TRL: the schema of a guarded tool (and environment method) is the tool's own, and the
    loss mask is completion_mask * tool_mask (tool results 0)."""
    import inspect

    from transformers.utils import get_json_schema
    from trl import GRPOTrainer

    guard = Guard(timeout_s=1, output_tokens=8, limit=1)
    assert get_json_schema(guard.wrap(divide)) == get_json_schema(divide)
    env = guard.wrap_class(environments.CalculatorEnv)()
    schema = get_json_schema(env.calculate)
    assert schema["function"]["name"] == "calculate" and "expression" in schema["function"]["parameters"]["required"]
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "loss_mask = completion_mask if tool_mask is None else completion_mask * tool_mask" in source


def test_the_tiny_models_chatml_writes_tool_calls_that_trl_parses_as_its_datasets_write_them(tiny_model):
    """The tiny model's ChatML renders a tool-calling conversation (TRL checks it before a tool run) and is
    prefix-preserving (TRL would swap it otherwise); a call from TRL's loop (tool_calls) is the same text as a
    dataset's `tool_call` turn, so an SFT step teaches what GRPO generates; TRL knows a template by its text, so
    tool_template gives it the Qwen response parser, and a generated call parses back."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import is_chat_template_prefix_preserving, supports_tool_calling

    from tuiapp.trainer.methods.rl import tool_template

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)
    call = {"name": "calculate", "arguments": {"expression": "2 + 3"}}
    user = {"role": "user", "content": "What is 2 + 3?"}
    from_loop = tokenizer.apply_chat_template(
        [user, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
         {"role": "tool", "name": "calculate", "content": "5"}], tokenize=False)
    from_data = tokenizer.apply_chat_template(
        [user, {"role": "tool_call", "content": json.dumps(call)}, {"role": "tool", "content": "5"}], tokenize=False)
    assert from_loop == from_data and '<tool_call>\n{"name": "calculate", "arguments": ' in from_loop
    assert tool_template(tokenizer) and tokenizer.response_template is not None
    other = AutoTokenizer.from_pretrained(tiny_model)
    other.chat_template = other.chat_template.replace("# Tools", "Tools")
    assert not tool_template(other)  # another template is left alone
    generated = json.dumps(call).join(["<tool_call>\n", "\n</tool_call><|im_end|>"])
    parsed = tokenizer.parse_response(tokenizer(generated, add_special_tokens=False)["input_ids"], prefix="")
    assert parsed["tool_calls"][0]["function"] == call


def test_demo_calc_tools_shows_the_calculator_as_trl_does_and_its_transcripts_as_trl_writes_them(tiny_model):
    """demo:calc-tools (data for an SFT step before tool-using RL) holds the calculator's schema as transformers makes it
    from the environment's method, and its tool transcripts render as TRL's tool loop writes a rollout, so the
    SFT step teaches the RL step's prompts and calls token for token."""
    from transformers import AutoTokenizer
    from transformers.utils import get_json_schema

    from tuiapp.core.config.tools import CALCULATOR_SCHEMA
    from tuiapp.core.data.demo_data import demo_records

    assert get_json_schema(environments.CalculatorEnv().calculate) == CALCULATOR_SCHEMA
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    record = demo_records("demo:calc-tools")[0]
    user, call, result, answer = record["messages"]
    rollout = [user, {"role": "assistant", "content": "",
                      "tool_calls": [{"type": "function", "function": json.loads(call["content"])}]},
               {"role": "tool", "name": "calculate", "content": result["content"]}, answer]
    env = environments.CalculatorEnv()
    assert env.calculate(json.loads(call["content"])["arguments"]["expression"]) == result["content"] == answer["content"]
    assert (tokenizer.apply_chat_template(record["messages"], tools=json.loads(record["tools"]), tokenize=False)
            == tokenizer.apply_chat_template(rollout, tools=[env.calculate], tokenize=False))


# the bundled tiny model (Llama, whose generation config stops at <|im_end|> as a chat model's does) and zoo models of
# other families: the bundled tokenizer and template, each family's own config, whose generation stops only at EOS
# (like a base model given dataset.template "chatml", or Qwen2.5's base model with its own ChatML template).
# ~0.5-1.4 s each once TRL is imported: the bundled model's stays in the quick suite, the zoo's are slow
ROLLOUT_FAMILIES = ["tiny", *(pytest.param(f, marks=pytest.mark.slow) for f in ("qwen2", "mistral", "gemma2", "phi3"))]


@pytest.mark.parametrize("family", ROLLOUT_FAMILIES)
def test_a_tool_rollout_is_the_token_stream_the_sft_transcript_is(family, tiny_model, tmp_path):
    """TRL builds a tool rollout by concatenation: prompt ids + the generated call (cut at the first stop token) +
    the tool's turn + the answer. With the tiny model's stop token <|im_end|> beside its EOS <|endoftext|>, TRL's own
    cut dropped the '\\n' after <|im_end|>, so every rollout differed from the SFT transcripts the call was taught
    with, and the tuned model answered nonsense after the tool; where the model's generation config does not stop at
    <|im_end|> at all, the call ran on past its turn. Here TRL's own loop (parse, call the tool, its turn, generate
    again) runs on scripted generations that go on past <|im_end|>, and the rollout is the transcript token for token."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from tuiapp.core.data.demo_data import demo_records
    from tuiapp.trainer.methods import rl
    from tuiapp.trainer.models.zoo import ensure_zoo_model

    path = tiny_model if family == "tiny" else ensure_zoo_model(family)
    tokenizer = AutoTokenizer.from_pretrained(path)
    rl.tool_template(tokenizer)
    env = environments.CalculatorEnv()
    record = demo_records("demo:calc-tools")[0]
    user, call, result, answer = record["messages"]
    model = AutoModelForCausalLM.from_pretrained(path)
    config = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                        max_completion_length=256, report_to=[], use_cpu=True)
    trainer = rl.trainer_class("grpo")(
        model=model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)], args=config,
        train_dataset=Dataset.from_list([{"prompt": [user]}] * 2), processing_class=tokenizer,
        tools=[env.calculate])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in trainer.eos_token_ids and im_end != tokenizer.eos_token_id

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    turns = iter([f"<tool_call>\n{call['content']}\n</tool_call><|im_end|>", answer["content"] + "<|im_end|>"])

    def generate(input_ids, **_):  # the policy's turn, then what a model goes on with unless generation stops
        turn = ids(next(turns) + "\n<|im_start|>user\nagain")
        return torch.cat([input_ids, torch.tensor([turn] * len(input_ids))], dim=1)

    model.generate = generate
    out = trainer._generate_and_score_completions([{"prompt": [user]}] * 2)
    prompt = out["prompt_ids"][0][out["prompt_mask"][0].bool()].tolist()
    completion = out["completion_ids"][0][out["completion_mask"][0].bool()].tolist()
    transcript = tokenizer.apply_chat_template(record["messages"], tools=json.loads(record["tools"]), tokenize=False)
    assert tokenizer.decode(prompt + completion) == transcript.removesuffix("\n")
    assert prompt + completion == ids(transcript.removesuffix("\n"))
    tool_turn = ids(f"\n<|im_start|>tool\n{result['content']}<|im_end|>\n<|im_start|>assistant\n")
    masked = [t for t, m in zip(completion, out["tool_mask"][0].tolist(), strict=False) if not m]
    assert masked == tool_turn  # the tool's turn, whole, is out of the loss
