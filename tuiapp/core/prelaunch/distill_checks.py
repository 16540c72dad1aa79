"""Pre-launch checks of method.kind = 'distill': the teacher is there and its config reads, the
teacher and the student share one tokenizer (same vocabulary size, same ids), and the setups the
distillation trainer does not take are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tuiapp.core.common.built_folder import cache_root
from tuiapp.core.common.errors import UserError
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import is_distill
from tuiapp.core.common.openai_http import EndpointError, request_json
from tuiapp.core.config.recipe import BUNDLED_MODEL, Recipe
from tuiapp.core.plan.distill import (
    BUNDLED_TEACHERS,
    STUDENT_NAME,
    TEACHER_KEY_ENVS,
    served_teacher,
    teacher_base_url,
    teacher_cache_size,
)
from tuiapp.core.plan.estimate import TINY_CONFIG, teacher_config
from tuiapp.core.prelaunch import model_check

KEY = "method.teacher"


def findings(recipe: Recipe, base_dir: Path | None = None) -> list[Finding]:
    """[] for any other method."""
    method = recipe.method
    if not is_distill(method.kind):
        return []
    out = _setup_rules(recipe)
    teacher = method.teacher
    if served_teacher(teacher):
        return out + served_findings(recipe, base_dir) + cache_disk_findings(recipe, base_dir)
    if teacher not in BUNDLED_TEACHERS:
        found = model_check.check_model(teacher, method_kind="sft", base_dir=base_dir, label=f"teacher '{teacher}'")
        out += [Finding(f.level, KEY, f.message, _teacher_fix(f.fix)) for f in found]
        if any(f.level == "error" for f in found):
            return out
    try:
        config = teacher_config(teacher, base_dir)
    except UserError as exc:
        return out + [Finding("error", KEY, f"the teacher's config cannot be read: {exc.message}",
                              "point method.teacher at a complete HF model folder (config.json, weights, tokenizer)")]
    out += vocabulary_findings(recipe.model.name, teacher, config, base_dir)
    return out + cache_disk_findings(recipe, base_dir)


def served_findings(recipe: Recipe, base_dir: Path | None = None) -> list[Finding]:
    """A teacher behind an OpenAI-compatible server: mode 'offline' only; the server answers, lists a
    model and gives prompt_logprobs of method.top_k; its tokenizer is compared with the student's
    when /v1/models names a folder this machine has (`llmtui serve` and vLLM give it as `root`)."""
    method = recipe.method
    url = teacher_base_url(method.teacher)
    if method.mode != "offline":
        return [Finding("error", "method.mode", "a served teacher gives its top-k log-probabilities (vLLM's "
                        "prompt_logprobs), not the full-vocabulary logits mode 'online' compares every step",
                        "set method.mode = 'offline', or point method.teacher at the model's folder")]
    try:
        listed = [m for m in request_json(url + "/models", key_envs=TEACHER_KEY_ENVS, timeout=10).get("data") or []
                  if isinstance(m, dict) and m.get("id")]
        if not listed:
            return [Finding("error", KEY, f"the teacher's server {url} lists no model", _served_fix(None))]
        probe = request_json(url + "/completions", {"model": listed[0]["id"], "prompt": [0, 0], "max_tokens": 1,
                                                    "temperature": 0, "prompt_logprobs": method.top_k},
                             key_envs=TEACHER_KEY_ENVS, timeout=60)
    except EndpointError as exc:
        if exc.status == 400 and "logprob" in exc.message:
            return [Finding("error", "method.top_k", f"the teacher's server {url} refuses top_k {method.top_k}: "
                            f"{exc.message}", "set a smaller method.top_k, or let the server give more (vLLM: "
                            "--max-logprobs)")]
        return [Finding("error", KEY, f"the teacher's server {url} {exc.message}", _served_fix(exc.status))]
    if not (probe.get("choices") or [{}])[0].get("prompt_logprobs"):
        return [Finding("error", KEY, f"the teacher's server {url} gives no prompt_logprobs (vLLM's extension of "
                        "/v1/completions), which the teacher's top-k is read from",
                        "serve the teacher with `llmtui serve` or vLLM")]
    root = str(listed[0].get("root") or "")
    if root and (Path(root).is_dir() or model_check.model_folder(root, base_dir) is not None):
        return vocabulary_findings(recipe.model.name, root, None, base_dir)
    return [Finding("warning", KEY, "the served teacher's tokenizer cannot be compared with the student's here "
                    "(its server names no model folder on this machine); the first example's tokens are "
                    "compared when its top-k is read", "")]


def _served_fix(status: int | None) -> str:
    if status in (401, 403):
        return f"set ${TEACHER_KEY_ENVS[0]} to the server's API key"
    return "start it (`llmtui serve RUN --port P`, or vLLM's server), or correct method.teacher"


def cache_disk_findings(recipe: Recipe, base_dir: Path | None = None, free_bytes: int | None = None) -> list[Finding]:
    """mode 'offline': an error naming method.top_k when the teacher's cached top-k (the estimate's
    figure, plan.distill.teacher_cache_size) would not fit the free disk at the cache folder."""
    size = teacher_cache_size(recipe, base_dir)
    if not size:
        return []
    if free_bytes is None:
        root = cache_root()
        while not root.exists() and root != root.parent:
            root = root.parent
        free_bytes = shutil.disk_usage(root).free
    if size["bytes"] <= free_bytes:
        return []
    return [Finding("error", "method.top_k", f"the teacher's cached top-k logits need about "
                    f"{size['bytes'] / 1e9:.1f} GB ({size['tokens']:,} tokens x top_k {recipe.method.top_k} x 8 bytes); "
                    f"{free_bytes / 1e9:.1f} GB is free at {cache_root()}",
                    "free disk space, set a smaller method.top_k or dataset.max_samples, point LLMTUI_CACHE "
                    "at a larger disk, or use mode = 'online'")]


def resolve_teacher(recipe: Recipe, store) -> Recipe:
    """A `run:NAME` teacher -> the final folder of the latest succeeded run named NAME (frozen so
    into the run's recipe, as model.name's); an error naming method.teacher when there is none."""
    method = recipe.method
    if not is_distill(method.kind) or not method.teacher.startswith("run:"):
        return recipe
    try:
        path = store.resolve_model(method.teacher)
    except UserError as exc:
        raise UserError(message=f"teacher {method.teacher}: {exc.message}", key=KEY,
                        fix=(exc.fix or "").replace("train that run first", "train that run first (its final "
                                                    "model is the teacher)")) from None
    resolved = recipe.model_copy(deep=True)
    resolved.method.teacher = path
    return resolved


def _teacher_fix(fix: str | None) -> str:
    """model_check's fix, said of method.teacher."""
    fix = (fix or "").replace("model.name", KEY).replace("or 'tiny'", "or 'tiny-teacher'")
    return fix if not fix or KEY in fix else f"set {KEY} to the teacher: {fix}"


def _setup_rules(recipe: Recipe) -> list[Finding]:
    out = []
    if recipe.train.packing is True:
        out.append(Finding("error", "train.packing", "distillation keeps one row per example (the teacher's "
                           "logits line up with its tokens)", "set train.packing = false or 'auto'"))
    if recipe.dataset.sources or recipe.dataset.streaming:
        key = "dataset.sources" if recipe.dataset.sources else "dataset.streaming"
        out.append(Finding("error", key, "distillation reads one tokenized dataset (the teacher's logits are "
                           "cached per example)", "use one dataset, not streamed"))
    if recipe.launch.strategy == "pipeline":
        out.append(Finding("error", "launch.strategy", "the pipeline strategy cuts the student into stages, "
                           "with no room for a teacher", "use launch.strategy = 'deepspeed', 'fsdp' or 'ddp'"))
    if recipe.train.sequence_parallel > 1:
        out.append(Finding("error", "train.sequence_parallel", "distillation compares whole sequences' logits "
                           "with the teacher's", "set train.sequence_parallel = 1"))
    method = recipe.method
    if method.mode == "online" and method.lmbda > 0 and recipe.launch.zero_stage == 3:
        out.append(Finding("error", "method.lmbda", "on-policy answers are generated by the student, whose "
                           "weights ZeRO-3 shards across the ranks", "set method.lmbda = 0, mode = 'offline', "
                           "or launch.zero_stage = 2"))
    return out


# ---- tokenizers


def _vocab(folder: Path) -> dict[str, int] | None:
    """token -> id of a folder's tokenizer.json (its model's vocabulary and added tokens); None when
    the folder holds none (a sentencepiece-only tokenizer: only the sizes are compared)."""
    try:
        data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, list):  # unigram: [[piece, score], ...], ids in order
        tokens = {piece[0]: index for index, piece in enumerate(vocab) if piece}
    elif isinstance(vocab, dict):
        tokens = dict(vocab)
    else:
        return None
    for added in data.get("added_tokens") or []:
        if isinstance(added, dict) and "content" in added and "id" in added:
            tokens[added["content"]] = added["id"]
    return tokens


def _bundled_tokenizer_folder() -> Path | None:
    """The built tiny model's folder (its tokenizer is the bundled one), when it was built already."""
    built = [p for p in (cache_root() / "models").glob("tiny-*") if (p / "tokenizer.json").is_file()
             and p.name.split("-")[1][:1].isdigit()]  # tiny-<version>-<hash>, not tiny-vlm or the teacher
    return max(built, key=lambda p: p.stat().st_mtime) if built else None


def _side(name: str, base_dir: Path | None, config: dict | None) -> tuple[str, int | None, dict[str, int] | None]:
    """(how to name it, the embedding's vocab_size, its tokenizer's token -> id map or None)."""
    if name in BUNDLED_TEACHERS or name in (BUNDLED_MODEL, STUDENT_NAME):
        folder = _bundled_tokenizer_folder()
        return "the bundled tiny tokenizer", TINY_CONFIG["vocab_size"], _vocab(folder) if folder else None
    folder = model_check.model_folder(name, base_dir)
    if config is None and folder is not None:
        try:
            config = json.loads((folder / model_check.CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            config = None
    size = (config or {}).get("vocab_size") or ((config or {}).get("text_config") or {}).get("vocab_size")
    return f"'{name}'", size, _vocab(folder) if folder is not None else None


def vocabulary_findings(student: str, teacher: str, teacher_cfg: dict | None,
                        base_dir: Path | None = None) -> list[Finding]:
    """An error naming method.teacher when the two tokenizers differ: another embedding size, another
    vocabulary size, or any token with another id (every token is compared: two dicts)."""
    if student in (*BUNDLED_TEACHERS, STUDENT_NAME) and teacher in BUNDLED_TEACHERS:
        return []  # one tokenizer by construction
    s_name, s_size, s_vocab = _side(student, base_dir, None)
    t_name, t_size, t_vocab = _side(teacher, base_dir, teacher_cfg)
    fix = ("use a teacher of the student's family (the same tokenizer, e.g. Qwen2.5-1.5B for Qwen2.5-0.5B), "
           "or set model.name to a student that shares the teacher's tokenizer")
    if s_size and t_size and s_size != t_size:
        return [Finding("error", KEY, f"the teacher {t_name} predicts over {t_size} tokens, the student "
                        f"{s_name} over {s_size}: their logits cannot be compared", fix)]
    if s_vocab is None or t_vocab is None:
        return [] if s_size and t_size else [Finding(
            "warning", KEY, "the teacher's and the student's tokenizers could not both be read; their ids "
            "are assumed to agree", "")]
    if len(s_vocab) != len(t_vocab):
        return [Finding("error", KEY, f"the teacher's tokenizer ({t_name}) has {len(t_vocab)} tokens, the "
                        f"student's ({s_name}) {len(s_vocab)}", fix)]
    differ = sorted((index, token) for token, index in s_vocab.items() if t_vocab.get(token) != index)
    if differ:
        index, token = differ[0]
        return [Finding("error", KEY, f"the teacher's tokenizer ({t_name}) gives the token {token!r} the id "
                        f"{t_vocab.get(token)}, the student's ({s_name}) {index} ({len(differ)} tokens differ): "
                        "not the same tokenizer", fix)]
    return []
