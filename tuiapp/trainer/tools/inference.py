"""A run's model for inference: loaded as it trained (a full model, or an adapter on its base),
prompted through the chat template it trained with, and answered with the run's generation
settings. Shared by the chat server (serve.py) and `llmtui eval` (evaluate.py)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, TextStreamer

from tuiapp.core.after.targets import Target
from tuiapp.core.common.errors import UserError
from tuiapp.core.config.frozen import frozen_recipe  # noqa: F401 (the trainer side reads it from here)
from tuiapp.core.config.recipe import GenerateSpec
from tuiapp.core.data.images import IMAGE_PLACEHOLDER
from tuiapp.core.plan.model_profile import LEARNED_POSITIONS
from tuiapp.core.prelaunch.model_check import adapter_kind
from tuiapp.trainer.dataset.data import _render, _template_messages
from tuiapp.trainer.models import bottleneck, vision
from tuiapp.trainer.models.bundled import resolve_model_path
from tuiapp.trainer.models.model import _merge_adapter_folder, load_tokenizer

CHATML_END = "<|im_end|>"


@dataclass
class Loaded:
    """A model ready to answer: which one, and how long it took to load."""

    name: str  # "tuned" or "base"
    label: str  # "final", "checkpoint-N", or the base's name
    model: object
    tokenizer: object
    load_s: float
    processor: object | None = None  # a vision-language model's: images and text in, tensors out


def _full_model(path: str, trust: bool):
    auto = AutoModelForImageTextToText if vision.is_vision_model(path, trust) else AutoModelForCausalLM
    return auto.from_pretrained(path, dtype=torch.float32, trust_remote_code=trust)


def _processor(path: str, base: str | None, trust: bool):
    """A vision-language model's processor (from the run's folder, else its base's); None for text models."""
    model_path = path if Path(path, "config.json").is_file() or not base else resolve_model_path(base)
    if not vision.is_vision_model(model_path, trust):
        return None
    folder = path if Path(path, "processor_config.json").is_file() or not base else resolve_model_path(base)
    return vision.load_processor(folder, trust)


def load_base(base: str, trust: bool = False) -> tuple[object, object]:
    """The base a run started from: 'tiny', a folder or a hub id; an earlier run's adapter folder
    is merged into its own base first, as the trainer did."""
    path = resolve_model_path(base)
    if adapter_kind(Path(path)):
        model = _merge_adapter_folder(path, torch.float32, trust)
    else:
        model = _full_model(path, trust)
    return model, load_tokenizer(path, trust)


def load_target(target: Target, trust: bool = False) -> tuple[object, object]:
    """The run's final model or checkpoint: a full model, or its adapter applied to its base."""
    if target.kind == "full":
        model = _full_model(target.path, trust)
    else:
        model, _ = load_base(target.base, trust)
        if target.kind == "bottleneck":
            model = bottleneck.load_bottleneck(model, target.path)
        else:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, target.path)
    return model, load_tokenizer(target.path, trust)


SMALL_MODEL = 50_000_000  # parameters


def cpu_threads(model) -> None:
    """One intra-op thread for a small model on CPU (unless OMP_NUM_THREADS says otherwise): its
    matrices are too small to share, and on a busy 2-core machine two threads that wait on each
    other were 15x slower than one (52 s vs 3.3 s for the loss of 260 short records)."""
    if torch.cuda.is_available() or os.environ.get("OMP_NUM_THREADS"):
        return
    if sum(p.numel() for p in model.parameters()) < SMALL_MODEL:
        torch.set_num_threads(1)


def _max_pixels(target: Target) -> int:
    """The run's vision.max_pixels (0: the processor's own size, also when the recipe is unreadable)."""
    try:
        return frozen_recipe(Path(target.run_dir)).vision.max_pixels
    except (OSError, ValueError, UserError):
        return 0


def load(name: str, target: Target, trust: bool = False) -> Loaded:
    """'tuned' (the target) or 'base' (what it trained from), in eval mode."""
    started = time.perf_counter()
    if name == "base":
        model, tokenizer = load_base(target.base, trust)
        label = Path(target.base).name if "/" in target.base else target.base
        processor = _processor(resolve_model_path(target.base), None, trust)
    else:
        model, tokenizer = load_target(target, trust)
        label = target.label
        processor = _processor(target.path, None if target.kind == "full" else target.base, trust)
    model.eval()
    cpu_threads(model)
    if processor is not None:
        vision.apply_max_pixels(processor, _max_pixels(target))  # the images as the run trained on them
        tokenizer = processor.tokenizer
    return Loaded(name, label, model, tokenizer, time.perf_counter() - started, processor)


def load_adapters(targets: list[Target], names: list[str], trust: bool = False) -> list[Loaded]:
    """Several runs' peft adapters on their one base (`llmtui serve RUN_A RUN_B`), the base loaded
    once: one PeftModel holding each run's adapter under its name in `names` (the first active;
    PeftModel.set_adapter picks another), and each run's own tokenizer and processor. The caller
    has checked that they share the base and are peft adapters of one kind
    (tuiapp.core.after.targets.check_shared_base)."""
    from peft import PeftModel

    started = time.perf_counter()
    base, _ = load_base(targets[0].base, trust)
    model = PeftModel.from_pretrained(base, targets[0].path, adapter_name=names[0])
    for target, name in zip(targets[1:], names[1:], strict=True):
        model.load_adapter(target.path, adapter_name=name)
    model.set_adapter(names[0])
    model.eval()
    cpu_threads(model)
    out = []
    for target in targets:
        tokenizer = load_tokenizer(target.path, trust)
        processor = _processor(target.path, target.base, trust)
        if processor is not None:
            vision.apply_max_pixels(processor, _max_pixels(target))
            tokenizer = processor.tokenizer
        out.append(Loaded("tuned", target.label, model, tokenizer, time.perf_counter() - started, processor))
    return out


# ---------------------------------------------------------------- prompting


def conversation(messages: list[dict], system: str = "") -> list[dict]:
    """The messages with the system prompt first (unless they bring their own)."""
    if system and not any(m.get("role") == "system" for m in messages):
        return [{"role": "system", "content": system}, *messages]
    return list(messages)


def with_images(messages: list[dict], images: list[str] | None = None) -> tuple[list[dict], list[str]]:
    """Turns and the image paths they show, in order: a turn's own `images` list becomes `<image>`
    placeholders in front of its text (unless the text has as many already); `images` given apart
    go with the placeholders the turns already have (a record of the data, as evaluation reads it)."""
    turns, paths = [], list(images or [])
    for message in messages:
        own = [str(p) for p in message.get("images") or []]
        content = str(message.get("content") or "")
        if own and content.count(IMAGE_PLACEHOLDER) < len(own):
            content = IMAGE_PLACEHOLDER * (len(own) - content.count(IMAGE_PLACEHOLDER)) + content
        paths += own
        turns.append({"role": message["role"], "content": content})
    return turns, paths


def vision_inputs(processor, messages: list[dict], images: list[str]) -> dict:
    """The processor's tensors for the conversation and its images, ending with the assistant's turn opened."""
    from PIL import Image

    placeholders = sum(str(m.get("content") or "").count(IMAGE_PLACEHOLDER) for m in messages)
    if placeholders != len(images):
        raise ValueError(f"{placeholders} '{IMAGE_PLACEHOLDER}' placeholder(s) but {len(images)} image(s)")
    loaded = []
    for path in images:
        if not Path(path).is_file():
            raise ValueError(f"image '{path}' does not exist")
        with Image.open(path) as image:
            loaded.append(image.convert("RGB"))
    text = processor.apply_chat_template(vision.conversation(messages), tokenize=False, add_generation_prompt=True)
    kwargs = {"images": [loaded]} if loaded else {}
    return dict(processor(text=[text], return_tensors="pt", **kwargs))


def prompt_text(tokenizer, messages: list[dict]) -> str:
    """The conversation rendered as in training (the tokenizer's template, else ChatML), ending
    with the assistant's turn opened."""
    return _render(tokenizer, _template_messages(messages, tokenizer), tokenize=False, add_generation_prompt=True)


def stop_ids(model, tokenizer) -> list[int]:
    """Every token that ends an answer: the generation config's, the tokenizer's eos, ChatML's end."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = list(ids) if isinstance(ids, (list, tuple)) else ([ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    end = tokenizer.convert_tokens_to_ids(CHATML_END) if CHATML_END in tokenizer.get_vocab() else None
    if end is not None:
        ids.append(end)
    return sorted(set(ids))


class _Stream(TextStreamer):
    """transformers' streamer, handing each finished piece of text to a callback."""

    def __init__(self, tokenizer, on_text: Callable[[str], None]):
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.on_text = on_text

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        if text:
            self.on_text(text)


def settings_kwargs(settings: GenerateSpec) -> dict:
    sample = settings.temperature > 0
    kwargs = {"max_new_tokens": settings.max_new_tokens, "do_sample": sample,
              "repetition_penalty": settings.repetition_penalty}
    if sample:
        kwargs.update(temperature=settings.temperature, top_p=settings.top_p)
    else:  # greedy: leave out what a model's generation_config may set for sampling
        kwargs.update(temperature=None, top_p=None, top_k=None)
    return kwargs


def generate(loaded: Loaded, messages: list[dict], settings: GenerateSpec,
             on_text: Callable[[str], None] | None = None, images: list[str] | None = None) -> dict:
    """One answer to the conversation: {text, tokens, seconds}; `on_text` gets it piece by piece.
    A turn's `images` (paths) and `images` given apart go to a vision-language model's processor."""
    model, tokenizer = loaded.model, loaded.tokenizer
    messages = conversation(messages, settings.system)
    turns, paths = with_images(messages, images)
    if loaded.processor is not None:
        enc = vision_inputs(loaded.processor, turns, paths)
    elif paths:
        raise ValueError(f"{loaded.label} reads text only; images need a vision-language model (e.g. tiny-vlm)")
    else:
        enc = tokenizer(prompt_text(tokenizer, messages), return_tensors="pt", add_special_tokens=False)
    device = next(model.parameters()).device
    enc = {k: v.to(device) for k, v in enc.items()}
    settings = _within_positions(model, settings, int(enc["input_ids"].shape[1]))
    streamer = _Stream(tokenizer, on_text) if on_text else None
    started = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**enc, **settings_kwargs(settings), streamer=streamer,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=stop_ids(model, tokenizer))
    new = out[0, enc["input_ids"].shape[1]:]
    answer = tokenizer.decode(new, skip_special_tokens=True)
    ended = bool(new.shape[0]) and int(new[-1]) in stop_ids(model, tokenizer)
    return {"text": answer.strip(), "tokens": int(new.shape[0]), "seconds": time.perf_counter() - started,
            "prompt_tokens": int(enc["input_ids"].shape[1]),
            "finish_reason": "stop" if ended or new.shape[0] < settings.max_new_tokens else "length"}


def _within_positions(model, settings: GenerateSpec, prompt_tokens: int) -> GenerateSpec:
    """max_new_tokens cut to the positions a learned position table has left (gpt2's n_positions...):
    past them generate() fails with IndexError. Rotary models go on past their context."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in LEARNED_POSITIONS:
        return settings
    limit = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    if not limit or prompt_tokens + settings.max_new_tokens <= limit:
        return settings
    if prompt_tokens >= limit:
        raise UserError(message=f"the conversation is {prompt_tokens} tokens, and the model reads at most "
                        f"{limit}", fix="start over (/reset in a chat) or send a shorter message")
    return settings.model_copy(update={"max_new_tokens": limit - prompt_tokens})
