"""Tools and environments of agentic GRPO: the recipe's `[[method.tools]]` and `[method.environment]`
tables, and the built-in offline environments' pure parts (the calculator's arithmetic, the
key-value store's lookup, their verifiable rewards' data).

    [[method.tools]]                 # a Python function the model may call
    function = "tools.py:multiply"   # typed arguments and a docstring (TRL builds the tool's schema from them)

    [method.environment]             # one instance per rollout: reset() then its public methods are the tools
    builtin = "calculator"           # or class = "env.py:MyEnv", or builtin = "kv_search" with file = "facts.json"

TRL's GRPOTrainer gets them as `tools=` and `environment_factory=`; the tool calls and results are
turns of the completion, the results masked out of the loss (TRL's tool_mask). Each call runs under
the method's tool_timeout_s, its output cut to tool_output_tokens; a call that raises, hangs or returns
something that is not text/number/JSON ends with a recorded error, and past tool_error_limit such
errors in a row the run fails naming the tool and its file:line.
"""

from __future__ import annotations

import ast
import json
import operator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuiapp.core.config.rewards import function_ref

BUILTIN_ENVIRONMENTS = ("calculator", "kv_search")
TOOL_TIMEOUT_S = 10.0
TOOL_OUTPUT_TOKENS = 64
TOOL_ERROR_LIMIT = 16


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    function: str = Field(..., description="'FILE.py:NAME' (relative to where llmtui runs): a function with typed "
                          "arguments and a docstring (Args: section), which TRL turns into the tool's schema; it "
                          "returns text, a number or JSON-able data. Checked before launch in a subprocess.")

    @field_validator("function")
    @classmethod
    def _file_and_name(cls, value: str) -> str:
        return function_ref(value, "tools.py:multiply")

    def label(self) -> str:
        return self.function.rsplit(":", 1)[1]


class EnvironmentSpec(BaseModel):

    builtin: str = Field("", description="A built-in offline environment: 'calculator' (add, subtract, multiply, "
                         "divide; the answer reward checks the result) or 'kv_search' (search(key) over file's "
                         "JSON object; the answer reward checks the value). '' = class.")
    class_: str = Field("", alias="class", description="'FILE.py:NAME' of your environment class: NAME() takes no "
                        "argument, reset(**row) starts a rollout (may return the first observation text), each "
                        "public method with typed arguments and a docstring is a tool.")
    file: str = Field("", description="kv_search: the JSON file of {key: value} it searches (relative to where "
                      "llmtui runs).")

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, serialize_by_alias=True)

    @field_validator("builtin")
    @classmethod
    def _known(cls, value: str) -> str:
        if value and value not in BUILTIN_ENVIRONMENTS:
            raise ValueError(f"'{value}' is not a built-in environment: {', '.join(BUILTIN_ENVIRONMENTS)}")
        return value

    @field_validator("class_")
    @classmethod
    def _file_and_name(cls, value: str) -> str:
        return function_ref(value, "env.py:MyEnv") if value else value

    @model_validator(mode="after")
    def _one_source(self) -> EnvironmentSpec:
        if bool(self.builtin) == bool(self.class_):
            raise ValueError("set one of builtin ('calculator' or 'kv_search') or class ('env.py:MyEnv')")
        if self.builtin == "kv_search" and not self.file:
            raise ValueError("the kv_search environment needs file = 'facts.json' (a JSON object of key: value)")
        return self

    def label(self) -> str:
        return self.builtin or self.class_.rsplit(":", 1)[1]


# ---------------------------------------------------------------- built-in environments' pure parts

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg}


def calculate(expression: str) -> float:
    """+ - * / and parentheses over numbers, nothing else (no names, no calls): ValueError otherwise."""
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not arithmetic: {expression!r}") from exc
    return value(tree.body)


# The calculator environment's one tool as TRL shows it to the model (transformers' get_json_schema of
# trainer.methods.environments.CalculatorEnv.calculate; a test holds them equal): demo:calc-tools' schema.
CALCULATOR_SCHEMA = {
    "type": "function",
    "function": {
        "name": "calculate", "description": "Compute an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {
            "type": "string", "description": 'Numbers with + - * / and parentheses, e.g. "12 * (3 + 4)".'}},
            "required": ["expression"]},
        "return": {"type": "string"}},
}


def number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def load_kv_file(path: str | Path) -> dict[str, str]:
    """The kv_search file: a JSON object {key: value}, keys compared case-insensitively."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object of key: value")
    return {str(k).strip().lower(): str(v) for k, v in data.items()}


def tool_output(value: object) -> str | None:
    """A tool's return as the text the model reads; None when it is garbage (not text, number, bool, None
    or JSON-able data)."""
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
