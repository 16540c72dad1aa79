"""The bundled distillation student 'tiny-student' (core.plan.distill.STUDENT_NAME): the tiny model's
architecture at half the layers and half the width (student_config), random weights, and the tiny
model's own tokenizer files, so that its ids are the teacher's. Built once per cache dir and
tiny-model version, like the tiny model."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tuiapp.core.common.built_folder import build_once
from tuiapp.core.plan.distill import STUDENT_CHANGES, STUDENT_NAME, student_config
from tuiapp.core.plan.estimate import TINY_CONFIG
from tuiapp.trainer.models.tiny import MARKER, default_cache_dir, ensure_tiny_model

SEED = 2
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def ensure_tiny_student(cache_dir: Path | str | None = None) -> Path:
    """The bundled student's HF folder, built on first use."""
    tiny = ensure_tiny_model(cache_dir)
    version = hashlib.sha256(json.dumps([tiny.name, STUDENT_CHANGES, SEED], sort_keys=True).encode()).hexdigest()[:10]
    target = Path(cache_dir or default_cache_dir()) / "models" / f"{STUDENT_NAME}-{version}"

    def build(folder: Path) -> None:
        import torch
        from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

        shape = {k: v for k, v in student_config(TINY_CONFIG).items() if k not in ("architectures", "model_type")}
        tiny_config = json.loads((tiny / "config.json").read_text())
        ids = {k: tiny_config.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        config = LlamaConfig(**shape, **ids)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            model = LlamaForCausalLM(config)
        # generate() stops at the end of a chat turn too, as the tiny model's does
        model.generation_config = GenerationConfig.from_pretrained(tiny)
        model.save_pretrained(folder, is_main_process=True)
        for name in TOKENIZER_FILES:  # the very same tokenizer: one set of ids with the teacher
            if (tiny / name).is_file():
                shutil.copy(tiny / name, folder / name)
        (folder / MARKER).write_text(json.dumps({"version": version, "student_of": tiny.name}) + "\n")

    def complete(folder: Path) -> bool:
        try:
            return json.loads((folder / MARKER).read_text())["version"] == version
        except (OSError, ValueError, KeyError):
            return False

    return build_once(target, build, complete)
