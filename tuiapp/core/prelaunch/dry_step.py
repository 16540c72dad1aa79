"""The dry step before launch: the recipe's method runs one real step on a shrunken copy of its model.

Rules written per family are always one family behind; running the thing is not. The torch side
(tuiapp.trainer.tools.dry) builds the model from its own config shrunk to a few layers and a small width,
applies the method through the trainer's own `train()` and takes one step on a few examples of the
recipe's data, in a child process (core.common.child_tool) with a time limit. Here it is decided
whether to run it, its verdict is cached and reported: a failure is a preflight error with the
trainer's own message, the architecture and the method.

The verdict is cached under the llmtui cache by the model's config, the method section, the other
recipe keys the step reads, and llmtui's version: a second launch of the same pair costs nothing.
LLMTUI_DRY_STEP=0 turns the step off; LLMTUI_DRY_TIMEOUT_S sets its limit (default 300 s).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections import deque
from importlib import metadata
from pathlib import Path

from tuiapp.core.common.built_folder import cache_root
from tuiapp.core.common.child_tool import ChildTool
from tuiapp.core.common.findings import Finding
from tuiapp.core.config.recipe import BUNDLED_MODEL, Recipe

DRY_VERSION = "3"
TOOL = "dry"  # trainer_tools.TOOLS
PLUGINS_ENV = "LLMTUI_TRAINER_PLUGINS"  # modules the child imports first (tuiapp.trainer.tools.dry)
LINE_PREFIX = "llmtui-dry "
CHILD_RUNS = {"count": 0}  # child processes started in this process (the tests read it)


def enabled() -> bool:
    return os.environ.get("LLMTUI_DRY_STEP", "1").strip().lower() not in ("0", "off", "no", "false")


def timeout_s() -> float:
    return float(os.environ.get("LLMTUI_DRY_TIMEOUT_S", "300"))


def _version() -> str:
    try:
        return metadata.version("llmtui")
    except metadata.PackageNotFoundError:
        return "unknown"


def cache_key(recipe: Recipe, config_bytes: bytes) -> str:
    """(config, method section, what else the step reads of the recipe, llmtui's version)."""
    data = recipe.model_dump(mode="json")
    train = data.get("train", {})
    parts = {
        "dry": DRY_VERSION, "llmtui": _version(), "config": hashlib.sha256(config_bytes).hexdigest(),
        "method": data.get("method"), "model": {k: v for k, v in data.get("model", {}).items() if k != "name"},
        "dataset": data.get("dataset"),
        "train": {k: train.get(k) for k in ("packing", "batching", "precision", "gradient_checkpointing",
                                            "liger_kernel", "torch_compile", "seed")},
        "strategy": data.get("launch", {}).get("strategy"), "plugins": os.environ.get(PLUGINS_ENV, ""),
        "cuda": os.environ.get("LLMTUI_FORCE_CPU", ""),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def cache_file(key: str) -> Path:
    return cache_root() / "dry" / f"{key}.json"


def _config_bytes(recipe: Recipe, base_dir: Path) -> bytes | None:
    from tuiapp.core.prelaunch import model_check

    if recipe.model.name == BUNDLED_MODEL:
        return BUNDLED_MODEL.encode()  # the bundled model is built from llmtui's code: its version keys it
    folder = model_check.model_folder(recipe.model.name, base_dir)
    if folder is None or (Path(recipe.model.name).expanduser().is_dir() and model_check.adapter_kind(
            Path(recipe.model.name).expanduser())):
        return None  # not here (the run downloads it), or an adapter folder
    try:
        return (folder / model_check.CONFIG_FILE).read_bytes()
    except OSError:
        return None


def run_child(recipes: list[Recipe], base_dir: Path, timeout: float | None = None) -> list[dict]:
    """The dry step of each recipe in one child process; each one's JSON verdict (a timed out or
    crashed child: {'error': why, 'transient': True} for those it did not answer)."""
    CHILD_RUNS["count"] += 1
    with tempfile.TemporaryDirectory(prefix="llmtui-dry-") as work:
        paths = []
        for index, recipe in enumerate(recipes):
            path = Path(work) / f"recipe-{index}.toml"
            path.write_text(recipe.to_toml(), encoding="utf-8")
            paths.append(str(path))
        tool = ChildTool(TOOL, [str(Path(work) / "work"), *paths], cwd=base_dir)  # data paths as the launch reads them
        lines: list[str] = []
        tail: deque[str] = deque(maxlen=20)  # the rest of its output: its last lines say why it ended
        limit = timeout if timeout is not None else timeout_s()
        timer = threading.Timer(limit, tool.cancel)
        timer.start()
        try:
            outcome = tool.run(lambda line: (lines if line.startswith(LINE_PREFIX) else tail).append(line))
        finally:
            timer.cancel()
    answers = {}
    for line in lines:
        row = json.loads(line[len(LINE_PREFIX):])
        answers[row["recipe"]] = row
    why = f"the dry step took over {limit:.0f}s" if outcome.cancelled else \
        f"the dry step's process ended (exit {outcome.code}): {(tail[-1] if tail else '').strip()[:300]}"
    return [answers.get(p, {"error": why, "transient": True}) for p in paths]


def verdict(recipe: Recipe, base_dir: Path) -> dict | None:
    """The cached or fresh verdict of the recipe's dry step; None where it does not apply."""
    return verdicts([recipe], base_dir)[0]


def cached(recipe: Recipe, base_dir: Path) -> tuple[Path | None, dict | None]:
    """(the verdict's cache file, the cached verdict or None): one file read, no child process;
    (None, None) where the step does not apply (the model's config is not here)."""
    config = _config_bytes(recipe, base_dir)
    if config is None:
        return None, None
    path = cache_file(cache_key(recipe, config))
    try:
        return path, {**json.loads(path.read_text(encoding="utf-8")), "cached": True}
    except (OSError, ValueError):
        return path, None


def verdicts(recipes: list[Recipe], base_dir: Path) -> list[dict | None]:
    """Each recipe's verdict: from the cache, else from one child process for all the others."""
    out: list[dict | None] = [None] * len(recipes)
    missing: list[tuple[int, Path]] = []
    for index, recipe in enumerate(recipes):
        path, out[index] = cached(recipe, base_dir)
        if path is not None and out[index] is None:
            missing.append((index, path))
    if not missing:
        return out
    answers = run_child([recipes[i] for i, _ in missing], base_dir)
    for (index, path), answer in zip(missing, answers, strict=True):
        out[index] = answer
        if not answer.get("transient"):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(answer), encoding="utf-8")
            os.replace(tmp, path)
    return out


# what `llmtui model --dry` steps each method on: the demo data its tiny preset reads
DEMO_DATA = {"pretrain": "demo:text", "dpo": "demo:prefs", "simpo": "demo:prefs", "cpo": "demo:prefs",
             "orpo": "demo:prefs", "reward": "demo:prefs", "kto": "demo:feedback"}


def method_recipe(name: str, kind: str) -> Recipe:
    """The recipe `llmtui model --dry` steps for a method on model `name`: its defaults, demo data."""
    return Recipe.model_validate({"model": {"name": name}, "method": {"kind": kind},
                                  "dataset": {"name": DEMO_DATA.get(kind, "demo:facts")},
                                  "train": {"max_seq_len": 128}})


# (a fragment of a trainer message, the method kinds it concerns or None for all, the fix): failures seen
# beyond the rules, for the families the rules have not met yet
KNOWN_FIXES = [
    ("lora_dropout != 0", None, "set dropout = 0 in the LoRA table (method, or method.adapter), or target_modules "
                                "to the attention linears only (peft adapts fused expert weights without dropout)"),
    ("Sizes of tensors must match", {"prefix"}, "use method.kind = 'prompt' or 'ptuning' (virtual tokens at the "
                                                "input), or 'lora': this attention layout does not take a prefix"),
    ("without its mask", None, "set train.packing = false"),
]


def known_fix(error: str, kind: str) -> str | None:
    return next((fix for fragment, kinds, fix in KNOWN_FIXES if fragment in error and (kinds is None or kind in kinds)),
                None)


def findings_of(answer: dict | None, recipe: Recipe, label: str) -> list[Finding]:
    """A verdict as preflight findings: an error with the trainer's message, or a note."""
    if answer is None:
        return []
    if answer.get("skipped"):
        return [Finding("info", "model.name", f"no dry step: {answer['skipped']}")]
    if answer.get("transient"):
        return [Finding("warning", "model.name", f"the dry step gave no verdict: {answer['error']}",
                        "LLMTUI_DRY_TIMEOUT_S gives it longer; LLMTUI_DRY_STEP=0 skips it")]
    if answer.get("ok"):
        return []
    kind = recipe.method.kind
    fix = answer.get("fix") or known_fix(answer.get("error", ""), kind) or ("not a known failure: choose another method (`llmtui model PATH --dry` "
                                "steps each one), or report it with this message")
    return [Finding("error", answer.get("key") or "method.kind",
                    f"{kind} on {label} failed its dry step (one training step on a shrunken copy of the model, "
                    f"before launch): {answer['error']}", fix)]


def state_of(answer: dict | None) -> str:
    """A verdict in a word: 'passed', 'failed', 'skipped', 'no verdict' (timed out or crashed), or
    'not run' (no verdict yet)."""
    if answer is None:
        return "not run"
    if answer.get("skipped"):
        return "skipped"
    if answer.get("transient"):
        return "no verdict"
    return "passed" if answer.get("ok") else "failed"


def dry_findings(recipe: Recipe, base_dir: Path, label: str | None = None) -> list[Finding]:
    """The dry step's findings for a launch ([] when off, when it does not apply, or when it passed)."""
    if not enabled():
        return []
    return findings_of(verdict(recipe, base_dir), recipe, label or recipe.model.name)
