"""Agentic GRPO before launch: the recipe's tools and environment checked like reward files (in a
subprocess: this process never imports them), and the setups TRL's trainers do not support refused
with the reason: online RL on images, async generation.

A tool function (or each public method of an environment class) must have typed arguments and a
docstring with an Args: section (TRL builds the tool's JSON schema from them, with transformers'
get_json_schema, whose rules the checker applies without importing transformers), and a dry call with sample arguments must return text, a number or JSON data
within method.tool_timeout_s. An environment class must build with no argument and have reset().
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import is_rl
from tuiapp.core.config.recipe import Recipe, VisionSpec
from tuiapp.core.config.tools import load_kv_file
from tuiapp.core.data.tiny_vlm import is_tiny_vlm
from tuiapp.core.prelaunch.rl import checker_result, function_path

IMPORT_SLACK_S = 60  # the checker's import of the file, besides the calls' own clock

CHECKER = r"""
import importlib.util, inspect, json, signal, sys, traceback
path, name, kind, timeout, row = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), json.loads(sys.stdin.read())
def line_of(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    return frames[-1].lineno if frames else None
def out(**kw):
    print(json.dumps(kw, default=str)); sys.exit(0)
class Late(BaseException):
    pass
def late(*_):
    raise Late()
signal.signal(signal.SIGALRM, late)
try:
    spec = importlib.util.spec_from_file_location("llmtui_user_tools", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["llmtui_user_tools"] = module  # inspect finds a class's source through it
    spec.loader.exec_module(module)
except SyntaxError as exc:
    out(error=f"SyntaxError: {exc.msg}", line=exc.lineno)
except BaseException as exc:
    out(error=f"importing it raised {type(exc).__name__}: {exc}", line=line_of(exc))
target = getattr(module, name, None)
if target is None or not callable(target):
    names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
             and getattr(v, "__module__", None) == "llmtui_user_tools"]
    out(missing=True, names=names)
SAMPLES = {str: "2 + 3", int: 2, float: 2.0, bool: True, list: [], dict: {}}
def schema_problem(func):
    # what transformers' get_json_schema (TRL's tool schema) needs: a docstring, a type hint and an
    # Args: line for every argument
    doc = inspect.getdoc(func) or ""
    if not doc.strip():
        return "has no docstring (TRL builds the tool's description from it)", None
    try:
        hints = inspect.get_annotations(func, eval_str=True)
    except Exception as exc:
        return f"has a type hint that does not resolve: {exc}", None
    args = {}
    for pname, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            return f"takes *{pname}: a tool's arguments must be named and typed", None
        if pname not in hints:
            return f"argument '{pname}' has no type hint", None
        if not any(line.strip().startswith(f"{pname}:") or line.strip().startswith(f"{pname} (") for line in doc.splitlines()):
            return f"the docstring's Args: section does not describe '{pname}'", None
        hint = hints[pname]
        args[pname] = SAMPLES.get(getattr(hint, "__origin__", hint), "x")
    return None, args
def try_tool(label, func):
    problem, args = schema_problem(func)
    if problem:
        out(error=f"{label} {problem}", line=inspect.getsourcelines(func)[1], schema=True)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        value = func(**args)
    except Late:
        out(timeout=True, tool=label, line=inspect.getsourcelines(func)[1])
    except Exception as exc:  # a tool may refuse a sample argument: its error is what the model would read
        value = None
        raised = f"{type(exc).__name__}: {exc}"
    else:
        raised = None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if raised is None and not (value is None or isinstance(value, (str, int, float, bool))):
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            out(garbage=repr(value)[:120], tool=label, line=inspect.getsourcelines(func)[1])
    return {"tool": label, "args": args, "raised": raised}
if kind == "function":
    out(ok=[try_tool(name, target)])
try:
    instance = target()
    reset = getattr(instance, "reset", None)
    if not callable(reset):
        out(error=f"{name} has no reset() method (called at the start of each rollout)", line=inspect.getsourcelines(target)[1])
    reset(**row)
except SystemExit:
    raise
except BaseException as exc:
    out(error=f"building {name}() and calling reset(**row) raised {type(exc).__name__}: {exc}", line=line_of(exc))
tools = [(n, getattr(instance, n)) for n, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
         if not n.startswith("_") and n not in ("reset", "get_reward")]
if not tools:
    out(error=f"{name} has no public method: each one is a tool the model may call", line=inspect.getsourcelines(target)[1])
out(ok=[try_tool(n, f) for n, f in tools])
"""


def check_tool_source(reference: str, kind: str, row: dict, timeout_s: float, base_dir: Path | None,
                      key: str) -> list[Finding]:
    """A tool function ('function') or an environment class ('class') FILE.py:NAME, in a subprocess."""
    path, name = function_path(reference, base_dir)
    what = "tool function" if kind == "function" else "environment class"
    if not path.is_file():
        return [Finding("error", key, f"{what} file {path} not found", "check the path (relative to where llmtui "
                        "runs), e.g. 'tools.py:multiply'")]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", CHECKER, str(path), name, kind, str(timeout_s)],
                              input=json.dumps(row, default=str), capture_output=True, text=True,
                              timeout=timeout_s * 8 + IMPORT_SLACK_S, cwd=path.parent, env=env)
    except subprocess.TimeoutExpired:
        return [Finding("error", key, f"checking {path.name}:{name} did not end", "make importing it and its "
                        "calls faster")]
    result, failed = checker_result(done, path, name, key)
    if result is None:
        return failed
    at = f"{path}:{result['line']}" if result.get("line") else str(path)
    if result.get("missing"):
        known = ", ".join(result["names"]) or "none"
        return [Finding("error", key, f"{path} has no {what} '{name}' (found: {known})",
                        f"define {name} in it, or point {key} at one of those")]
    if result.get("schema"):
        return [Finding("error", key, f"{at}: {result['error']}", "give every argument a type hint and the "
                        "function a docstring with an Args: section describing each (TRL builds the tool's schema "
                        "from them)")]
    if "error" in result:
        return [Finding("error", key, f"{at}: {result['error']}", "fix it; it is called before launch as in "
                        "training")]
    if result.get("timeout"):
        return [Finding("error", key, f"tool {result['tool']} ({at}) did not return within {timeout_s:g}s on sample "
                        "arguments", "make it faster, or raise method.tool_timeout_s")]
    if "garbage" in result:
        return [Finding("error", key, f"tool {result['tool']} ({at}) returned {result['garbage']}, which is not "
                        "text, a number or JSON data", "return a str (or a number, or JSON-able data)")]
    raised = [t for t in result.get("ok", []) if t.get("raised")]
    return [Finding("warning", key, f"tool {t['tool']} raised {t['raised']} on sample arguments {t['args']} (in "
                    "training the model reads the error; method.tool_error_limit such calls in a row fail the run)",
                    "check it handles the arguments the model may send") for t in raised]


def data_findings(recipe: Recipe, records: list[dict], base_dir: Path) -> list[Finding]:
    """Each tool and the environment tried on the first record (columns as reset(**row) gets them)."""
    method = recipe.method
    tools, environment = getattr(method, "tools", []) or [], getattr(method, "environment", None)
    if not tools and environment is None:
        return []
    row = {k: v for k, v in (records[0] if records else {}).items() if k != "prompt"}
    out: list[Finding] = []
    for index, tool in enumerate(tools):
        out += check_tool_source(tool.function, "function", row, method.tool_timeout_s, base_dir,
                                 f"method.tools.{index}.function")
    if environment is not None and environment.class_:
        out += check_tool_source(environment.class_, "class", row, method.tool_timeout_s, base_dir,
                                 "method.environment.class")
    if environment is not None and environment.builtin == "kv_search":
        path = Path(environment.file).expanduser()
        path = path if path.is_absolute() else Path(base_dir) / path
        try:
            load_kv_file(path)
        except OSError as exc:
            out.append(Finding("error", "method.environment.file", f"cannot read {path}: {exc.strerror or exc}",
                               "point file at a JSON object of key: value (relative to where llmtui runs)"))
        except ValueError as exc:
            out.append(Finding("error", "method.environment.file", f"{path}: {exc}",
                               "write a JSON object of key: value"))
    return out


def records_findings(recipe: Recipe, base_dir: Path) -> list[Finding]:
    """data_findings on the recipe's own prompt records (hub data: checked on an empty row)."""
    if not (getattr(recipe.method, "tools", None) or getattr(recipe.method, "environment", None)):
        return []
    from tuiapp.core.common.errors import DatasetError
    from tuiapp.core.data import datasets as data
    from tuiapp.core.prelaunch.rl import prompt_records

    try:
        records = [] if data.is_hub_dataset(recipe.dataset, base_dir) else prompt_records(recipe.dataset, base_dir)[:1]
    except DatasetError:
        records = []  # rl.data_findings reports it
    return data_findings(recipe, records, base_dir)


def rules(recipe: Recipe, cuda: bool | None = None) -> list[Finding]:
    """What TRL's trainers do not support here, refused with the reason."""
    method = recipe.method
    if not is_rl(method.kind):
        return []
    out: list[Finding] = []
    if is_tiny_vlm(recipe.model.name) or recipe.vision != VisionSpec():
        out.append(Finding("error", "method.kind", f"{method.kind} on images is not supported: llmtui's online RL "
                           "builds text prompts (TRL's GRPOTrainer can take image prompts for some vision-language "
                           "models, but llmtui does not pass images, processors or the [vision] settings to it)",
                           "train on images with sft/lora or dpo, or use a text model and text prompts for "
                           f"{method.kind} (drop the [vision] table)"))
    if getattr(method, "async_generation", False):
        out.append(Finding("error", "method.async_generation", "async GRPO (TRL's experimental AsyncGRPOTrainer) "
                           "generates on a separately started vLLM server on CUDA GPUs, with its own config and "
                           "rollout worker; llmtui does not start or wire that yet",
                           "set method.async_generation = false (generation_backend = 'vllm' with vllm_mode = "
                           "'server' runs generation on GPUs of its own)"))
    return out
