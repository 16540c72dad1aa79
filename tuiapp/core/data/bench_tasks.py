"""Benchmark tasks as a recipe or `llmtui eval --benchmark` names them, for lm-evaluation-harness:

- a name from lm-eval's registry (hellaswag, arc_easy...): its data must already be in the local
  datasets cache, since nothing is downloaded;
- the path of a task YAML of the user's (over local files: `dataset_path: json` with
  `dataset_kwargs: {data_files: ...}`); lm-eval reads the YAML's folder as an include path;
- demo:facts-mc, the demo task: multiple choice over the demo facts in their held-out phrasings
  (the right answer and three of the same kind), made here as a JSONL and a task YAML in
  $LLMTUI_CACHE/bench/ (so the tiny presets exercise benchmarks offline).

Pure: nothing here imports lm_eval (the trainer does); the checks before launch read files only."""

from __future__ import annotations

import importlib.util
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from tuiapp.core.common.built_folder import cache_root
from tuiapp.core.common.errors import UserError
from tuiapp.core.data.demo_data import DEMO_VERSION, HELD_OUT, PHRASINGS, _facts, _fill

DEMO_TASK = "demo:facts-mc"
DEMO_TASK_NAME = "llmtui_facts_mc"  # its name inside lm-eval (and in metrics: bench/llmtui_facts_mc/acc)
CHOICES = 4
INSTALL_FIX = "pip install 'lm-eval==0.4.13' (it comes with llmtui; a bare environment may lack it)"
TASK_LINE = re.compile(r"^task:\s*['\"]?([^'\"\s#]+)", re.MULTILINE)


@dataclass(frozen=True)
class Task:
    spec: str  # as the user wrote it
    name: str  # lm-eval's task name
    include: str | None = None  # a folder lm-eval reads task YAMLs from (None: the registry)


def lm_eval_installed() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


def demo_records() -> list[dict]:
    """One multiple-choice question per fact, in its held-out phrasing: the answer sentence and
    three of the same kind (other facts' values in its place), shuffled with a fixed seed."""
    rng = random.Random(7)
    facts = _facts()
    by_topic: dict[str, list] = {}
    for fact in facts:
        by_topic.setdefault(fact.topic, []).append(fact)
    out = []
    for fact in facts:
        others = sorted({f.value for f in by_topic[fact.topic] if f.value != fact.value})
        if len(others) < CHOICES - 1:
            continue
        wrong = [fact.with_value(value) for value in rng.sample(others, CHOICES - 1)]
        choices = [fact.answer, *wrong]
        rng.shuffle(choices)
        instruction, _ = PHRASINGS[fact.topic][-HELD_OUT]
        out.append({"question": _fill(instruction, fact), "choices": choices, "answer": choices.index(fact.answer)})
    return out


DEMO_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: {version}
"""


def demo_task_folder(root: Path | None = None) -> Path:
    """The demo task's folder (its YAML and JSONL), made once in the cache."""
    folder = (Path(root) if root is not None else cache_root()) / "bench" / f"facts-mc-v{DEMO_VERSION}"
    yaml_path = folder / f"{DEMO_TASK_NAME}.yaml"
    if yaml_path.is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "facts_mc.jsonl"
    tmp = data.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in demo_records()), encoding="utf-8")
    tmp.replace(data)
    tmp = yaml_path.with_suffix(".tmp")
    tmp.write_text(DEMO_YAML.format(name=DEMO_TASK_NAME, data=json.dumps(str(data)), version=float(DEMO_VERSION)),
                   encoding="utf-8")
    tmp.replace(yaml_path)
    return folder


def is_yaml(spec: str) -> bool:
    return spec.strip().lower().endswith((".yaml", ".yml"))


def resolve(spec: str, base_dir: Path | None = None, key: str = "eval.benchmarks.task") -> Task:
    """The lm-eval task a name stands for; UserError (naming `key`) when a YAML is missing or has
    no `task:` line. Registry names are taken as they are (the harness checks them when it starts)."""
    spec = spec.strip()
    if spec == DEMO_TASK:
        return Task(spec, DEMO_TASK_NAME, str(demo_task_folder()))
    if spec.startswith("demo:"):
        raise UserError(message=f"unknown demo benchmark '{spec}'", key=key, fix=f"use {DEMO_TASK}")
    if is_yaml(spec):
        path = Path(spec).expanduser()
        if not path.is_absolute():
            path = (Path(base_dir) if base_dir is not None else Path.cwd()) / path
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise UserError(message=f"task YAML not found: {path}", key=key, file=str(path),
                            fix="give the path of an lm-eval task YAML (relative paths start at the launch "
                            "folder)") from None
        found = TASK_LINE.search(text)
        if not found:
            raise UserError(message="the task YAML names no task", key=key, file=str(path),
                            fix="add a line `task: my_task` (lm-eval's task YAML format)")
        return Task(spec, found.group(1), str(path.parent.resolve()))
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", spec):
        raise UserError(message=f"'{spec}' is not an lm-eval task name or a task YAML", key=key,
                        fix=f"a registry name such as arc_easy, a path ending in .yaml, or {DEMO_TASK}")
    return Task(spec, spec)


def require_harness(what: str = "benchmarks") -> None:
    if not lm_eval_installed():
        raise UserError(message=f"{what} need lm-evaluation-harness (the lm-eval package), which is not installed",
                        fix=INSTALL_FIX)
