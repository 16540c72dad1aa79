"""Agentic GRPO before launch: a recipe's tools and environment class checked in a subprocess (typed,
documented arguments, a dry call within the clock, a sane return), the kv_search file read, and the
setups TRL's trainers do not support here refused with the reason (images, async generation, tool calls
on the bundled tiny model's template)."""

from __future__ import annotations

import pytest

from tuiapp.core.config.recipe import recipe_from_dict
from tuiapp.core.prelaunch import agent

GOOD = '''
def multiply(a: int, b: int) -> int:
    """Multiply two numbers.

    Args:
        a: The first.
        b: The second.
    """
    return a * b
'''

BROKEN = {
    "undocumented": ("def multiply(a: int, b: int) -> int:\n    return a * b\n", ["tools.py:1", "has no docstring"]),
    "untyped": ('def multiply(a, b):\n    """Multiply.\n\n    Args:\n        a: x\n        b: y\n    """\n    return a\n',
                ["tools.py:1", "argument 'a' has no type hint"]),
    "hangs": ('import time\n\ndef multiply(a: int) -> int:\n    """Multiply.\n\n    Args:\n        a: x\n    """\n'
              '    time.sleep(60)\n', ["tool multiply", "tools.py:3", "did not return within 0.5s"]),
    "garbage": ('def multiply(a: int) -> object:\n    """Multiply.\n\n    Args:\n        a: x\n    """\n'
                '    return object()\n', ["tools.py:1", "which is not text, a number or JSON data"]),
    "syntax": ("def multiply(a: int) -> int\n    return a\n", ["tools.py:1", "SyntaxError"]),
    "missing": ("def other(a: int) -> int:\n    return a\n", ["has no tool function 'multiply'", "other"]),
}


def check(tmp_path, source, kind="function", name="multiply"):
    (tmp_path / "tools.py").write_text(source)
    return agent.check_tool_source(f"{tmp_path / 'tools.py'}:{name}", kind, {"answer": "6"}, 0.5, tmp_path,
                                   "method.tools.0.function")


@pytest.mark.slow  # seven subprocesses: ~2 s on a quiet machine, 4 s on a busy one
def test_a_typed_documented_tool_passes_and_each_broken_one_is_named_with_its_file_and_line(tmp_path):
    assert check(tmp_path, GOOD) == []
    for case, (source, words) in BROKEN.items():
        found = check(tmp_path, source)
        assert len(found) == 1 and found[0].level == "error", (case, found)
        text = found[0].message
        assert all(w in text for w in words), (case, text)
    warned = check(tmp_path, GOOD.replace("return a * b", "raise ValueError('no')"))
    assert [f.level for f in warned] == ["warning"] and "raised ValueError: no" in warned[0].message


ENV = '''
class Shop:
    def reset(self, **row):
        self.answer = row.get("answer")

    def price(self, item: str) -> str:
        """The price of an item.

        Args:
            item: Its name.
        """
        return "3"
'''


def test_an_environment_class_needs_reset_and_documented_public_methods(tmp_path):
    assert check(tmp_path, ENV, "class", "Shop") == []
    found = check(tmp_path, ENV.replace("def reset", "def start"), "class", "Shop")
    assert "has no reset() method" in found[0].message and "tools.py:2" in found[0].message
    found = check(tmp_path, ENV.replace('"""The price of an item.\n\n        Args:\n            item: Its name.\n        """', ""),
                  "class", "Shop")
    assert "price has no docstring" in found[0].message


def recipe(**method):
    return recipe_from_dict({"name": "a", "model": {"name": "Qwen/Qwen2.5-0.5B-Instruct"},
                             "dataset": {"name": "demo:arith"},
                             "method": {"kind": "grpo", "rewards": [{"kind": "answer"}], **method}})


def test_the_kv_search_file_is_read_before_launch(tmp_path):
    missing = recipe(environment={"builtin": "kv_search", "file": str(tmp_path / "facts.json")})
    found = agent.data_findings(missing, [], tmp_path)
    assert found[0].key == "method.environment.file" and "cannot read" in found[0].message
    (tmp_path / "facts.json").write_text("[1, 2]")
    assert "not an object" in agent.data_findings(missing, [], tmp_path)[0].message
    (tmp_path / "facts.json").write_text('{"capital of France": "Paris"}')
    assert agent.data_findings(missing, [], tmp_path) == []
    with pytest.raises(Exception, match="needs file"):
        recipe(environment={"builtin": "kv_search"})


def test_images_and_async_generation_are_refused_with_the_reason_tools_on_the_tiny_model_are_not():
    assert agent.rules(recipe(environment={"builtin": "calculator"})) == []
    found = agent.rules(recipe(async_generation=True))
    assert [f.key for f in found] == ["method.async_generation"] and "vLLM server" in found[0].message
    vision = recipe_from_dict({"name": "v", "model": {"name": "tiny-vlm"}, "method": {"kind": "rloo"}})
    found = agent.rules(vision)
    assert found[0].key == "method.kind" and "rloo on images is not supported" in found[0].message
    tiny = recipe_from_dict({"name": "t", "model": {"name": "tiny"}, "method": {"kind": "grpo", "environment":
                                                                              {"builtin": "calculator"}}})
    assert agent.rules(tiny) == []  # its template writes Qwen-style calls, which TRL parses (trainer.methods.rl.tool_template)
    with pytest.raises(Exception, match="tools"):  # rloo: RLOOTrainer takes no tools
        recipe_from_dict({"name": "r", "method": {"kind": "rloo", "tools": [{"function": "t.py:f"}]}})


def test_an_environment_table_round_trips_through_the_run_folders_recipe(tmp_path):
    from tuiapp.core.config.recipe import load_recipe
    from tuiapp.core.store.runs import RunStore

    run = RunStore(tmp_path).create(recipe(environment={"class": "env.py:Shop"}, max_turns=3))
    text = (run.path / "recipe.toml").read_text()
    assert 'class = "env.py:Shop"' in text
    method = load_recipe(run.path / "recipe.toml").method
    assert method.environment.class_ == "env.py:Shop" and method.max_turns == 3
