"""Agentic GRPO on the bundled tiny model with a user's tool that misbehaves (issue 46), end to end through
`llmtui run` on a CPU rank: an SFT run teaches the tiny model one tool call (a `tool_call` turn in its data);
GRPO of that model with the tool (the tiny model's template writes Qwen-style calls, which TRL parses) runs
its rollouts through the tool, which raises, hangs past tool_timeout_s and returns garbage in turn (its dry call before launch works): each call ends its rollout with an error turn, shown in
completions.jsonl, and a line in tool_errors.jsonl, and past tool_error_limit the run fails naming the tool
and its file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.helpers import kill_group, llmtui, run_info

pytestmark = pytest.mark.slow

CALL = json.dumps({"name": "flaky", "arguments": {"x": 1}})

TOOLS_PY = '''\
import time

CALLS = []


def flaky(x: int) -> str:
    """Echo a number; in training it raises, hangs and returns garbage in turn.

    Args:
        x: any number
    """
    CALLS.append(x)
    if x == 2:  # the dry call before launch (sample arguments): it works
        return str(x)
    turn = len(CALLS) % 3
    if turn == 1:
        raise ValueError("flaky is broken")
    if turn == 2:
        time.sleep(30)
    return object()
'''

SFT = """name = "agent-sft"
[model]
name = "tiny"
[dataset]
name = "{data}"
format = "messages"
[method]
kind = "sft"
[train]
packing = false                # packed, each example would copy the one before it instead of learning the call
max_steps = 150
micro_batch = 4
learning_rate = 1e-2
scheduler = "cosine"
warmup_ratio = 0.05
max_seq_len = 256
save_steps = 0
[launch]
gpus = 1
"""

GRPO = """name = "agent-grpo"
[model]
name = "run:agent-sft"
[dataset]
name = "{data}"
[method]
kind = "grpo"
num_generations = 4
max_completion_length = 96    # the call (~40 tokens) and the tool's turn after it
temperature = 0.1              # near greedy: the SFT model writes the call right, sampling at 1 garbles it
beta = 0.0
max_turns = 1
tool_timeout_s = 1
tool_error_limit = 10            # step 1 (8 rollouts, each calling once) stays under it
[[method.tools]]
function = "{tools}:flaky"
[[method.rewards]]
kind = "answer"
column = "answer"
[train]
max_steps = 8
micro_batch = 8
learning_rate = 1e-4
max_seq_len = 256
save_steps = 0
[launch]
gpus = 1
"""


def tool_schemas(tools_py: Path) -> str:
    """The `tools` column of the SFT data: the tool's schema as TRL shows it to the model (from its docstring),
    so the SFT run's prompts are the GRPO run's, token for token."""
    from transformers.utils import get_json_schema

    from tuiapp.trainer.methods.environments import import_user_file

    return json.dumps([get_json_schema(import_user_file(tools_py, "agent_tools_for_test_").flaky)])


def test_a_tool_that_raises_hangs_and_returns_garbage_fails_the_agent_run_past_its_limit(runs_dir, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    (tmp_path / "tools.py").write_text(TOOLS_PY)
    tools = tool_schemas(tmp_path / "tools.py")
    calls = tmp_path / "calls.jsonl"
    calls.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Call the tool with {i}."},
                                                      {"role": "tool_call", "content": CALL}],
                                         "tools": tools}) + "\n"
                             for i in range(64)))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Call the tool with {i}.", "answer": "1"}) + "\n"
                               for i in range(64)))
    (tmp_path / "sft.toml").write_text(SFT.format(data=calls))
    (tmp_path / "grpo.toml").write_text(GRPO.format(data=prompts, tools=tmp_path / "tools.py"))
    sft = llmtui("run", str(tmp_path / "sft.toml"), runs_dir=runs_dir, timeout=600)
    assert sft.returncode == 0, sft.stdout[-3000:] + sft.stderr[-3000:]
    result = llmtui("run", str(tmp_path / "grpo.toml"), runs_dir=runs_dir, timeout=600)
    run = next(p for p in runs_dir.iterdir() if p.is_dir() and "agent-grpo" in p.name)
    kill_group(run)
    log = (run / "stdout.log").read_text(errors="replace")[-3000:] if (run / "stdout.log").exists() else ""
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:] + log
    info = run_info(run)
    reason = info.get("reason") or ""
    assert info["status"] == "failed" and "tool flaky" in reason and f"{tmp_path / 'tools.py'}:" in reason, reason
    assert "method.tool_error_limit (10)" in reason, reason
    errors = [json.loads(line) for line in (run / "tool_errors.jsonl").read_text().splitlines()]
    assert len(errors) >= 11 and {e["tool"] for e in errors} == {"flaky"}
    assert {e["kind"] for e in errors} >= {"raised", "timeout"}, errors
    done = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    turns = [t for d in done for t in d.get("turns", [])]
    assert any(t["role"] == "tool_call" and t["content"].startswith("flaky(") for t in turns), done[:4]
    assert any(t["role"] == "tool" for t in turns), done[:4]
