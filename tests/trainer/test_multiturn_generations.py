"""A multi-turn rollout (TRL's tool loop: assistant turns with tool_calls, then tool turns) is written to
completions.jsonl with its turns, and the run view's Generations pane and `llmtui show --generations`
draw it as turns: model, tool call, tool result, with its rewards and advantage."""

from __future__ import annotations

import time

from tuiapp.cli.main import main
from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.run_folder.completions import completions_path, parse_generation
from tuiapp.core.run_folder.metrics import JsonlWriter
from tuiapp.core.store.runs import RunStore
from tuiapp.trainer.methods.rl import completion_turns
from tuiapp.ui.generations import GenerationBrowser, generation_lines

ROLLOUT = [  # what GRPOTrainer's _tool_call_loop leaves as one completion
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculate", "arguments": {"expression": "12 * 7"}}}]},
    {"role": "tool", "name": "calculate", "content": "84"},
    {"role": "assistant", "content": "The answer is 84."},
]


def test_a_tool_using_rollout_is_logged_and_shown_as_turns(tmp_path, capsys):
    turns = completion_turns(ROLLOUT)
    assert turns == [{"role": "tool_call", "content": 'calculate({"expression": "12 * 7"})'},
                     {"role": "tool", "content": "calculate: 84"}, {"role": "model", "content": "The answer is 84."}]
    assert completion_turns([{"role": "assistant", "content": "84"}]) == []  # one turn: the completion says it all
    run = RunStore(tmp_path).create(recipe_from_dict({"name": "agent", "model": {"name": "tiny"},
                                                      "method": {"kind": "grpo", "rewards": [{"kind": "answer"}]}}))
    run.update(status="succeeded", started=time.time() - 60, ended=time.time())
    record = {"step": 3, "prompt": "What is 12 times 7?", "completion": "The answer is 84.",
              "rewards": {"answer": 1.0}, "reward": 1.0, "advantage": 0.75, "tokens": 21, "clipped": False,
              "turns": turns}
    with JsonlWriter(completions_path(run.path)) as writer:
        writer.write(record)
    browser = GenerationBrowser()
    browser.add([parse_generation(record)])
    pane = [line.plain for line in generation_lines(browser, 100)]
    assert "    call  calculate({\"expression\": \"12 * 7\"})" in pane and "    tool  calculate: 84" in pane
    assert "    model The answer is 84." in pane and any("answer 1.00 · adv +0.75" in line for line in pane)
    assert main(["--runs-dir", str(tmp_path), "show", run.id, "--generations"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {line}" in out for line in pane[1:])  # the same lines as the pane (its head says how to browse)
    assert "step 3 · 1/1 kept · 1 generations" in out
