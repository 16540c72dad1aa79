"""The dry step: one real training step of a recipe on a shrunken copy of its model, before launch.

    python -m tuiapp.trainer.tools.dry WORK_DIR RECIPE.toml [RECIPE.toml ...]

For each recipe: the model's own config, shrunk to a few layers and a small width (same class, same
attention and expert layout, same special layers; a model that is small already is kept as it is),
built with random weights beside its tokenizer; then the recipe, cut to one step on a few of its own
examples, goes through the trainer's own `train()` (tuiapp.trainer.run): the same loading, method,
packing, attention, preference wrapper and MoE settings as the launch. One JSON line per recipe:
{"recipe": ..., "ok": true} or {"recipe": ..., "ok": false, "error": "<the trainer's message>",
"fix": ...}, or {"skipped": why} where a dry step does not apply. Runs in a child process of core
(tuiapp.core.prelaunch.dry_step), which decides, caches and reports.

LLMTUI_TRAINER_PLUGINS (comma-separated module names) are imported first: a plugin may patch the
trainer's functions (the tests break a method's backward this way).
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import tomllib

from tuiapp.core.common.methods import trains_on_text
from tuiapp.core.run_folder.rundir import RunDir

PLUGINS_ENV = "LLMTUI_TRAINER_PLUGINS"
STEP_SAMPLES, STEP_SEQ_LEN = 8, 256
STEP_TEXT_SAMPLES = 64  # pretraining packs records into blocks: 8 short paragraphs may not fill one of 256
# a model at most this wide and deep is kept as it is (the tiny presets, the zoo)
SMALL_HIDDEN, SMALL_LAYERS = 256, 4
_WIDTH = {"hidden": 64, "heads": 4, "head_dim": 16, "intermediate": 128, "moe_intermediate": 32}
_SKIP_FILES = (".safetensors", ".bin", ".pt", ".gguf", ".index.json")


def _first(config, names):
    return next((n for n in names if isinstance(getattr(config, n, None), int)), None)


def shrink_config(config):
    """A copy of `config` a few layers deep and 64 wide, its layout kept: grouped or multi-query
    key/value heads, latent attention ranks, dense layers before the experts, layer types."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    width = _first(text, ("hidden_size", "n_embd", "d_model"))
    depth = _first(text, ("num_hidden_layers", "n_layer", "num_layers"))
    if width is None or depth is None or (getattr(text, width) <= SMALL_HIDDEN and getattr(text, depth) <= SMALL_LAYERS):
        return config
    config = copy.deepcopy(config)
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = min(getattr(c, depth), 2)
    setattr(c, depth, layers)
    setattr(c, width, _WIDTH["hidden"])
    heads_key = _first(c, ("num_attention_heads", "n_head", "num_heads"))
    if heads_key:
        heads = getattr(c, heads_key)
        kv_key = _first(c, ("num_key_value_heads", "num_kv_heads", "n_head_kv"))
        setattr(c, heads_key, _WIDTH["heads"])
        if kv_key:
            kv = getattr(c, kv_key)
            setattr(c, kv_key, _WIDTH["heads"] if kv >= heads else (1 if kv == 1 else 2))
    if isinstance(getattr(c, "head_dim", None), int) and "head_dim" in c.__dict__:  # not a derived property
        # latent attention (DeepSeek) ropes head_dim channels of each head: its rope part, shrunk below
        c.head_dim = 8 if isinstance(getattr(c, "qk_rope_head_dim", None), int) else _WIDTH["head_dim"]
    for key in ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim"):
        if isinstance(getattr(c, key, None), int):
            setattr(c, key, _WIDTH["intermediate"])
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
        if isinstance(getattr(c, key, None), int):
            setattr(c, key, _WIDTH["moe_intermediate"])
    for key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if isinstance(getattr(c, key, None), int):
            setattr(c, key, min(getattr(c, key), 4))
    for key in ("num_experts_per_tok", "top_k", "moe_topk"):
        if isinstance(getattr(c, key, None), int):
            setattr(c, key, min(getattr(c, key), 2))
    for key in ("n_group", "topk_group"):
        if isinstance(getattr(c, key, None), int):
            setattr(c, key, 1)
    if isinstance(getattr(c, "first_k_dense_replace", None), int):
        c.first_k_dense_replace = min(c.first_k_dense_replace, 1)  # one dense layer, one of experts
    for key, value in (("q_lora_rank", 32), ("kv_lora_rank", 16), ("qk_rope_head_dim", 8), ("qk_nope_head_dim", 8),
                       ("v_head_dim", 16), ("qk_head_dim", 16)):
        if isinstance(getattr(c, key, None), int):
            setattr(c, key, value)
    if isinstance(getattr(c, "layer_types", None), list):
        c.layer_types = c.layer_types[:layers]
    if isinstance(getattr(c, "mlp_only_layers", None), list):
        c.mlp_only_layers = [i for i in c.mlp_only_layers if i < layers]
    return config


def shrunk_model(path: str, folder: Path, trust_remote_code: bool) -> Path:
    """`folder`: the shrunk random-weight copy of the model at `path`, with its tokenizer files."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (folder / "config.json").exists():
        return folder
    building = folder.with_name(folder.name + f".{os.getpid()}.tmp")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    for item in Path(path).iterdir():
        if item.is_file() and not item.name.endswith(_SKIP_FILES) and item.name != "config.json":
            shutil.copy2(item, building / item.name)
    config = shrink_config(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    model.save_pretrained(building)
    os.replace(building, folder)
    return folder


def skip_reason(recipe, model_path: str) -> str | None:
    """Why a dry step does not apply to this recipe (None: it does)."""
    from tuiapp.core.common.methods import is_distill, is_quantized, is_rl

    if is_rl(recipe.method.kind):
        return f"{recipe.method.kind} generates completions while it trains: the dry step does not run it"
    if is_distill(recipe.method.kind):  # a shrunken student would still load the whole teacher
        return "distill runs a full teacher beside the student: the dry step does not run it"
    if is_quantized(recipe.method.kind):
        import torch

        if not torch.cuda.is_available():
            return "qlora needs a CUDA GPU (preflight says so on this machine)"
    if recipe.launch.strategy == "pipeline":
        return "the pipeline strategy splits the model over ranks: the dry step runs one process"
    folder = Path(model_path)
    if (folder / "adapter_config.json").exists() or (folder / "bottleneck_config.json").exists():
        return "model.name is an earlier run's adapter: its base model trained already"
    try:
        from tuiapp.trainer.models import vision

        if vision.is_vision_model(model_path):
            return "image models are not shrunk by the dry step"
    except Exception:  # noqa: BLE001 - not a vision model then
        pass
    return None


def step_recipe(data: dict, model_folder: Path) -> dict:
    """The recipe's TOML data cut to one step on a few examples of its own data, one process, no saves."""
    data = copy.deepcopy(data)
    data["name"] = "dry-step"
    data["model"] = {**data.get("model", {}), "name": str(model_folder)}
    dataset = data.setdefault("dataset", {})
    samples = STEP_TEXT_SAMPLES if trains_on_text((data.get("method") or {}).get("kind", "lora")) else STEP_SAMPLES
    dataset["max_samples"] = min(int(dataset.get("max_samples") or samples), samples)
    dataset["eval_split"] = 0
    for source in dataset.get("sources") or []:
        source["max_samples"] = min(int(source.get("max_samples") or samples), samples)
        source["eval_split"] = 0
    train = data.setdefault("train", {})
    micro = train.get("micro_batch", 2)
    train["grad_accum"] = 1
    train.update(max_steps=1, micro_batch=2 if micro == "auto" else min(int(micro), 2),
                 eval_steps=0, save_steps=0, sample_prompts=[], logging_steps=1, early_stopping_patience=0,
                 eval_on_start=False, max_seq_len=min(int(train.get("max_seq_len", STEP_SEQ_LEN)), STEP_SEQ_LEN),
                 report_to=[])
    if train.get("tokens_per_batch"):
        train["tokens_per_batch"] = max(train["max_seq_len"], 0)
    data["launch"] = {"gpus": 1}
    data.pop("sweep", None)
    return data


def dry_step(recipe_path: Path, work: Path) -> dict:
    """One recipe's verdict (the JSON line)."""
    import traceback

    from tuiapp.core.common.errors import UserError
    from tuiapp.core.config.recipe import parse_recipe, recipe_from_dict
    from tuiapp.trainer.models.bundled import resolve_model_path

    started = time.monotonic()
    out: dict = {"recipe": str(recipe_path)}
    recipe = parse_recipe(recipe_path.read_text(encoding="utf-8"), str(recipe_path))
    model_path = resolve_model_path(recipe.model.name)
    why = skip_reason(recipe, model_path)
    if why:
        return {**out, "skipped": why}
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path, trust_remote_code=recipe.model.trust_remote_code)
        small = shrink_config(config) is config
        folder = Path(model_path) if small else shrunk_model(
            model_path, work / "models" / Path(model_path).name, recipe.model.trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - the copy, not the recipe, failed: no verdict on the pair
        return {**out, "skipped": f"no shrunken copy of the model ({type(exc).__name__}: {exc})"[:400]}
    out["shrunk"] = not small
    run_dir = work / "runs" / recipe_path.stem
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    data = step_recipe(tomllib.loads(recipe.to_toml()), folder)
    RunDir(run_dir).recipe_toml.write_text(recipe_from_dict(data).to_toml(), encoding="utf-8")
    from accelerate.state import AcceleratorState

    from tuiapp.trainer.run import train

    AcceleratorState._reset_state(reset_partial_state=True)  # each recipe's Trainer makes its own Accelerator
    try:
        train(run_dir, resume=False)
        out["ok"] = True
    except UserError as exc:
        if exc.key == "train.max_seq_len" and recipe.train.max_seq_len > STEP_SEQ_LEN:
            # the step's shorter sequences cut every example's answer off: the recipe's own length is not judged
            return {**out, "skipped": f"its examples' answers start past the dry step's {STEP_SEQ_LEN} tokens",
                    "seconds": round(time.monotonic() - started, 2)}
        out.update(ok=False, error=exc.message, key=exc.key, fix=exc.fix or None)
    except BaseException as exc:  # noqa: BLE001 - every failure of the step is the verdict
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}".strip()[:1200],
                   where=traceback.format_exc().strip().splitlines()[-3:-1])
    out["seconds"] = round(time.monotonic() - started, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    work = Path(args[0])
    work.mkdir(parents=True, exist_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for name in filter(None, os.environ.get(PLUGINS_ENV, "").split(",")):
        importlib.import_module(name.strip())
    for path in args[1:]:
        print("llmtui-dry " + json.dumps(dry_step(Path(path), work)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
