"""Greedy answers of an exported model and of the model it came from (tuiapp.core.after.parity compares
them): a merged folder vs the adapter on its base, both through transformers; a GGUF file through
llama-cpp-python vs the HF model it was converted from. Prompts are rendered by the chat template
the model trained with; llama.cpp tokenizes the rendered text with its own (converted) tokenizer,
as a deployed GGUF would, and a prompt that tokenizes differently is flagged."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tuiapp.core.after.parity import DEFAULT_PROMPTS, Answer, ParityReport, compare
from tuiapp.trainer.tools import inference

MAX_NEW_TOKENS = 32


def read_prompts(path: Path | None, recipe=None) -> list[str]:
    """A file's prompts (one per line, or JSON lines with "prompt"), else the recipe's
    train.sample_prompts, else a few general ones."""
    if path is not None:
        prompts = []
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line.startswith("{"):
                line = str(json.loads(line).get("prompt") or "").strip()
            if line:
                prompts.append(line)
        if not prompts:
            raise ValueError(f"{path} holds no prompts (one per line, or JSON lines with \"prompt\")")
        return prompts
    sample = list(getattr(getattr(recipe, "train", None), "sample_prompts", None) or [])
    return sample or list(DEFAULT_PROMPTS)


def prompt_text(tokenizer, prompt: str, system: str = "") -> str:
    return inference.prompt_text(tokenizer, inference.conversation([{"role": "user", "content": prompt}], system))


def hf_greedy(model, tokenizer, prompt: str, system: str = "", max_new: int = MAX_NEW_TOKENS) -> tuple[Answer, list]:
    """The greedy answer (ids through the stop token) and the prompt's ids."""
    enc = tokenizer(prompt_text(tokenizer, prompt, system), return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new, do_sample=False, temperature=None, top_p=None,
                             top_k=None, repetition_penalty=1.0, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=inference.stop_ids(model, tokenizer))
    ids = out[0, enc["input_ids"].shape[1]:].tolist()
    return _answer(tokenizer, ids), enc["input_ids"][0].tolist()


def _answer(tokenizer, ids: list[int]) -> Answer:
    return Answer(ids, [tokenizer.decode([i]) for i in ids], tokenizer.decode(ids, skip_special_tokens=True).strip())


def merged_vs_adapter(target, merged_dir: Path, prompts: list[str], system: str = "", trust: bool = False,
                      min_agreement: float = 1.0, cast_to: str | None = None) -> ParityReport:
    """The merged export against the run's adapter applied to its base (both float32); with
    `cast_to`, the merge is checked before that cast, and the report says so."""
    from transformers import AutoModelForCausalLM

    adapter, tokenizer = inference.load_target(target, trust)
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir), dtype=torch.float32, trust_remote_code=trust)
    adapter.eval()
    merged.eval()
    inference.cpu_threads(merged)
    before_cast = f", float32 before the cast to {cast_to}" if cast_to and cast_to != "float32" else ""
    report = ParityReport(reference=f"the {target.method} adapter on its base (transformers)",
                          exported=f"merged {Path(merged_dir).name}/ (transformers{before_cast})",
                          min_agreement=min_agreement)
    for prompt in prompts:
        reference, _ = hf_greedy(adapter, tokenizer, prompt, system)
        exported, _ = hf_greedy(merged, tokenizer, prompt, system)
        report.prompts.append(compare(prompt, reference, exported))
    return report


def gguf_vs_hf(gguf: Path, hf_dir: Path, prompts: list[str], system: str = "", trust: bool = False,
               min_agreement: float = 0.75) -> ParityReport:
    """The GGUF file through llama-cpp-python against the HF folder it was converted from."""
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM

    from tuiapp.trainer.models.model import load_tokenizer

    tokenizer = load_tokenizer(str(hf_dir), trust)
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, trust_remote_code=trust)
    model.eval()
    inference.cpu_threads(model)
    stops = set(inference.stop_ids(model, tokenizer))
    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=1, n_batch=512, verbose=False, seed=0)
    report = ParityReport(reference="transformers (the merged HF model)", exported=f"{Path(gguf).name} (llama.cpp)",
                          min_agreement=min_agreement)
    for prompt in prompts:
        reference, hf_prompt_ids = hf_greedy(model, tokenizer, prompt, system)
        text = prompt_text(tokenizer, prompt, system)
        tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        ids: list[int] = []
        llm.reset()
        for token in llm.generate(tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            ids.append(int(token))
            if token in stops or token == llm.token_eos() or len(ids) >= MAX_NEW_TOKENS:
                break
        report.prompts.append(compare(prompt, reference, _answer(tokenizer, ids), list(tokens) == hf_prompt_ids))
    del llm
    return report
