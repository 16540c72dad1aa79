"""Online RL (grpo, rloo) before launch: prompt-only data, the cross-field rules, and each reward
checked on real rows (a user's reward function in a subprocess: this process never imports it).

Prompt records: {"prompt": [turns up to the last user turn], **every other column of the row}. The
prompt comes from a `prompt` (text or turns), `messages`/`conversations` (a trailing assistant turn
is dropped: the answer is what the policy generates) or alpaca `instruction` (+ `input`) column, or
the one dataset.columns maps as `prompt` / `messages`. The other columns reach the rewards.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from tuiapp.core.common.errors import DatasetError, UserError
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import is_quantized, is_reward_model, is_rl
from tuiapp.core.config.recipe import BUNDLED_MODEL, Recipe, weights_method
from tuiapp.core.config.rewards import REWARD_TIMEOUT_S
from tuiapp.core.data import datasets as data
from tuiapp.core.data.tiny_vlm import is_tiny_vlm
from tuiapp.core.machine.gpus import cuda_available, detect_gpus
from tuiapp.core.plan.cluster import uses_hosts
from tuiapp.core.prelaunch.resources import launch_world
from tuiapp.core.run_folder import rundir

PROMPT_COLUMNS = ("prompt", "question", "query", "instruction", "problem")
CHAT_COLUMNS = ("messages", "conversations")
CHECK_ROWS = 4  # rows a user's reward function is tried on before launch
CHECK_TIMEOUT_S = int(REWARD_TIMEOUT_S)  # the same limit as a call in training


# ---------------------------------------------------------------- prompt-only data


def _turns(value: object, where: str) -> list[dict]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise DatasetError(message=f"{where}: the prompt must be text or a list of turns", key="dataset.columns",
                           fix="map the prompt column in dataset.columns, e.g. {prompt = 'question'}")
    turns = []
    for turn in value:
        if not isinstance(turn, dict):
            raise DatasetError(message=f"{where}: a turn is a {type(turn).__name__}, not {{role, content}}",
                               key="dataset.columns", fix="write turns as {\"role\": ..., \"content\": ...}")
        role = data.ROLES.get(str(turn.get("role", turn.get("from", "user"))).lower(), "user")
        content = turn.get("content", turn.get("value"))
        turns.append({"role": "assistant" if role == "tool_call" else role,
                      "content": content if isinstance(content, str) else json.dumps(content)})
    return turns


def prompt_record(row: object, columns: dict[str, str], where: str) -> dict:
    """One row as {"prompt": turns, **other columns}."""
    if not isinstance(row, dict):
        raise DatasetError(message=f"{where}: a record is a {type(row).__name__}, not an object", key="dataset.name",
                           fix="each record must be a JSON object with a prompt column")
    chat = columns.get("messages") or next((c for c in CHAT_COLUMNS if c in row), None)
    if chat in row and "prompt" not in columns:
        turns = _turns(row[chat], where)
        while turns and turns[-1]["role"] == "assistant":
            turns.pop()  # a reference answer: the policy writes its own
        used = {chat}
    else:
        column = columns.get("prompt") or next((c for c in PROMPT_COLUMNS if c in row), None)
        if column is None or column not in row:
            raise DatasetError(
                message=f"{where}: no prompt column; found: {', '.join(row) or 'none'}", key="dataset.columns",
                fix="name it prompt (text or turns) or messages, or map yours: dataset.columns = {prompt = 'question'}")
        turns = _turns(row[column], where)
        used = {column}
        extra = columns.get("query") or ("input" if column == "instruction" else None)
        if extra and isinstance(row.get(extra), str) and row[extra].strip() and turns:
            turns[-1] = {**turns[-1], "content": turns[-1]["content"] + "\n" + row[extra]}
            used.add(extra)
    system = columns.get("system", "system")
    if isinstance(row.get(system), str) and row[system].strip() and not any(t["role"] == "system" for t in turns):
        turns.insert(0, {"role": "system", "content": row[system]})
        used.add(system)
    if not turns or not any(t["role"] == "user" and t["content"].strip() for t in turns):
        raise DatasetError(message=f"{where}: the prompt is empty", key="dataset.name",
                           fix="every record needs a user prompt")
    return {"prompt": turns, **{k: v for k, v in row.items() if k not in used and k != "prompt"}}


def prompt_records_of(rows: list, spec, where: str) -> list[dict]:
    records = [prompt_record(row.data if isinstance(row, data.Row) else row, spec.columns,
                             f"{where} record {i}") for i, row in enumerate(rows)]
    return data.limit_records(records, spec, where)


def prompt_records(spec, base_dir: str | Path | None = None) -> list[dict]:
    """The prompt records of a demo or local dataset (hub datasets are read by the trainer)."""
    source = data.resolve_source(spec, base_dir)
    return prompt_records_of(data.read_rows(source), spec, source.name)


def data_findings(recipe: Recipe, base_dir: Path) -> list[Finding]:
    """The data holds prompts, the columns the rewards read, and each reward works on a few rows."""
    try:
        if data.is_hub_dataset(recipe.dataset, base_dir):
            return [Finding("info", "dataset.name", "hub data: prompts and reward columns are checked when the "
                            "run loads it")]
        records = prompt_records(recipe.dataset, base_dir)
    except DatasetError as exc:
        return [Finding("error", exc.key or "dataset.name", str(exc), exc.fix or "")]
    out: list[Finding] = []
    for index, reward in enumerate(recipe.method.rewards):
        key = f"method.rewards.{index}"
        column = getattr(reward, "column", None)
        if reward.kind == "answer" and not any(column in r for r in records[:50]):
            found = sorted({k for r in records[:50] for k in r if k != "prompt"})
            out.append(Finding("error", f"{key}.column", f"the answer reward reads column '{column}', which the "
                               f"records lack (found: {', '.join(found) or 'only the prompt'})",
                               f"set method.rewards.{index}.column to the column with the right answers"))
        if reward.kind == "tool_call" and not reward.tools and not any(column in r for r in records[:50]):
            out.append(Finding("error", f"{key}.tools", f"the tool_call reward needs declared tools: a '{column}' "
                               "column in the records, or a tools list", f"set method.rewards.{index}.tools = "
                               "['tool_name', ...] or method.rewards.{index}.column"))
        if reward.kind == "python":
            out += check_python_reward(reward.function, records[:CHECK_ROWS], base_dir, key + ".function")
        if reward.kind == "model":
            out += _reward_model_findings(reward.model, base_dir, key + ".model")
    return out


def _reward_model_findings(name: str, base_dir: Path, key: str) -> list[Finding]:
    """A local reward model folder exists and, when llmtui trained it, is a `reward` run's model."""
    folder = Path(name).expanduser()
    folder = folder if folder.is_absolute() else Path(base_dir) / folder
    if not folder.is_dir():
        if data.HUB_ID.match(name):
            return []  # a hub id: loaded (or refused) by the ranks
        return [Finding("error", key, f"reward model {name} not found", "a sequence-classification model folder, "
                        "'run:NAME' of a `reward` run, or a hub id")]
    info = folder / rundir.FINAL_INFO
    method = json.loads(info.read_text()).get("method") if info.is_file() else "reward"
    if not is_reward_model(method):
        return [Finding("error", key, f"{name} is the final model of a {method} run, not a reward model",
                        "train one with method.kind = 'reward' and use 'run:NAME' of that run")]
    if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
        return [Finding("error", key, f"{name} holds no model (no config.json)", "point it at a model folder")]
    return []


# ---------------------------------------------------------------- rules


def _ranks(recipe: Recipe) -> int:
    gpus = detect_gpus()
    return launch_world(recipe, gpus, cuda=cuda_available(gpus)).size


def rules(recipe: Recipe, ranks: int | None = None, cuda: bool | None = None,
          vllm_installed: bool | None = None, gpu_count: int | None = None) -> list[Finding]:
    """Cross-field rules of a grpo/rloo recipe, checked before any launch (`gpu_count`: the
    CUDA GPUs visible, detected when None)."""
    method, train = recipe.method, recipe.train
    if not is_rl(method.kind):
        return []
    out: list[Finding] = []
    if not method.rewards:
        out.append(Finding("error", "method.rewards", f"{method.kind} needs reward functions to score its "
                           "completions, and the recipe has none", "add a [[method.rewards]] table, e.g. kind = "
                           "'format' with a pattern, or kind = 'answer' with the column of right answers"))
    out += _group_rules(recipe, ranks)
    if method.max_completion_length >= train.max_seq_len:
        out.append(Finding("error", "method.max_completion_length", f"max_completion_length "
                           f"({method.max_completion_length}) leaves no room for the prompt in max_seq_len "
                           f"({train.max_seq_len})", "raise train.max_seq_len, or lower method.max_completion_length"))
    if method.epsilon_high and method.epsilon_high < method.epsilon:
        out.append(Finding("warning", "method.epsilon_high", f"epsilon_high ({method.epsilon_high}) is below epsilon "
                           f"({method.epsilon}): the upper clip is tighter than the lower one",
                           "set epsilon_high >= epsilon (DAPO: 0.28), or 0 for the same as epsilon"))
    if train.packing is True:
        out.append(Finding("warning", "train.packing", f"{method.kind} scores whole prompt + completion sequences, "
                           "so packing does not apply", "set train.packing = 'auto'"))
    if recipe.launch.strategy == "pipeline":
        out.append(Finding("error", "launch.strategy", f"{method.kind} generates completions with the whole model "
                           "in each rank, which a pipeline of stages cannot", "set launch.strategy = 'deepspeed'"))
    if is_quantized(weights_method(method).kind) and recipe.launch.zero_stage == 3:
        out.append(Finding("error", "launch.zero_stage", "ZeRO-3 cannot partition the 4-bit base weights of a "
                           "qlora adapter", "set launch.zero_stage = 2 or lower"))
    if method.generation_backend == "vllm":
        out += _vllm_rules(recipe, cuda, vllm_installed, gpu_count)
    for index, reward in enumerate(method.rewards):
        if reward.kind == "json" and reward.json_schema:
            out += _schema_findings(reward.json_schema, f"method.rewards.{index}.json_schema")
    return out


def _group_rules(recipe: Recipe, ranks: int | None) -> list[Finding]:
    """Each prompt's num_generations completions must land in one batch to be compared."""
    method, train = recipe.method, recipe.train
    out: list[Finding] = []
    group = method.num_generations
    if train.micro_batch == "auto":
        out.append(Finding("error", "train.micro_batch", f"{method.kind} batches are groups of num_generations "
                           "completions, which the micro_batch probe does not size", f"set train.micro_batch to a "
                           f"multiple of method.num_generations ({group})"))
    else:
        ranks = _ranks(recipe) if ranks is None else ranks
        evals = train.eval_steps > 0 or bool(train.sample_prompts) or recipe.dataset.eval_split not in (0, 0.0, "")
        batch = train.micro_batch * ranks * (1 if evals else train.grad_accum)
        if batch % group:
            what = "micro_batch x ranks" + ("" if evals else " x grad_accum")
            numbers = f"{train.micro_batch} x {ranks}" + ("" if evals else f" x {train.grad_accum}")
            fit = next(m for m in range(train.micro_batch, train.micro_batch + group * 2)
                       if (m * ranks * (1 if evals else train.grad_accum)) % group == 0)
            out.append(Finding("error", "train.micro_batch", f"{what} ({numbers} = {batch} completions) is not a "
                               f"multiple of method.num_generations ({group}): each prompt's {group} completions "
                               "must be scored together" + (" (evals use micro_batch x ranks)" if evals else ""),
                               f"set train.micro_batch = {fit}, or method.num_generations to a divisor of {batch}"))
    return out


def _vllm_rules(recipe: Recipe, cuda: bool | None, vllm_installed: bool | None, gpu_count: int | None) -> list[Finding]:
    """generation_backend 'vllm': CUDA, the package, and in server mode its GPUs."""
    method = recipe.method
    out: list[Finding] = []
    cuda = cuda_available() if cuda is None else cuda
    if not cuda:
        out.append(Finding("error", "method.generation_backend", "vLLM generates on CUDA GPUs and this machine "
                           "has none", "set method.generation_backend = 'transformers' (generation in each rank)"))
    elif not (importlib.util.find_spec("vllm") is not None if vllm_installed is None else vllm_installed):
        out.append(Finding("error", "method.generation_backend", "generation_backend 'vllm' needs the vllm "
                           "package, which is not installed", "pip install vllm, or set "
                           "method.generation_backend = 'transformers'"))
    if method.vllm_mode == "server":
        out += server_rules(recipe, gpu_count)
    return out


def server_rules(recipe: Recipe, gpu_count: int | None = None) -> list[Finding]:
    """vllm_mode 'server': the server runs beside the ranks on this machine, on GPUs of its own,
    and loads the base model by name or folder."""
    method, launch = recipe.method, recipe.launch
    out: list[Finding] = []
    if launch.nodes > 1 or uses_hosts(launch):
        out.append(Finding("error", "method.vllm_mode", "the vLLM generation server runs on the machine of a "
                           "single-machine run, and this run spans several nodes", "set method.vllm_mode = "
                           "'colocate' (an engine in each rank), or train on one machine"))
    name = recipe.model.name
    if name == BUNDLED_MODEL or is_tiny_vlm(name):
        out.append(Finding("error", "model.name", f"the vLLM generation server loads a hub model or a model folder, "
                           f"and '{name}' is built inside the ranks", "use a hub id or a local model folder, or set "
                           "method.generation_backend = 'transformers'"))
    visible = len(detect_gpus()) if gpu_count is None else gpu_count
    wanted, server = launch.gpus, method.vllm_server_gpus
    train = (visible - server if wanted == "all" else wanted if isinstance(wanted, int) else len(wanted))
    if visible and (train < 1 or train + server > visible):
        out.append(Finding("error", "method.vllm_server_gpus", f"the ranks ({max(train, 0)} GPU(s), launch.gpus) and "
                           f"the vLLM server ({server}, method.vllm_server_gpus) need {max(train, 1) + server} GPUs, "
                           f"and this machine has {visible}", f"lower launch.gpus to {max(visible - server, 0)} or "
                           "method.vllm_server_gpus, or set method.vllm_mode = 'colocate' (vLLM shares each rank's "
                           "GPU)"))
    if isinstance(wanted, list) and visible:
        spare = [i for i in range(visible) if i not in wanted]
        if len(spare) >= server:
            out.append(Finding("info", "method.vllm_server_gpus", f"the vLLM server takes GPU(s) "
                               f"{', '.join(map(str, spare[:server]))}", ""))
    return out


def _schema_findings(path: str, key: str) -> list[Finding]:
    if importlib.util.find_spec("jsonschema") is None:
        return [Finding("error", key, "matching a JSON Schema needs the jsonschema package, which is not installed",
                        "pip install jsonschema, or json_schema = '' to reward any valid JSON")]
    try:
        json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as exc:
        return [Finding("error", key, f"cannot read the JSON Schema {path}: {exc.strerror or exc}",
                        "check the path (relative to where llmtui runs)")]
    except ValueError as exc:
        return [Finding("error", key, f"the JSON Schema {path} is not valid JSON: {exc}", "fix the file")]
    return []


# ---------------------------------------------------------------- a user's reward function


CHECKER = r"""
import importlib.util, json, sys, traceback
path, name, rows = sys.argv[1], sys.argv[2], json.loads(sys.stdin.read())
def where(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    return (frames[-1].lineno if frames else None)
try:
    spec = importlib.util.spec_from_file_location("llmtui_user_rewards", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
except SyntaxError as exc:
    print(json.dumps({"error": f"SyntaxError: {exc.msg}", "line": exc.lineno})); sys.exit(0)
except BaseException as exc:
    print(json.dumps({"error": f"importing it raised {type(exc).__name__}: {exc}", "line": where(exc),
                      "trace": traceback.format_exc(limit=-3)})); sys.exit(0)
func = getattr(module, name, None)
if not callable(func):
    names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
             and getattr(v, "__module__", None) == "llmtui_user_rewards"]
    print(json.dumps({"missing": True, "functions": names})); sys.exit(0)
prompts = [r.pop("prompt") for r in rows]
completions = ["", "42", "The answer is 42.", "<answer>42</answer>"][: len(rows)]
columns = {k: [r.get(k) for r in rows] for k in sorted({k for r in rows for k in r})}
try:
    out = func(prompts=prompts, completions=completions, completion_ids=[[] for _ in rows], **columns)
except BaseException as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}", "line": where(exc),
                      "trace": traceback.format_exc(limit=-3)})); sys.exit(0)
try:
    values = list(out)
except TypeError:
    values = None
if values is None or len(values) != len(rows) or not all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
    print(json.dumps({"bad_return": repr(out)[:200], "count": len(rows)})); sys.exit(0)
print(json.dumps({"ok": values}))
"""


def function_path(function: str, base_dir: Path | None) -> tuple[Path, str]:
    file, _, name = function.rpartition(":")
    path = Path(file).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    return path.resolve(), name


def checker_result(done: subprocess.CompletedProcess, path: Path, name: str,
                   key: str) -> tuple[dict | None, list[Finding]]:
    """The JSON result a check subprocess printed last (its line starting with '{'), or None and the
    'failed' finding (its stderr's tail) when it printed none."""
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return None, [Finding("error", key, f"checking {path.name}:{name} failed: "
                              f"{(done.stderr or done.stdout)[-500:]}", "run the file with python to see the problem")]
    return json.loads(lines[-1]), []


def check_python_reward(function: str, records: list[dict], base_dir: Path | None, key: str) -> list[Finding]:
    """Call FILE.py:NAME on a few real rows (and sample completions) in a subprocess; the findings
    name the file and line of what broke."""
    path, name = function_path(function, base_dir)
    if not path.is_file():
        return [Finding("error", key, f"reward function file {path} not found",
                        "check the path (relative to where llmtui runs), e.g. 'rewards.py:my_reward'")]
    rows = json.loads(json.dumps(records, default=str))
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", CHECKER, str(path), name], input=json.dumps(rows),
                              capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, cwd=path.parent, env=env)
    except subprocess.TimeoutExpired:
        return [Finding("error", key, f"{path.name}:{name} did not return within {CHECK_TIMEOUT_S}s on "
                        f"{len(rows)} rows", "make it faster (it runs on every completion)")]
    result, failed = checker_result(done, path, name, key)
    if result is None:
        return failed
    at = f"{path}:{result['line']}" if result.get("line") else str(path)
    if "error" in result:
        trace = f"\n{result['trace'].rstrip()}" if result.get("trace") else ""
        return [Finding("error", key, f"{at}: {result['error']} (called on {len(rows)} dataset rows){trace}",
                        "fix the function; it is called with prompts=, completions= (texts), completion_ids= and "
                        "each dataset column as a list")]
    if result.get("missing"):
        from tuiapp.core.common.errors import did_you_mean

        hint = did_you_mean(name, result["functions"])
        known = ", ".join(result["functions"]) or "none"
        return [Finding("error", key, f"{path} has no function '{name}' (functions: {known})",
                        hint or f"define def {name}(prompts, completions, **kwargs) in it")]
    if "bad_return" in result:
        return [Finding("error", key, f"{path.name}:{name} returned {result['bad_return']} for {result['count']} "
                        "completions", f"return a list of {result['count']} floats (or None), one per completion")]
    return []


def resolve_reward_models(recipe: Recipe, store) -> Recipe:
    """`run:NAME` reward models → the final folders of those runs (frozen so into the run's recipe)."""
    rewards = getattr(recipe.method, "rewards", None) or []
    if not any(r.kind == "model" and r.model.startswith("run:") for r in rewards):
        return recipe
    resolved = recipe.model_copy(deep=True)
    for index, reward in enumerate(resolved.method.rewards):
        if reward.kind == "model" and reward.model.startswith("run:"):
            try:
                reward.model = store.resolve_model(reward.model)
            except UserError as exc:
                raise UserError(message=f"reward model {reward.model}: {exc.message}",
                                key=f"method.rewards.{index}.model", fix=exc.fix) from None
    return resolved


def reward_summary(rows: list[dict]) -> str | None:
    """`llmtui show`'s line for a grpo/rloo run, from its train rows: the total reward and each reward
    function's mean, first logged step -> last, and the completions' length."""
    scored = [r for r in rows if isinstance(r.get("reward"), (int, float))]
    if not scored:
        return None
    first, last = scored[0], scored[-1]
    names = [k[len("rewards/"):-len("/mean")] for k in last if k.startswith("rewards/") and k.endswith("/mean")]
    parts = [f"reward {first['reward']:.3f} -> {last['reward']:.3f}"]
    parts += [f"{n} {first.get(f'rewards/{n}/mean', float('nan')):.3f} -> {last[f'rewards/{n}/mean']:.3f}"
              for n in names if isinstance(last.get(f"rewards/{n}/mean"), (int, float))]
    length = last.get("completions/mean_length")
    if isinstance(length, (int, float)):
        clipped = last.get("completions/clipped_ratio")
        parts.append(f"length {length:.1f}" + (f" ({clipped:.0%} clipped)" if isinstance(clipped, (int, float))
                                                 else ""))
    if isinstance(last.get("kl"), (int, float)):
        parts.append(f"kl {last['kl']:.4f}")
    return " · ".join(parts)
