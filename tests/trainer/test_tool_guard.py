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
    guard = Guard(timeout_s=0.3, output_tokens=4, limit=3, run_dir=tmp_path)
    tools = [guard.wrap(f) for f in (divide, slow, junk)]
    assert tools[0](a=6, b=3) == "2.0" and tools[0].__doc__ == divide.__doc__
    assert tools[0](a=1, b=0).startswith("error: raised ZeroDivisionError")
    assert tools[1](seconds=2) == "error: did not return within 0.3s"
    assert tools[2](x=1).startswith("error: returned object")
    guard.check()  # three errors: at the limit, not past it
    assert tools[1](seconds=0.01) == "late" and guard.calls == 5
    errors = [json.loads(line) for line in (tmp_path / TOOL_ERRORS_FILE).read_text().splitlines()]
    assert [e["kind"] for e in errors] == ["raised", "timeout", "garbage"]
    assert errors[0]["at"].endswith("test_tool_guard.py:28")  # the line that raised
    assert tools[0](a=1, b=0).startswith("error:")
    with pytest.raises(ToolError) as failed:
        guard.check()
    assert "tool divide" in str(failed.value) and "test_tool_guard.py:28" in str(failed.value)
    assert "past method.tool_error_limit (3)" in str(failed.value)
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
    search = calculator.model_copy(update={"method": calculator.method.model_copy(update={
        "environment": calculator.method.environment.model_copy(update={"builtin": "kv_search",
                                                                        "file": "facts.json"})})})
    env = environments.trainer_kwargs(search, tmp_path, guard)["environment_factory"]()
    env.reset()
    assert env.search(key="capital of france") == "Paris"
    assert env.search(key="capital") == "not found; keys like it: capital of france, capital of peru"
    assert guard.errors == 1


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


def test_the_tiny_models_chatml_takes_trls_qwen_template_whose_tool_calls_trl_parses(tiny_model):
    """TRL's add_response_schema knows a template by its text: the tiny model's own ChatML is not one, so
    its tool calls would never be read; swapped for TRL's Qwen2.5 copy, a generated call parses."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    from tuiapp.trainer.methods.rl import tool_template

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    assert not supports_tool_calling(tokenizer)
    assert tool_template(tokenizer) and supports_tool_calling(tokenizer)
    assert not tool_template(tokenizer)  # another template is left alone
    tokenizer = add_response_schema(tokenizer)
    call = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call><|im_end|>'
    parsed = tokenizer.parse_response(tokenizer(call, add_special_tokens=False)["input_ids"], prefix="")
    assert parsed["tool_calls"][0]["function"] == {"name": "calculate", "arguments": {"expression": "2 + 3"}}
