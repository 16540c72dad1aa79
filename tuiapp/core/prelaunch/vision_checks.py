"""What a recipe on image data must hold before launch: a vision-language model, a method that trains
image chats, no packing, something that trains ([vision]), a max_pixels the image processor can take,
and records whose image tokens and text fit train.max_seq_len (an image's tokens are never cut)."""

from __future__ import annotations

import itertools
from pathlib import Path

from tuiapp.core.common.errors import UserError
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import METHODS, VISION_FULL_KINDS, VISION_KINDS, is_lora, is_preference, is_quantized
from tuiapp.core.config.recipe import BUNDLED_MODEL, Recipe, VisionSpec, weights_method
from tuiapp.core.data import datasets, images, tiny_vlm
from tuiapp.core.data.datasets import DatasetInfo
from tuiapp.core.plan import estimate, vision_plan
from tuiapp.core.prelaunch import model_check, preference

LENGTH_CHECKS = 1000  # records whose length is checked before launch (the trainer checks as many, exactly)
TINY_PROCESSORS = {"gemma3": "Gemma3ImageProcessor", "llava": "LlavaImageProcessor"}


def is_vision_model(name: str, base_dir: Path | None = None) -> bool | None:
    """Whether model.name is a vision-language model (its config has a vision part); None when its
    config cannot be read here."""
    if tiny_vlm.is_tiny_vlm(name):
        return True
    if name == BUNDLED_MODEL:
        return False
    try:
        config = estimate.load_model_config(name, base_dir)
    except UserError:
        return None
    return "vision_config" in config


def data_findings(recipe: Recipe, info: DatasetInfo, base_dir: Path | None = None) -> list[Finding]:
    """Findings for a dataset whose records carry images (their files were checked as it was read)."""
    findings = []
    carried = f"{info.with_images} record(s) of {info.source} carry images"
    if is_vision_model(recipe.model.name, base_dir) is False:
        findings.append(Finding("error", "model.name", f"'{recipe.model.name}' is not a vision-language model "
                                f"({carried})", "use a vision-language model, e.g. model.name = 'tiny-vlm' offline, "
                                "or data without images"))
    if not METHODS[recipe.method.kind].vision:
        findings.append(Finding("error", "method.kind", f"method '{recipe.method.kind}' does not train on images yet "
                                f"({carried})", f"set method.kind to one of: {', '.join(VISION_KINDS)}"))
    if recipe.train.packing is True:
        findings.append(Finding("error", "train.packing", "packing would mix one example's image tokens with "
                                "another's; image data is never packed", "set train.packing = false"))
    elif recipe.train.packing == "auto":
        findings.append(Finding("info", "train.packing", "image data: batches are padded, not packed", ""))
    if info.kind and (is_preference(recipe.method.kind) or info.kind in ("pairs", "unpaired")):
        findings += preference.data_findings(recipe, info.kind, info.source)  # pairs for dpo, chats for sft
    findings += part_findings(recipe)
    config, processor = _model_config(recipe.model.name, base_dir), processor_config(recipe.model.name, base_dir)
    problem = vision_plan.max_pixels_problem(processor, recipe.vision.max_pixels)
    if problem:
        findings.append(Finding("error", "vision.max_pixels", *problem))
    elif config is not None and not any(f.level == "error" for f in findings):
        findings += length_findings(recipe, config, processor, base_dir)
    return findings


# a mixture on a vision-language model: message and fix (preflight's finding, and the rank's error)
MIXTURE_REFUSED = ("a mixture ([[dataset.sources]]) trains text and chats, not a vision-language model's image "
                   "chats", "use one image dataset (dataset.name), or a text model")


def mixture_findings(recipe: Recipe, base_dir: Path | None = None) -> list[Finding]:
    """A mixture ([[dataset.sources]]) trains text and chats: a vision-language model is refused
    here, before launch (its rank would refuse the same)."""
    if not recipe.dataset.sources or not is_vision_model(recipe.model.name, base_dir):
        return []
    return [Finding("error", "dataset.sources", *MIXTURE_REFUSED)]


def unused_findings(recipe: Recipe, base_dir: Path | None = None) -> list[Finding]:
    """A [vision] table set for a model without a vision part does nothing: said as a warning."""
    if recipe.vision == VisionSpec() or is_vision_model(recipe.model.name, base_dir) is not False:
        return []
    keys = ", ".join(f"vision.{key}" for key in sorted(recipe.vision.model_fields_set))
    return [Finding("warning", "vision", f"'{recipe.model.name}' is not a vision-language model, so {keys or '[vision]'} "
                    "changes nothing", "remove the [vision] table, or use a vision-language model")]


def part_findings(recipe: Recipe) -> list[Finding]:
    """Something trains; a learning rate set for a frozen part is said to do nothing."""
    parts = vision_plan.trained_parts(recipe)
    findings = []
    if not any(parts.values()):
        findings.append(Finding("error", "vision.train_language_model", "nothing would train: the language model, "
                                "the projector and the vision tower are all frozen",
                                "set vision.train_language_model, vision.train_projector or "
                                "vision.train_vision_tower to true"))
    elif weights_method(recipe.method).kind not in VISION_FULL_KINDS and \
            not (parts["language_model"] or parts["vision_tower"]):
        findings.append(Finding("error", "vision.train_language_model", f"{recipe.method.kind} needs a part to put "
                                "adapters on, but the language model and the vision tower are both frozen",
                                "set vision.train_language_model (or train_vision_tower) = true, or method.kind = "
                                "'sft' to train the projector alone"))
    adapter = getattr(recipe.method, "adapter", None)
    if adapter is not None and (not is_lora(adapter.kind) or is_quantized(adapter.kind)):
        findings.append(Finding("error", "method.adapter.kind", f"a {adapter.kind} adapter does not train on image "
                                "pairs yet", "set [method.adapter] kind = 'lora' or 'dora', or leave the table out to "
                                "train every weight"))
    for part, key in (("projector", "projector_lr"), ("vision_tower", "vision_tower_lr")):
        if getattr(recipe.vision, key) and not parts[part]:
            findings.append(Finding("warning", f"vision.{key}", f"the {part.replace('_', ' ')} is frozen, so its "
                                    "learning rate is not used", f"set vision.train_{part} = true, or remove "
                                    f"vision.{key}"))
    return findings


def _turns(record: dict) -> list[dict]:
    """A record's turns as one sequence: a chat's, or a pair's prompt with its longer answer."""
    if "messages" in record:
        return record["messages"]
    answers = [record.get("chosen") or [], record.get("rejected") or []]
    return (record.get("prompt") or []) + max(answers, key=vision_plan.text_tokens_at_least)


def _model_config(name: str, base_dir: Path | None) -> dict | None:
    if tiny_vlm.is_tiny_vlm(name):
        return {"model_type": tiny_vlm.TINY_VLMS[name]}
    try:
        return estimate.load_model_config(name, base_dir)
    except UserError:
        return None


def processor_config(name: str, base_dir: Path | None = None) -> dict:
    """The model's image processor settings ({} when they cannot be read here)."""
    if tiny_vlm.is_tiny_vlm(name):
        side = tiny_vlm.VISION_SHAPE["image_size"]
        return {"image_processor_type": TINY_PROCESSORS[tiny_vlm.TINY_VLMS[name]],
                "size": {"height": side, "width": side}}
    return vision_plan.processor_config(model_check.model_folder(name, base_dir))


def length_findings(recipe: Recipe, config: dict, processor: dict, base_dir: Path | None = None) -> list[Finding]:
    """The first LENGTH_CHECKS records: image tokens + (at least) one token per word must fit
    train.max_seq_len, since an image's tokens are never cut. The first record over names the fix."""
    name, limit, max_pixels = recipe.model.name, recipe.train.max_seq_len, recipe.vision.max_pixels
    fixed = vision_plan.fixed_image_tokens(name, config, processor)
    over = []
    for index, record in enumerate(itertools.islice(datasets.iter_records(recipe.dataset, base_dir), LENGTH_CHECKS)):
        image_tokens = 0
        for path in record.get("images") or []:
            if fixed is not None:
                image_tokens += fixed
                continue
            try:
                width, height, _ = images.check_image_file(path)
            except images.ImageProblem:
                continue  # the dataset's own check names it
            size = (width, height)
            image_tokens += vision_plan.image_tokens(name, config, processor, size, max_pixels) or 0
        text = vision_plan.text_tokens_at_least(_turns(record))
        if image_tokens and image_tokens + text > limit:
            over.append((index + 1, image_tokens, text))
    if not over:
        return []
    number, image_tokens, text = over[0]
    more = f" (and {len(over) - 1} more of the first {LENGTH_CHECKS})" if len(over) > 1 else ""
    pixels = ", lower vision.max_pixels" if vision_plan.dynamic_resolution(processor) else ""
    need = max(i + t for _, i, t in over)
    return [Finding("error", "train.max_seq_len", f"record {number} of {recipe.dataset.name}{more}: {image_tokens} "
                    f"image tokens + at least {text} text tokens, over train.max_seq_len ({limit}); an image's "
                    "tokens are never cut", f"raise train.max_seq_len above {need}{pixels}, or drop "
                    f"{'the record' if len(over) == 1 else 'those records'} from the data")]
