"""`llmtui export`: a run's final adapter alone, or merged into its base as a plain HF model."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from tuiapp.core.common import trainer_tools
from tuiapp.core.common.methods import is_full, is_reward_model, mergeable, peft_of
from tuiapp.trainer.models.model import final_info, keep_sentencepiece


def export(final: Path, out: Path, merge: bool) -> str:
    from tuiapp.trainer.pipeline import checkpoints as pipeline_checkpoints

    if pipeline_checkpoints.is_pipeline_folder(final):  # a pipeline run's checkpoint: one folder per stage
        pipeline_checkpoints.merge_checkpoint(final, out)
        return f"merged {len(pipeline_checkpoints.stage_folders(final))} pipeline stages of {final} into {out}"
    info = final_info(final)
    method = info.get("method", "sft")
    weights = info.get("weights", method)  # preference runs: sft (every weight) or their adapter's kind
    if not merge or is_full(weights):
        shutil.copytree(final, out, dirs_exist_ok=True)
        keep_sentencepiece(out, *vocabulary_sources(final))
        return f"copied the {'model' if is_full(weights) else 'adapter'} to {out}"
    if not mergeable(method):
        raise ValueError(f"a {method} adapter cannot be merged into its base weights; export without --merge")
    if peft_of(method) == "bottleneck":
        raise ValueError("bottleneck adapters add layers, so they cannot merge into a plain HF model; "
                         "export without --merge")
    import torch
    from peft import AutoPeftModelForCausalLM, AutoPeftModelForSequenceClassification

    if is_reward_model(method):  # the base gets its one-score value head back (peft saved it with the adapter)
        model = AutoPeftModelForSequenceClassification.from_pretrained(str(final), dtype=torch.float32, num_labels=1)
    else:
        model = AutoPeftModelForCausalLM.from_pretrained(str(final), dtype=torch.float32)
    merged = model.merge_and_unload()
    merged.save_pretrained(out)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(final)).save_pretrained(out)
    keep_sentencepiece(out, *vocabulary_sources(final))
    return f"merged the {method} adapter into {info.get('base_model')} and wrote {out}"


# ---------------------------------------------------------------- GGUF, Modelfile and parity

EXPORT_RECORD = "export.json"
MERGED_MIN_AGREEMENT = 0.9  # float32 merge: the same greedy answers, up to near-ties


def config_dir(final: Path) -> Path:
    """Where the model's config.json is: the folder itself, or the adapter's base."""
    if (final / "config.json").is_file():
        return final
    from tuiapp.trainer.models.bundled import resolve_model_path

    info = final_info(final)
    return Path(resolve_model_path(info.get("base_model") or "tiny"))


def vocabulary_sources(final: Path) -> list[Path]:
    """Where a SentencePiece tokenizer.model may be: the final folder, then its base (a run trained
    before final/ kept it has only the base's)."""
    from tuiapp.trainer.models.bundled import resolve_model_path

    base = final_info(final).get("base_model")
    return [final, config_dir(final), *([Path(resolve_model_path(base))] if base else [])]


def answers_as_adapter(final: Path) -> bool:
    """An adapter whose merge can be checked by its answers (a reward model scores, it does not answer)."""
    info = final_info(final)
    return not is_full(info.get("weights", info.get("method", "sft"))) and not is_reward_model(info.get("method"))


def merged_parity(final: Path, out: Path, prompts: list[str], system: str, cast_to: str | None = None):
    """The merged folder against the adapter on its base; with `cast_to`, before that cast (the
    report says so: the files shipped are the cast ones)."""
    from tuiapp.core.after.targets import model_target
    from tuiapp.trainer.tools import parity

    return parity.merged_vs_adapter(model_target(final.parent), out, prompts, system, min_agreement=MERGED_MIN_AGREEMENT,
                                    cast_to=cast_to)


def _run(argv: list[str], log: Path) -> None:
    import subprocess

    with open(log, "a", encoding="utf-8") as handle:
        handle.write(f"$ {' '.join(argv)}\n")
        handle.flush()
        code = subprocess.call(argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{Path(argv[2] if argv[1] == '-m' else argv[0]).name} failed (exit {code}); "
                           f"the last lines of {log}:\n{tail}")


GENERATION_TAG = re.compile(r"\{%-?\s*(?:end)?generation\s*-?%\}")


def gguf_template(tokenizer) -> str:
    """The chat template for the GGUF: the one training used (ChatML when the tokenizer has none),
    without transformers' {% generation %} markers, which llama.cpp's and Ollama's template
    engines do not know (a template with them fails to render there)."""
    from tuiapp.trainer.dataset.data import _template

    return GENERATION_TAG.sub("", _template(tokenizer))


def convert(hf_dir: Path, gguf_path: Path, outtype: str, tools: dict, tokenizer, fmt, log: Path) -> None:
    """One GGUF from the HF folder, with the turn's end token and the chat template in its metadata."""
    import tempfile

    from tuiapp.core.after import gguf_tools

    argv = trainer_tools.argv("gguf_convert", [tools["llama_cpp"]])
    pre = gguf_tools.pre_tokenizer_name(hf_dir)
    if pre:
        argv += ["--pre", pre]
    ends = [t for t in fmt.stops if t != tokenizer.eos_token]
    if ends:
        argv += ["--eot-id", str(tokenizer.convert_tokens_to_ids(ends[0]))]
    template_file = None
    template = gguf_template(tokenizer)
    if template != getattr(tokenizer, "chat_template", None):  # none of its own, or transformers-only tags
        template_file = Path(tempfile.mkstemp(suffix=".jinja")[1])
        template_file.write_text(template, encoding="utf-8")
        argv += ["--chat-template-file", str(template_file)]
    try:
        _run([*argv, "--", str(hf_dir), "--outfile", str(gguf_path), "--outtype", outtype], log)
    finally:
        if template_file:
            template_file.unlink(missing_ok=True)


def quantize(source: Path, target: Path, quant: str, tools: dict, log: Path) -> None:
    if tools.get("quantize") and tools["quantize"] != "llama-cpp-python":
        _run([tools["quantize"], str(source), str(target), quant.upper()], log)
        return
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant.upper()}")
    if llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama-cpp-python could not quantize {source.name} to {quant}")


def ship_gguf(out: Path, quants: list[str], tools: dict, recipe, prompts: list[str] | None, min_agreement: float,
              run_name: str) -> dict:
    """GGUF files for each quantization of the HF model in `out`, an Ollama Modelfile, and the
    parity of each GGUF with the HF model (when `prompts`)."""
    from tuiapp.core.after import modelfile
    from tuiapp.core.after.gguf_tools import DIRECT
    from tuiapp.trainer.models.model import load_tokenizer
    from tuiapp.trainer.tools import gguf, parity

    tokenizer = load_tokenizer(str(out), False)
    fmt = gguf.chat_format(tokenizer)
    log = out / "gguf-convert.log"
    files: dict[str, str] = {}
    intermediate = None
    for quant in quants:
        path = out / f"{run_name}-{quant}.gguf"
        if quant in DIRECT:
            convert(out, path, DIRECT[quant], tools, tokenizer, fmt, log)
        else:
            if intermediate is None:
                have = [out / f"{run_name}-{q}.gguf" for q in ("f32", "f16") if q in quants]
                intermediate = have[0] if have and have[0].exists() else out / f".{run_name}-f16.gguf"
                if not intermediate.exists():
                    convert(out, intermediate, "f16", tools, tokenizer, fmt, log)
            quantize(intermediate, path, quant, tools, log)
        files[quant] = path.name
        print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)", flush=True)
    if intermediate is not None and intermediate.name.startswith("."):
        intermediate.unlink(missing_ok=True)
    generate = recipe.generate.model_dump() if recipe is not None else {}
    text = modelfile.modelfile(f"./{files[quants[0]]}", fmt, generate,
                               comment=f"Ollama Modelfile written by llmtui for {run_name}\n"
                                       f"ollama create NAME -f {out / 'Modelfile'}")
    (out / "Modelfile").write_text(text, encoding="utf-8")
    print(f"wrote {out / 'Modelfile'} (FROM ./{files[quants[0]]}; stop {', '.join(fmt.stops)})", flush=True)
    reports = []
    if prompts:
        system = recipe.generate.system if recipe is not None else ""
        for quant in quants:
            report = parity.gguf_vs_hf(out / files[quant], out, prompts, system, min_agreement=min_agreement)
            reports.append({"quant": quant, **report.as_dict()})
            from tuiapp.core.after.parity import lines

            print("\n".join(lines(report)), flush=True)
    return {"gguf": files, "modelfile": "Modelfile", "stops": fmt.stops, "parity": reports, **tools}
