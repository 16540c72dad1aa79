"""`llmtui export`: a run's final adapter alone, or merged into its base as a plain HF model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tuiapp.trainer.model import FINAL_INFO, PROMPT_LEARNING


def export(final: Path, out: Path, merge: bool) -> str:
    from tuiapp.trainer import pipeline_checkpoints

    if pipeline_checkpoints.is_pipeline_folder(final):  # a pipeline run's checkpoint: one folder per stage
        pipeline_checkpoints.merge_checkpoint(final, out)
        return f"merged {len(pipeline_checkpoints.stage_folders(final))} pipeline stages of {final} into {out}"
    info = json.loads((final / FINAL_INFO).read_text()) if (final / FINAL_INFO).exists() else {}
    method = info.get("method", "sft")
    weights = info.get("weights", method)  # preference runs: sft (every weight) or their adapter's kind
    if not merge or weights in ("pretrain", "sft"):
        shutil.copytree(final, out, dirs_exist_ok=True)
        return f"copied the {'model' if weights in ('pretrain', 'sft') else 'adapter'} to {out}"
    if method in PROMPT_LEARNING or method == "llama-adapter":
        raise ValueError(f"a {method} adapter cannot be merged into its base weights; export without --merge")
    if method == "adapter":
        raise ValueError("bottleneck adapters add layers, so they cannot merge into a plain HF model; "
                         "export without --merge")
    import torch
    from peft import AutoPeftModelForCausalLM, AutoPeftModelForSequenceClassification

    if method == "reward":  # the base gets its one-score value head back (peft saved it with the adapter)
        model = AutoPeftModelForSequenceClassification.from_pretrained(str(final), dtype=torch.float32, num_labels=1)
    else:
        model = AutoPeftModelForCausalLM.from_pretrained(str(final), dtype=torch.float32)
    merged = model.merge_and_unload()
    merged.save_pretrained(out)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(final)).save_pretrained(out)
    return f"merged the {method} adapter into {info.get('base_model')} and wrote {out}"
