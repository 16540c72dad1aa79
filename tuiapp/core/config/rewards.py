"""Reward functions of the online RL methods (grpo, rloo): their recipe tables and the built-in scorers.

A recipe lists them as `[[method.rewards]]` tables, each weighted. The built-in ones are pure Python
and score one completion's text (with its dataset row and token count):

  format     the completion follows a regex (full match, anywhere, or the share of it that matches
             cover) or a tag layout <think>...</think><answer>...</answer> (partial credit per tag)
  answer     the final answer (\\boxed{}, "answer is", "####", else the last number) equals a
             dataset column, numbers compared as numbers (1,000 = 1000.0; 1/2 = 0.5)
  length     closeness to a target token count, or a penalty above / below it
  json       the completion parses as JSON and, optionally, matches a JSON Schema
  tool_call  a well-formed <tool_call>{"name", "arguments"}</tool_call> to a declared tool
  python     the user's function `FILE.py:NAME`, run in the ranks (checked first in a subprocess:
             the parent never imports it)
  model      a sequence-classification reward model: `run:NAME` of a `reward` run, a folder or hub id
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

REWARD_KINDS = ["format", "answer", "length", "json", "tool_call", "python", "model"]
FUNCTION_PATTERN = r"^[^:]+\.py:[A-Za-z_][A-Za-z0-9_]*$"
REWARD_TIMEOUT_S = 60.0  # one call of a user's reward function (tuiapp.core.prelaunch.rl.CHECK_TIMEOUT_S too)


def function_ref(value: str, example: str) -> str:
    """A 'FILE.py:NAME' reference as given, or a ValueError showing `example` (pydantic names the key)."""
    if not re.fullmatch(FUNCTION_PATTERN, value):
        raise ValueError(f"'{value}' is not FILE.py:NAME, e.g. '{example}'")
    return value


class _Reward(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    weight: float = Field(1.0, ge=-100, le=100, description="Weight of this reward in the total (TRL's reward_weights).")
    name: str = Field("", pattern=r"^[A-Za-z0-9_.-]{0,40}$", description="Its label in metrics (rewards/NAME/mean) "
                      "and completions.jsonl; '' = the kind (or the function's name). Unique within the list.")
    primary: bool = Field(False, description="The task's reward: the run's headline (history, compare, `llmtui "
                          "show`) and what the reward-hacking check watches. At most one; none marked = the first "
                          "answer reward, else the weighted total.")

    def label(self) -> str:
        return self.name or self.kind


class FormatReward(_Reward):
    kind: Literal["format"] = Field("format", description="The completion follows a layout: a regex or tags.")
    pattern: str = Field("", description="A Python regex the completion must follow (one of pattern or tags).")
    match: Literal["full", "search", "coverage"] = Field(
        "full", description="pattern: 'full' = the whole stripped completion matches (1 or 0); 'search' = a match "
        "anywhere (1 or 0); 'coverage' = the share of the completion's characters that matches cover (partial "
        "credit, 1.0 when it is all matches).")
    tags: list[str] = Field(default_factory=list, description="A tag layout instead of a pattern, e.g. ['think', "
                            "'answer'] = <think>...</think><answer>...</answer>: 1.0 for exactly that layout, else "
                            "0.5 x the share of its tags present once.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regex: {exc}") from None
        return value

    @field_validator("tags")
    @classmethod
    def _tag_names(cls, value: list[str]) -> list[str]:
        for tag in value:
            if not re.fullmatch(r"[A-Za-z_][\w-]*", tag):
                raise ValueError(f"'{tag}' is not a tag name (letters, digits, _ or -, no brackets)")
        return value

    @model_validator(mode="after")
    def _one_layout(self) -> FormatReward:
        if bool(self.pattern) == bool(self.tags):
            raise ValueError("set one of pattern (a regex) or tags (e.g. ['think', 'answer'])")
        return self


class AnswerReward(_Reward):
    kind: Literal["answer"] = Field("answer", description="The final answer equals a dataset column.")
    column: str = Field("answer", description="Dataset column holding the right answer.")
    tolerance: float = Field(1e-6, ge=0, description="Numbers within this relative tolerance count as equal.")
    math: bool = Field(True, description="When the numbers do not decide, compare the answers as mathematics with "
                       "math-verify (\\frac{1}{2} = 0.5, x+1 = 1+x, {1,2} = {2,1}); false = numbers and plain text only.")


class LengthReward(_Reward):
    kind: Literal["length"] = Field("length", description="Completion length in tokens against a target.")
    target: int = Field(64, ge=1, le=1_000_000, description="Target number of completion tokens.")
    mode: Literal["target", "at_most", "at_least"] = Field(
        "target", description="'target' = 1 - |n - target| / target (floor 0); 'at_most' = 0 up to target, then "
        "-(n - target) / target; 'at_least' = 0 from target on, -(target - n) / target below.")


class JsonReward(_Reward):
    kind: Literal["json"] = Field("json", description="The completion is JSON (in a ```json block or bare).")
    json_schema: str = Field("", description="A JSON Schema file the value must match ('' = parsing is enough); "
                             "needs the jsonschema package.")


class ToolCallReward(_Reward):
    kind: Literal["tool_call"] = Field(
        "tool_call", description="A well-formed <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> to a "
        "declared tool: 1.0 with the tool's required arguments, 0.5 for a known tool without them, 0.25 for "
        "well-formed JSON naming another tool, else 0.")
    tools: list[str] = Field(default_factory=list, description="Tool names allowed ([] = those the row's tools "
                             "column declares).")
    column: str = Field("tools", description="Dataset column with the row's tool definitions (JSON list of "
                        "{name, parameters} or {type: function, function: {...}}).")


class PythonReward(_Reward):
    kind: Literal["python"] = Field("python", description="Your function, called like TRL's reward functions.")
    function: str = Field("", description="'FILE.py:NAME' (relative to where llmtui runs): NAME(prompts, "
                          "completions, completion_ids, **columns) returns one float (or None) per completion; "
                          "completions are texts, prompts chat turns, each dataset column a list.")
    timeout_s: float = Field(REWARD_TIMEOUT_S, gt=0, le=3600, description="Seconds one call may take in training "
                             "(the pre-launch check's limit by default); past it the call counts as failed (on_error).")
    on_error: Literal["fail", "skip"] = Field("fail", description="When a call times out, or returns only NaN/None "
                                              "for bad_steps calls in a row: 'fail' ends the run naming the function "
                                              "and its file:line; 'skip' scores that call None (ignored) and goes on.")
    bad_steps: int = Field(1, ge=1, le=100000, description="Calls in a row (one a step) returning NaN/None for "
                           "every completion before on_error acts.")

    @field_validator("function")
    @classmethod
    def _file_and_name(cls, value: str) -> str:
        return function_ref(value, "rewards.py:my_reward")

    def label(self) -> str:
        return self.name or self.function.rsplit(":", 1)[1]


class ModelReward(_Reward):
    kind: Literal["model"] = Field("model", description="A reward model scores prompt + completion.")
    model: str = Field("", min_length=1, validate_default=True, description="'run:NAME' (the final model of the latest succeeded "
                       "`reward` run NAME), a local folder or a hub id of a sequence-classification model.")

    def label(self) -> str:
        return self.name or "model"


RewardSpec = Annotated[
    Union[FormatReward, AnswerReward, LengthReward, JsonReward, ToolCallReward, PythonReward, ModelReward],
    Field(discriminator="kind"),
]
REWARD_MODELS = {cls.model_fields["kind"].default: cls for cls in (
    FormatReward, AnswerReward, LengthReward, JsonReward, ToolCallReward, PythonReward, ModelReward)}


def check_labels(rewards: list) -> list:
    """Each label once (they name the metrics); pre-flight asks for at least one reward."""
    seen: set[str] = set()
    for reward in rewards:
        if reward.label() in seen:
            raise ValueError(f"two rewards are labelled '{reward.label()}': give one a distinct name")
        seen.add(reward.label())
    primary = [r.label() for r in rewards if r.primary]
    if len(primary) > 1:
        raise ValueError(f"{len(primary)} rewards are marked primary ({', '.join(primary)}): mark one, the task's "
                         "reward (e.g. the answer's)")
    return rewards


# ---------------------------------------------------------------- built-in scorers


def score_format(spec: FormatReward, text: str) -> float:
    text = text.strip()
    if spec.tags:
        return _tag_layout(spec.tags, text)
    if spec.match == "full":
        return 1.0 if re.fullmatch(spec.pattern, text, re.DOTALL) else 0.0
    if spec.match == "search":
        return 1.0 if re.search(spec.pattern, text, re.DOTALL) else 0.0
    if not text:
        return 0.0
    covered = sum(m.end() - m.start() for m in re.finditer(spec.pattern, text, re.DOTALL))
    return min(1.0, covered / len(text))


def _tag_layout(tags: list[str], text: str) -> float:
    layout = r"\s*".join(rf"<{re.escape(t)}>.*?</{re.escape(t)}>" for t in tags)
    if re.fullmatch(layout, text, re.DOTALL):
        return 1.0
    markers = [m for t in tags for m in (f"<{t}>", f"</{t}>")]
    present = sum(1 for m in markers if text.count(m) == 1)
    return 0.5 * present / len(markers)


NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def final_answer(text: str) -> str:
    """The final answer of a completion: \\boxed{...}, the text after 'answer is' / 'Answer:' / '####',
    <answer>...</answer>, else the last number, else the last line."""
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    if boxed:
        return boxed[-1].strip()
    tagged = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
    if tagged:
        return tagged[-1].strip()
    marked = re.findall(r"(?:answer is|answer:|####)\s*([^\n]+)", text, re.IGNORECASE)
    if marked:
        candidate = marked[-1].strip().rstrip(".")
        numbers = NUMBER.findall(candidate)
        return numbers[0] if numbers else candidate
    numbers = NUMBER.findall(text)
    if numbers:
        return numbers[-1]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def as_number(text: str) -> float | None:
    """'1,000' -> 1000.0, '3/4' -> 0.75, '$5.00' -> 5.0, '50%' -> 50.0; None when it is not a number."""
    cleaned = re.sub(r"[\s$€£%]", "", str(text)).replace(",", "").rstrip(".")
    if not cleaned:
        return None
    try:
        return float(Fraction(cleaned)) if "/" in cleaned else float(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(given: str, expected: object, tolerance: float = 1e-6) -> bool:
    a, b = as_number(given), as_number(str(expected))
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance)
    norm = lambda s: re.sub(r"\s+", " ", str(s)).strip().strip(".").lower()  # noqa: E731
    return norm(given) == norm(expected) and norm(given) != ""


def score_answer(spec: AnswerReward, text: str, row: dict) -> float | None:
    if spec.column not in row or row[spec.column] is None:
        return None  # not applicable to this row: left out of the total, as TRL does with None
    given, expected = final_answer(text), row[spec.column]
    if answers_match(given, expected, spec.tolerance):
        return 1.0
    latex = any(mark in f"{text}{expected}" for mark in ("\\", "$"))  # plain numbers and words are decided
    return 1.0 if spec.math and latex and math_equal(text, str(expected)) else 0.0


def math_equal(completion: str, expected: str) -> bool:
    """math-verify's verdict: the completion's final answer (it finds \\boxed{} and LaTeX itself) equals
    the expected one as mathematics. False when either side does not parse."""
    from math_verify import parse, verify

    gold = parse(expected if "$" in expected or "\\boxed" in expected else f"${expected}$")
    answer = parse(completion)
    return bool(gold) and bool(answer) and bool(verify(gold, answer))


def score_length(spec: LengthReward, tokens: int) -> float:
    target = spec.target
    if spec.mode == "target":
        return max(0.0, 1.0 - abs(tokens - target) / target)
    if spec.mode == "at_most":
        return 0.0 if tokens <= target else -(tokens - target) / target
    return 0.0 if tokens >= target else -(target - tokens) / target


def parse_json_block(text: str) -> tuple[bool, Any]:
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    body = fenced.group(1) if fenced else text
    try:
        return True, json.loads(body.strip())
    except ValueError:
        return False, None


def load_json_schema(path: str, base_dir: Path | None = None) -> dict:
    file = Path(path).expanduser()
    if not file.is_absolute() and base_dir is not None:
        file = base_dir / file
    return json.loads(file.read_text(encoding="utf-8"))


def score_json(text: str, validator=None) -> float:
    ok, value = parse_json_block(text)
    if not ok:
        return 0.0
    if validator is None:
        return 1.0
    return 1.0 if validator.is_valid(value) else 0.5


def declared_tools(value: object) -> dict[str, list[str]]:
    """{tool name: required argument names} of a row's tool definitions (OpenAI or plain style)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    out: dict[str, list[str]] = {}
    for tool in value if isinstance(value, list) else []:
        if not isinstance(tool, dict):
            continue
        spec = tool.get("function", tool) if isinstance(tool.get("function"), dict) else tool
        name = spec.get("name")
        if isinstance(name, str):
            params = spec.get("parameters") or {}
            out[name] = list(params.get("required", [])) if isinstance(params, dict) else []
    return out


def score_tool_call(spec: ToolCallReward, text: str, row: dict) -> float:
    found = re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)
    if not found:
        return 0.0
    try:
        call = json.loads(found[0].strip())
    except ValueError:
        return 0.0
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 0.0
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return 0.25
    tools = declared_tools(row.get(spec.column))
    if spec.tools:
        tools = {name: tools.get(name, []) for name in spec.tools}
    if call["name"] not in tools or not isinstance(arguments, dict):
        return 0.25
    return 1.0 if all(arg in arguments for arg in tools[call["name"]]) else 0.5


def scorer(spec, base_dir: Path | None = None):
    """A built-in reward as f(texts, rows, token_counts) -> list[float | None]."""
    if spec.kind == "format":
        return lambda texts, rows, lengths: [score_format(spec, t) for t in texts]
    if spec.kind == "answer":
        return lambda texts, rows, lengths: [score_answer(spec, t, r) for t, r in zip(texts, rows, strict=True)]
    if spec.kind == "length":
        return lambda texts, rows, lengths: [score_length(spec, n) for n in lengths]
    if spec.kind == "json":
        validator = None
        if spec.json_schema:
            import jsonschema  # preflight checks it is installed

            validator = jsonschema.validators.validator_for(schema := load_json_schema(spec.json_schema, base_dir))(
                schema)
        return lambda texts, rows, lengths: [score_json(t, validator) for t in texts]
    if spec.kind == "tool_call":
        return lambda texts, rows, lengths: [score_tool_call(spec, t, r) for t, r in zip(texts, rows, strict=True)]
    raise ValueError(f"{spec.kind} is not a built-in reward")
