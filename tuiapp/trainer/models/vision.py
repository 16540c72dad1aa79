"""Vision-language models: the tiny offline ones, loading, what trains, and the image-chat collator.

Two tiny random-weight VLMs are built from real families' configs, with nothing downloaded:
'tiny-vlm' (Gemma 3: a SigLIP vision tower, pooled to 4 soft tokens per image) and 'tiny-llava'
(LLaVA: a CLIP vision tower, a projector and a Llama). Each is saved with a processor made here:
the family's image processor at 32x32 pixels, the bundled tokenizer extended with the image tokens,
and a ChatML template that renders an image part as the family's placeholder. A record's `<image>`
placeholders become those image parts, so the collator is the same for every family.

Training runs through AutoModelForImageTextToText and AutoProcessor. Labels are -100 everywhere but
the assistant's answers (through their <|im_end|>); image tokens are never trained. What trains is
the recipe's [vision] table (tuiapp.core.plan.vision_plan decides it): by default the vision tower is
frozen, a full fine-tune (sft) trains the projector and the language model, LoRA adds adapters to
the language model's linear layers only. A trained vision tower gets every weight (sft) or adapters
on its linear layers (LoRA); a trained projector trains whole (under LoRA as modules_to_save). Each
part's learning rate is an optimizer param group of its own (PartLearningRates).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from tuiapp.core.common.built_folder import build_once
from tuiapp.core.common.methods import has_magnitudes, is_full, is_quantized
from tuiapp.core.data.images import IMAGE_PLACEHOLDER
from tuiapp.core.data.tiny_vlm import TEXT_SHAPE, TINY_VLMS, VISION_SHAPE
from tuiapp.core.plan import vision_plan
from tuiapp.trainer.models.tiny import IM_END, IM_START, default_cache_dir, ensure_tiny_model

VISION_VERSION = "1"
MARKER = "llmtui_vlm.json"
SEED = 0
IGNORE = -100
IMAGE_SIZE = VISION_SHAPE["image_size"]  # pixels the tiny models' image processors resize to
_TEXT, _VISION = TEXT_SHAPE, VISION_SHAPE
# each family's image tokens (the placeholder an image part renders as comes first)
IMAGE_TOKENS = {"gemma3": ["<start_of_image>", "<image_soft_token>", "<end_of_image>"], "llava": ["<image>"]}
VISION_PARTS = ("vision_tower", "vision_model", "visual")  # the image encoder, frozen by default
PROJECTORS = ("multi_modal_projector", "merger", "connector", "mm_projector")  # image features -> text embeddings
LANGUAGE_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def chat_template(image_text: str) -> str:
    """ChatML whose image parts render as `image_text`; assistant turns inside {% generation %}."""
    return (
        "{%- for message in messages %}"
        "{{- '<|im_start|>' + message.role + '\\n' }}"
        "{%- if message.content is string %}{%- set parts = [{'type': 'text', 'text': message.content}] %}"
        "{%- else %}{%- set parts = message.content %}{%- endif %}"
        "{%- if message.role == 'assistant' %}{%- generation %}"
        "{%- for part in parts %}{{- part.text }}{%- endfor %}{{- '<|im_end|>' }}"
        "{%- endgeneration %}{{- '\\n' }}"
        "{%- else %}"
        "{%- for part in parts %}{%- if part.type == 'image' %}{{- '" + image_text + "' }}"
        "{%- else %}{{- part.text }}{%- endif %}{%- endfor %}{{- '<|im_end|>\\n' }}"
        "{%- endif %}"
        "{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )


def definition_version(name: str) -> str:
    family = TINY_VLMS[name]
    parts = [VISION_VERSION, SEED, family, _TEXT, _VISION, IMAGE_TOKENS[family], chat_template(IMAGE_TOKENS[family][0])]
    return VISION_VERSION + "-" + hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def ensure_tiny_vlm(name: str, cache_dir: Path | str | None = None) -> Path:
    """The folder of tiny VLM `name` (model, processor, tokenizer), built on first use, atomically."""
    target = Path(cache_dir or default_cache_dir()) / "models" / f"{name}-{definition_version(name)}"
    return build_once(target, lambda folder: _build(name, folder, cache_dir), lambda f: _is_complete(f, name))


def _is_complete(folder: Path, name: str) -> bool:
    try:
        return json.loads((folder / MARKER).read_text())["version"] == definition_version(name)
    except (OSError, ValueError, KeyError):
        return False


def _build(name: str, folder: Path, cache_dir) -> None:
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    family = TINY_VLMS[name]
    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model(cache_dir))
    tokenizer.add_tokens(IMAGE_TOKENS[family], special_tokens=True)
    template = chat_template(IMAGE_TOKENS[family][0])
    tokenizer.chat_template = template
    config, processor = (_gemma3 if family == "gemma3" else _llava)(tokenizer, template)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForImageTextToText.from_config(config)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    model.save_pretrained(folder, is_main_process=True)
    processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    (folder / MARKER).write_text(json.dumps({"version": definition_version(name), "family": family,
                                             "parameters": params}) + "\n")


def _ids(tokenizer) -> dict:
    return {"bos_token_id": tokenizer.eos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id}


def _gemma3(tokenizer, template: str):
    from transformers import (
        Gemma3Config,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    boi, image, eoi = IMAGE_TOKENS["gemma3"]
    tokenizer._set_model_specific_special_tokens(special_tokens={"boi_token": boi, "image_token": image,
                                                                 "eoi_token": eoi})
    text = Gemma3TextConfig(vocab_size=len(tokenizer), query_pre_attn_scalar=16, sliding_window=64, **_TEXT,
                            **_ids(tokenizer))
    tokens_per_image = 4  # the 4x4 patches pooled to 2x2
    config = Gemma3Config(text_config=text, vision_config=SiglipVisionConfig(**_VISION),
                          mm_tokens_per_image=tokens_per_image, image_token_index=tokenizer.convert_tokens_to_ids(image),
                          boi_token_index=tokenizer.convert_tokens_to_ids(boi),
                          eoi_token_index=tokenizer.convert_tokens_to_ids(eoi), **_ids(tokenizer))
    processor = Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}),
                                tokenizer=tokenizer, chat_template=template, image_seq_length=tokens_per_image)
    return config, processor


def _llava(tokenizer, template: str):
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaImageProcessorPil, LlavaProcessor

    (image,) = IMAGE_TOKENS["llava"]
    text = LlamaConfig(vocab_size=len(tokenizer), **_TEXT, **_ids(tokenizer))
    config = LlavaConfig(vision_config=CLIPVisionConfig(**_VISION, projection_dim=32), text_config=text,
                         image_token_index=tokenizer.convert_tokens_to_ids(image),
                         vision_feature_select_strategy="default", vision_feature_layer=-1,
                         projector_hidden_act="gelu", **_ids(tokenizer))
    image_processor = LlavaImageProcessorPil(size={"shortest_edge": IMAGE_SIZE},
                                             crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=_VISION["patch_size"],
                               vision_feature_select_strategy="default", chat_template=template, image_token=image,
                               num_additional_image_tokens=1)  # CLIP's class token
    return config, processor


# ---------------------------------------------------------------- resolving and loading


def resolve_vlm_path(name: str, cache_dir: Path | str | None = None) -> str | None:
    """A tiny VLM's folder for its name; None for other names."""
    return str(ensure_tiny_vlm(name, cache_dir)) if name in TINY_VLMS else None


def is_vision_model(path: str, trust_remote_code: bool = False) -> bool:
    """Whether the model (a folder, or a hub id in the HF cache) is a vision-language model: its
    config has a vision part."""
    if Path(path, "config.json").is_file():
        try:
            return "vision_config" in json.loads(Path(path, "config.json").read_text())
        except (OSError, ValueError):
            return False
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return False
    return getattr(config, "vision_config", None) is not None


def load_processor(path: str, trust_remote_code: bool = False):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)


def load_vision_model(recipe, path: str, precision: str):
    """The VLM to train, the parts [vision] leaves frozen frozen; a full fine-tune keeps fp32 master weights."""
    import torch
    from transformers import AutoModelForImageTextToText

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    if is_full(recipe.method.kind):
        dtype = torch.float32
    kwargs = {}
    if is_quantized(recipe.method.kind):  # the language model in 4 bits; the vision tower, projector and head as loaded
        import os

        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type=recipe.method.quant_type,
            bnb_4bit_use_double_quant=recipe.method.double_quant,
            bnb_4bit_compute_dtype=dtype if dtype != torch.float32 else torch.bfloat16,
            llm_int8_skip_modules=[*VISION_PARTS, *PROJECTORS, "lm_head"])
        kwargs["device_map"] = {"": int(os.environ.get("LOCAL_RANK", 0))}
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype,
                                                        trust_remote_code=recipe.model.trust_remote_code, **kwargs)
    model.config.use_cache = False
    if is_full(recipe.method.kind):
        freeze_parts(model, vision_plan.trained_parts(recipe))
    return model


def part_of(name: str) -> str:
    """The part a parameter or module belongs to: 'projector', 'vision_tower' or 'language_model'."""
    words = name.split(".")
    if any(word in PROJECTORS for word in words):
        return "projector"
    if any(word in VISION_PARTS for word in words):
        return "vision_tower"
    return "language_model"


def freeze_parts(model, trained: dict[str, bool]) -> int:
    """requires_grad off for every parameter of a part that does not train; returns how many tensors."""
    frozen = 0
    for name, param in model.named_parameters():
        if not trained[part_of(name)]:
            param.requires_grad_(False)
            frozen += 1
    return frozen


def lora_targets(target_modules) -> str:
    """peft's target regex: the named linear layers (by default every projection) of the language
    model and its output head; never the vision tower or the projector."""
    names = LANGUAGE_LINEAR if target_modules == "all-linear" else tuple(target_modules)
    return rf".*language_model.*\.({'|'.join(re.escape(n) for n in names)})|lm_head"


def adapter_modules(model, target_modules, trained: dict[str, bool], lm_head: bool = True) -> tuple[list[str], list[str]]:
    """(modules that get adapters, modules trained whole) under LoRA: the language model's named
    linear layers and its output head, every linear layer of a trained vision tower, and a trained
    projector whole (peft's modules_to_save)."""
    import torch

    language = re.compile(lora_targets(target_modules))
    targets, whole = [], []
    for name, module in model.named_modules():
        part = part_of(name)
        if part == "projector":
            if trained["projector"] and not any(w in PROJECTORS for w in name.split(".")[:-1]) \
                    and name.split(".")[-1] in PROJECTORS:
                whole.append(name)
            continue
        if not isinstance(module, torch.nn.Linear) or not trained[part]:
            continue
        if part == "vision_tower" or (language.fullmatch(name) and (lm_head or name.split(".")[-1] != "lm_head")):
            targets.append(name)
    return targets, whole


def apply_vision_method(model, recipe, lm_head: bool = True):
    """sft: the parts [vision] trains, every weight; lora (dora: weight-decomposed; qlora: over the
    language model in 4 bits): adapters on the language model's linear
    layers and its output head (which a random-weight tiny model needs to learn at all; not under
    DPO, whose log-probabilities read the head's weight directly: `lm_head=False`), on a trained
    vision tower's linear layers, and a trained projector whole."""
    if is_full(recipe.method.kind):
        return model
    import peft

    method = recipe.method
    trained = vision_plan.trained_parts(recipe)
    for param in model.parameters():
        param.requires_grad_(False)  # peft trains the adapters and modules_to_save only
    if is_quantized(method.kind):
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=recipe.train.gradient_checkpointing)
        for param in model.parameters():
            param.requires_grad_(False)
    targets, whole = adapter_modules(model, method.target_modules, trained, lm_head)
    config = peft.LoraConfig(r=method.rank, lora_alpha=method.alpha, lora_dropout=method.dropout,
                             target_modules=targets, modules_to_save=whole or None, use_dora=has_magnitudes(method.kind),
                             task_type=peft.TaskType.CAUSAL_LM)
    return peft.get_peft_model(model, config)


def part_param_lrs(model, recipe) -> dict[str, float]:
    """{parameter name: its part's learning rate} for every trainable parameter whose part has a
    learning rate other than train.learning_rate ({} when none has)."""
    lrs = vision_plan.part_lrs(recipe)
    base = recipe.train.learning_rate
    return {name: lrs[part_of(name)] for name, param in model.named_parameters()
            if param.requires_grad and lrs.get(part_of(name), base) != base}


class PartLearningRates:
    """Trainer mixin: parameters named in `part_lrs` move to optimizer param groups of their own
    learning rate (weight decay kept per group), which the schedule then scales like the rest."""

    part_lrs: dict[str, float] = {}

    def create_optimizer(self, *args, **kwargs):
        fresh = self.optimizer is None
        optimizer = super().create_optimizer(*args, **kwargs)
        if fresh and self.part_lrs:
            regroup(optimizer, self.model, self.part_lrs)
        return optimizer


def regroup(optimizer, model, part_lrs: dict[str, float]) -> None:
    """Split the optimizer's groups so each learning rate of `part_lrs` has groups of its own."""
    lr_of = {id(param): part_lrs[name] for name, param in model.named_parameters() if name in part_lrs}
    groups = []
    for group in optimizer.param_groups:
        by_lr: dict[float, list] = {}
        for param in group["params"]:
            by_lr.setdefault(lr_of.get(id(param), group["lr"]), []).append(param)
        ordered = sorted(by_lr.items(), key=lambda item: item[0] != group["lr"])  # train.learning_rate's first: logged
        groups += [{**group, "params": params, "lr": lr} for lr, params in ordered]
    optimizer.param_groups.clear()
    for group in groups:
        optimizer.add_param_group(group)


def apply_max_pixels(processor, max_pixels: int) -> None:
    """Caps the image processor's pixel budget (vision.max_pixels); a processor of one fixed size is
    refused, as the check before launch refuses it."""
    if not max_pixels:
        return
    from tuiapp.core.common.errors import RecipeError

    image_processor = processor.image_processor if hasattr(processor, "image_processor") else processor
    settings = {"image_processor_type": type(image_processor).__name__, "size": dict(image_processor.size or {})}
    problem = vision_plan.max_pixels_problem(settings, max_pixels)
    if problem:
        raise RecipeError(message=problem[0], key="vision.max_pixels", fix=problem[1])
    image_processor.size = {**settings["size"], "longest_edge": max_pixels}


# ---------------------------------------------------------------- data


def image_parts(text: str) -> list[dict]:
    """A turn's text as content parts, each `<image>` placeholder an image part."""
    parts = []
    for index, piece in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if index:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def conversation(messages: list[dict]) -> list[dict]:
    """Canonical turns as the processor's chat template takes them (tool_call turns as assistant)."""
    out = []
    for turn in messages:
        role = "assistant" if turn["role"] == "tool_call" else turn["role"]
        out.append({"role": role, "content": image_parts(turn["content"])})
    return out


def vision_datasets(recipe, base_dir=None, processor=None):
    """(train, eval or None) of raw image chats: {"messages": JSON text, "images": [paths]}; the first
    LENGTH_CHECKS records' lengths (image tokens included) checked against train.max_seq_len."""
    from datasets import Dataset

    from tuiapp.core.data.datasets import eval_fraction, load_records

    records = [{"messages": json.dumps(r["messages"]), "images": r.get("images", [])}
               for r in load_records(recipe.dataset, base_dir)]
    if processor is None:
        name = recipe.model.name
        path = str(ensure_tiny_vlm(name)) if name in TINY_VLMS else name
        processor = load_processor(path, recipe.model.trust_remote_code)
    check_lengths(records, VisionCollator(processor), recipe.train.max_seq_len, recipe.dataset.name)
    data = Dataset.from_list(records)
    fraction = eval_fraction(recipe.dataset)
    if not fraction or len(data) < 2:
        return data, None
    parts = data.train_test_split(test_size=fraction, seed=recipe.train.seed)
    return parts["train"], parts["test"]


LENGTH_CHECKS = 1000


def check_lengths(records: list[dict], collator, max_len: int, where: str) -> None:
    """A record longer than max_len tokens with its images is an error naming the record and the fixes
    (an image's tokens are never cut, and a record is never cut mid-image)."""
    over = [(index, length) for index, record in enumerate(records[:LENGTH_CHECKS])
            if (length := collator([record])["input_ids"].shape[1]) > max_len]
    if over:
        raise too_long(over[0][0] + 1, over[0][1], max_len, where, more=len(over) - 1,
                       need=max(length for _, length in over))


def too_long(number: int | None, length: int, max_len: int, where: str, more: int = 0, need: int = 0):
    from tuiapp.core.common.errors import DatasetError

    record = f"record {number}" if number else "an example"
    others = f" (and {more} more of the first {LENGTH_CHECKS})" if more else ""
    return DatasetError(message=f"{record}{others}: {length} tokens with its images, over train.max_seq_len "
                        f"({max_len}); image data is never truncated", file=where, key="train.max_seq_len",
                        fix=f"raise train.max_seq_len to {max(need, length)} or more, lower vision.max_pixels "
                        "(dynamic-resolution models), or drop the record from the data")


class VisionCollator:
    """Image chats → the processor's tensors (input_ids, attention_mask, pixel_values, ...) + labels."""

    def __init__(self, processor, max_len: int = 0):
        self.processor = processor
        self.max_len = max_len  # a longer example is an error, never cut (0 = no limit)
        tokenizer = processor.tokenizer
        self.answer_start, self.turn_end = answer_markers(processor)
        self.pad = tokenizer.pad_token_id
        self.image_ids = image_token_ids(processor)

    def __call__(self, features: list[dict]) -> dict:
        from PIL import Image

        texts, images = [], []
        for feature in features:
            messages = feature["messages"]
            messages = json.loads(messages) if isinstance(messages, str) else messages
            texts.append(self.processor.apply_chat_template(conversation(messages), tokenize=False))
            loaded = []
            for path in feature.get("images") or []:
                with Image.open(path) as image:
                    loaded.append(image.convert("RGB"))
            images.append(loaded)
        kwargs = {"images": images} if any(images) else {}
        batch = self.processor(text=texts, padding=True, return_tensors="pt", **kwargs)
        if self.max_len and batch["input_ids"].shape[1] > self.max_len:
            longest = int(batch["attention_mask"].sum(dim=1).max())
            if longest > self.max_len:
                raise too_long(None, longest, self.max_len, "the training data")
        batch["labels"] = answer_labels(batch["input_ids"], self.answer_start, self.turn_end, self.image_ids)
        if not (batch["labels"] != IGNORE).any():  # never train on nothing: the template's markers were not found
            opened = self.processor.tokenizer.decode(self.answer_start)
            raise ValueError(f"no answer token found in a batch of image chats: the chat template's assistant turn "
                             f"starts with {opened!r}, which is not in the rendered text; set dataset.template to "
                             "the model's template, or check the data has assistant turns")
        return dict(batch)


def answer_markers(processor) -> tuple[list[int], int]:
    """What opens an assistant turn (token ids) and the token that ends it, in the processor's own
    chat template: ChatML's `<|im_start|>assistant\\n` ... `<|im_end|>`, Gemma's `<start_of_turn>model\\n`
    ... `<end_of_turn>`, Llama 3's header ... `<|eot_id|>`. Found by rendering a probe chat: the
    generation prompt is the opener, the first token after the answer the end."""
    tokenizer = processor.tokenizer
    user = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    sentinel = "ANSWER_SENTINEL_7"
    answered = user + [{"role": "assistant", "content": [{"type": "text", "text": sentinel}]}]
    try:
        prompt = processor.apply_chat_template(user, tokenize=False, add_generation_prompt=False)
        opened = processor.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        full = processor.apply_chat_template(answered, tokenize=False)
    except Exception:  # a template that cannot render the probe: the ChatML markers the tiny VLMs use
        return tokenizer.encode(f"{IM_START}assistant\n", add_special_tokens=False), tokenizer.convert_tokens_to_ids(IM_END)
    opener = opened[len(prompt):] if opened.startswith(prompt) and len(opened) > len(prompt) else f"{IM_START}assistant\n"
    after = tokenizer.encode(full.split(sentinel, 1)[1], add_special_tokens=False) if sentinel in full else []
    end = after[0] if after else tokenizer.eos_token_id
    return tokenizer.encode(opener, add_special_tokens=False), end


def image_token_ids(processor) -> set[int]:
    """Ids of every added image token of the processor's tokenizer."""
    tokenizer = processor.tokenizer
    names = {t for tokens in IMAGE_TOKENS.values() for t in tokens}
    for attribute in ("image_token", "boi_token", "eoi_token"):
        value = getattr(processor, attribute, None) or getattr(tokenizer, attribute, None)
        if isinstance(value, str):
            names.add(value)
    vocab = tokenizer.get_vocab()
    return {vocab[name] for name in names if name in vocab}


def answer_labels(input_ids, answer_start: list[int], turn_end: int, image_ids: set[int]):
    """Labels: the token ids inside assistant turns (after `answer_start`, through `turn_end`),
    -100 elsewhere; image tokens always -100."""
    import torch

    labels = torch.full_like(input_ids, IGNORE)
    width = len(answer_start)
    for row, ids in enumerate(input_ids.tolist()):
        position = 0
        while position + width <= len(ids):
            if ids[position:position + width] != answer_start:
                position += 1
                continue
            start = end = position + width
            while end < len(ids) and ids[end] != turn_end:
                end += 1
            end = min(end + 1, len(ids))  # the end-of-turn token trains too
            labels[row, start:end] = input_ids[row, start:end]
            position = end
    for token in image_ids:
        labels[input_ids == token] = IGNORE
    return labels


def describe_trainable(model) -> str:
    """'N of M parameters train' with the vision tower's share, for the log."""
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    vision = sum(p.numel() for n, p in model.named_parameters()
                 if p.requires_grad and re.search(r"\b(vision_tower|vision_model)\b", n))
    return f"{trainable} of {total} parameters train ({vision} in the vision tower)"
