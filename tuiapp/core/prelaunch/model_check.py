"""Is the recipe's base model there? Answered in seconds, before anything is launched.

- 'tiny' (the bundled model) is built on first use: always there.
- A local folder must hold what the trainer loads: a config (config.json), weights
  (*.safetensors / *.bin or their index) and a tokenizer. An adapter folder (an earlier run's
  final/ after lora, ia3, adapter...) holds the adapter's config and weights instead, and its
  base model must be there too. Pretraining starts from random weights: config + tokenizer.
- A hub id must be in the local Hugging Face cache (found through huggingface_hub's own cache
  API, as the trainer will find it), or, when the hub is allowed (HF_HUB_OFFLINE unset), the
  hub must answer a quick question about it.

huggingface_hub is imported inside the functions: `tuiapp.core` stays light to import.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tuiapp.core.common.errors import RunError
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import from_config, mergeable
from tuiapp.core.config.recipe import BUNDLED_MODEL, Recipe
from tuiapp.core.data.tiny_vlm import is_tiny_vlm
from tuiapp.core.plan.distill import STUDENT_NAME
from tuiapp.core.plan.estimate import adapter_base
from tuiapp.core.prelaunch.weights_check import weight_problems
from tuiapp.core.run_folder import rundir

HUB_TIMEOUT_S = float(os.environ.get("LLMTUI_HUB_TIMEOUT_S", "5"))
# the TUI form checks on every edit: ask the hub about a name once a minute at most (15 s when
# it did not answer, so that a network that comes back is seen soon)
HUB_ANSWER_TTL_S, HUB_SILENCE_TTL_S = 60.0, 15.0

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_SUFFIXES = (".safetensors", ".bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "vocab.txt", "spiece.model", "sentencepiece.bpe.model")
# What an earlier run's final/ holds for an adapter (written by tuiapp.trainer: peft's
# save_pretrained, or bottleneck.save_bottleneck for method 'adapter'), and its llmtui.json.
PEFT_CONFIG, PEFT_WEIGHTS = "adapter_config.json", ("adapter_model.safetensors", "adapter_model.bin")
BOTTLENECK_CONFIG, BOTTLENECK_WEIGHTS = "bottleneck_config.json", ("bottleneck_adapter.pt",)
FINAL_INFO = rundir.FINAL_INFO
TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class Problem:
    message: str
    fix: str


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as the trainer's processes will read it."""
    return any(os.environ.get(name, "").strip().lower() in TRUE for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


# ---------------------------------------------------------------- folders


def _names(folder: Path) -> set[str]:
    try:
        return {entry.name for entry in os.scandir(folder) if entry.is_file() or entry.is_symlink()}
    except OSError:
        return set()


def _has_weights(names: set[str]) -> bool:
    return any(n in WEIGHT_FILES or (n.endswith(WEIGHT_SUFFIXES) and not n.startswith(("adapter_model", "training_args")))
               for n in names)


def adapter_kind(folder: Path) -> str | None:
    """'peft' or 'bottleneck' when the folder is an adapter (an earlier run's final/), else None."""
    names = _names(folder)
    if PEFT_CONFIG in names:
        return "peft"
    if BOTTLENECK_CONFIG in names:
        return "bottleneck"
    return None


def folder_problems(folder: Path, *, needs_weights: bool = True, label: str | None = None) -> list[str]:
    """What the folder lacks for the trainer to load a full model from it ([] = nothing)."""
    names = _names(folder)
    label = label or str(folder)
    missing = []
    if CONFIG_FILE not in names:
        missing.append("a config (config.json)")
    if needs_weights and not _has_weights(names):
        missing.append("weights (*.safetensors, *.bin or their index .json)")
    if not names & set(TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.json, tokenizer_config.json or tokenizer.model)")
    problems = [f"{label} lacks {m}" for m in missing]
    if needs_weights and not problems:  # there: can they be read? (headers only, milliseconds)
        problems = weight_problems(folder, names)
    return problems


def _adapter_problems(folder: Path, kind: str, label: str) -> list[str]:
    names = _names(folder)
    weights = PEFT_WEIGHTS if kind == "peft" else BOTTLENECK_WEIGHTS
    out = []
    if not names & set(weights):
        out.append(f"{label} is an adapter folder without its weights ({' or '.join(weights)})")
    if not names & set(TOKENIZER_FILES):
        out.append(f"{label} lacks a tokenizer (tokenizer.json, tokenizer_config.json or tokenizer.model)")
    try:
        trained = json.loads((folder / FINAL_INFO).read_text(encoding="utf-8")).get("method")
    except (OSError, ValueError, AttributeError):
        trained = None
    if not mergeable(trained):  # see trainer.model._merge_adapter_folder
        out.append(f"{label} is a {trained} adapter, which cannot be merged into its base to train on")
    return out


# ---------------------------------------------------------------- hub ids


def cached_snapshot(repo_id: str, cache_dir: str | Path | None = None) -> Path | str | None:
    """The cached snapshot folder of `repo_id` at 'main' (the one the trainer loads); None when
    it is not cached, or the reason when huggingface_hub knows the snapshot is incomplete."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, IncompleteSnapshotError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True, cache_dir=cache_dir))
    except IncompleteSnapshotError:
        return "is only partly in the Hugging Face cache (an interrupted download?)"
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        return None


def is_repo_id(name: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


_hub_answers: dict[str, tuple[float, str | None]] = {}  # repo id -> (until, answer)


def ask_hub(repo_id: str, timeout: float = HUB_TIMEOUT_S) -> str | None:
    """None when the hub knows `repo_id`, else why not. Never waits much more than `timeout`."""
    cached = _hub_answers.get(repo_id)
    if cached and time.monotonic() < cached[0]:
        return cached[1]
    answer: list[str | None] = []

    def ask() -> None:
        from huggingface_hub import model_info
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        try:
            model_info(repo_id, timeout=timeout)
            answer.append(None)
        except GatedRepoError:
            answer.append("is gated: accept its license on huggingface.co and log in (`hf auth login`)")
        except RepositoryNotFoundError:
            answer.append("is not on the hub (or it is private and you are not logged in: `hf auth login`)")
        except Exception as exc:  # network down, DNS, proxy, hub error: all mean 'no answer'
            answer.append(f"could not be checked: the hub did not answer ({type(exc).__name__}: {exc})")

    worker = threading.Thread(target=ask, name="llmtui-hub-check", daemon=True)
    worker.start()
    worker.join(timeout + 1.0)  # DNS lookups ignore the HTTP timeout: never wait on them
    result = answer[0] if answer else f"could not be checked: the hub did not answer within {timeout:.0f}s"
    silent = bool(result) and "did not answer" in result
    _hub_answers[repo_id] = (time.monotonic() + (HUB_SILENCE_TTL_S if silent else HUB_ANSWER_TTL_S), result)
    return result


def _hub_fix(name: str) -> str:
    return (f"download it with `hf download {name}` (on a machine that reaches the hub, then copy the "
            "HF cache here), or set HF_HOME / HF_HUB_CACHE to the cache that holds it (HF_HUB_OFFLINE=1 "
            "when this machine has no internet), or point model.name at a local model folder")


# ---------------------------------------------------------------- the check


def check_model(name: str, *, method_kind: str = "lora", base_dir: Path | None = None,
                cache_dir: str | Path | None = None, offline: bool | None = None,
                label: str | None = None, allow_adapter: bool = True) -> list[Finding]:
    """Findings about model.name `name` ('run:NAME' already resolved to a folder); [] = fine."""
    if name in (BUNDLED_MODEL, STUDENT_NAME) or is_tiny_vlm(name):
        return []
    label = label or name
    needs_weights = not from_config(method_kind)  # pretraining builds the model from its config
    local = Path(name).expanduser()
    if base_dir is not None and not local.is_absolute():
        local = Path(base_dir) / local
    if local.is_dir():
        kind = adapter_kind(local) if allow_adapter and not from_config(method_kind) else None
        if not kind:
            problems = folder_problems(local, needs_weights=needs_weights, label=label)
            return [_error(problems, "point model.name at a complete HF model folder (save_pretrained "
                           "writes config.json, the weights and the tokenizer), or save or download the model again")] \
                if problems else []
        problems = _adapter_problems(local, kind, label)
        if problems:
            return [_error(problems, "continue from a run that finished with a complete final/ folder, "
                           "or start from its base model")]
        base = adapter_base(local)
        if not base:
            return [_error([f"{label} is an adapter folder that does not name its base model"],
                           "point model.name at the base model, or at a full model folder")]
        return check_model(base, method_kind=method_kind, base_dir=base_dir, cache_dir=cache_dir,
                           offline=offline, label=f"the base model '{base}' of adapter {label}",
                           allow_adapter=False)
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or not is_repo_id(name):
        return [_error([f"{label}: no such folder ({local})"],
                       "check the path (relative paths start at the folder you run llmtui in), or use a "
                       "hub id such as 'Qwen/Qwen2.5-0.5B', or 'tiny'")]
    snapshot = cached_snapshot(name, cache_dir)
    if isinstance(snapshot, Path):
        problems = folder_problems(snapshot, needs_weights=needs_weights, label=f"the cached copy of {label}")
    elif snapshot:
        problems = [f"{label} {snapshot} ({hub_cache(cache_dir)})"]
    else:
        problems = [f"{label} is neither a local folder nor in the Hugging Face cache ({hub_cache(cache_dir)})"]
    if not problems:
        return []
    offline = hub_offline() if offline is None else offline
    if offline:
        return [_error(problems + ["HF_HUB_OFFLINE is set, so the run cannot download it"], _hub_fix(name))]
    why = ask_hub(name)
    if why is None:
        return [Finding("info", "model.name", f"{problems[0]}: the run downloads it from the hub first")]
    return [_error(problems + [f"the hub was asked: '{name}' {why}"], _hub_fix(name))]


def hub_cache(cache_dir: str | Path | None = None) -> str:
    """The HF cache folder huggingface_hub uses (HF_HUB_CACHE, else HF_HOME/hub)."""
    if cache_dir is not None:
        return str(cache_dir)
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _error(problems: list[str], fix: str) -> Finding:
    return Finding("error", "model.name", "; ".join(problems), fix)


def model_findings(recipe: Recipe, base_dir: Path | None = None, *, label: str | None = None) -> list[Finding]:
    """check_model for a recipe whose 'run:NAME' reference is already resolved."""
    return check_model(recipe.model.name, method_kind=recipe.method.kind, base_dir=base_dir, label=label)


def model_folder(name: str, base_dir: Path | None = None, cache_dir: str | Path | None = None) -> Path | None:
    """The folder whose config and tokenizer describe model.name, when it is here: a local model
    folder, an adapter folder's base, or a hub id's cached snapshot. None for 'tiny' and the rest."""
    if name in (BUNDLED_MODEL, STUDENT_NAME) or is_tiny_vlm(name):
        return None
    local = Path(name).expanduser()
    if base_dir is not None and not local.is_absolute():
        local = Path(base_dir) / local
    if local.is_dir():
        if adapter_kind(local):
            base = adapter_base(local)
            return model_folder(base, base_dir, cache_dir) if base and base != name else None
        return local if CONFIG_FILE in _names(local) else None
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or not is_repo_id(name):
        return None
    snapshot = cached_snapshot(name, cache_dir)
    return snapshot if isinstance(snapshot, Path) and (snapshot / CONFIG_FILE).is_file() else None


def require_base(run_id: str, base: str, why: str, fix: str = "") -> None:
    """RunError when the run's base model was a local folder that is no longer there (moved or deleted):
    loading it would fail deep in transformers with a hub-id error."""
    path = Path(base).expanduser()
    if path.is_absolute() and not path.is_dir():
        raise RunError(message=f"{run_id}: the base model {why}, {base}, is no longer there",
                       fix="put the base model back at that path (or a link to it there)" + fix)
