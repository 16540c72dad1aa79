"""`llmtui data`: the first training examples exactly as the trainer sees them. Image chats for a
vision-language model go through its processor, as training collates them (each image's tokens in
the sequence, never trained), and each example names its images: path, size and format (the UI
draws them beside the turns; in a terminal the text output adds a small half-block picture of each)."""

from __future__ import annotations

import argparse
import json
import sys

from tuiapp.core.common.errors import UserError
from tuiapp.core.common.jsonout import error_document, stdout_to_stderr, write_document
from tuiapp.core.common.methods import is_reward_model, is_rl
from tuiapp.core.config.recipe import load_recipe
from tuiapp.trainer.tools.quiet import quiet_libraries

MASK = -100


def segments(example: dict, tokenizer) -> list[dict]:
    """The sequence as runs of trained and masked (label -100) tokens, each decoded:
    [{"text": ..., "trained": bool}, ...] (what the UI marks without a tokenizer of its own)."""
    out: list[dict] = []
    run: list[int] = []
    trained = None
    for token, label in zip(example["input_ids"], example["labels"], strict=True):
        now = label != MASK
        if run and now != trained:
            out.append({"text": tokenizer.decode(run), "trained": trained})
            run = []
        run.append(token)
        trained = now
    if run:
        out.append({"text": tokenizer.decode(run), "trained": trained})
    return out


def render(example: dict, tokenizer) -> str:
    """Trained tokens as they are, masked ones dimmed inside ⟦…⟧."""
    out, masked_run, trained_run = [], [], []

    def flush():
        if masked_run:
            out.append("⟦" + tokenizer.decode(masked_run) + "⟧")
            masked_run.clear()
        if trained_run:
            out.append(tokenizer.decode(trained_run))
            trained_run.clear()

    for token, label in zip(example["input_ids"], example["labels"], strict=True):
        if label == MASK:
            if trained_run:
                flush()
            masked_run.append(token)
        else:
            if masked_run:
                flush()
            trained_run.append(token)
    flush()
    return "".join(out)


def main(argv=None) -> int:
    quiet_libraries()
    parser = argparse.ArgumentParser(prog="llmtui data")
    parser.add_argument("recipe")
    parser.add_argument("--show", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--set", action="append")
    args = parser.parse_args(argv)
    # torch, transformers and DeepSpeed log on import (some on stdout): while they work, fd 1 is
    # stderr; the examples go to the real stdout (with --json: exactly one JSON document)
    with stdout_to_stderr() as out:
        try:
            return _show(args, out)
        except BrokenPipeError:
            return 0
        except Exception as exc:  # a bug or a library failure: still one document, then the traceback
            if args.json:
                write_document(out, {"error": {"message": f"{type(exc).__name__}: {exc}", "key": None,
                                               "fix": "see the traceback on stderr"}})
            raise


def _show(args, out) -> int:
    try:
        recipe = load_recipe(args.recipe, args.set)
        from tuiapp.trainer.dataset.data import preview_examples
        from tuiapp.trainer.models.bundled import resolve_model_path
        from tuiapp.trainer.models.model import load_tokenizer

        path = resolve_model_path(recipe.model.name)
        tokenizer = load_tokenizer(path, recipe.model.trust_remote_code, recipe)
        vision_examples = _vision_examples(recipe, path, args.show)
        if vision_examples is not None:
            tokenizer, examples = vision_examples
        elif is_rl(recipe.method.kind):  # prompts only: the policy writes the completions
            from tuiapp.trainer.methods import rl

            rl.preview(recipe, tokenizer, args.show, args.json, out)
            return 0
        else:
            examples = preview_examples(recipe, tokenizer, args.show)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if args.json:
            write_document(out, error_document(exc))
        return 2
    if args.json:  # one JSON array, one example per line
        rows = [json.dumps({"index": index, **_json_example(example, tokenizer)}, ensure_ascii=False)
                for index, example in enumerate(examples)]
        out.write("[\n" + ",\n".join(rows) + ("\n]\n" if rows else "]\n"))
        return 0
    for index, example in enumerate(examples):
        if "rejected" in example:  # a preference pair: the prompt (masked) with each answer
            what = ("reward model: the value head scores each whole sequence at its last token"
                    if is_reward_model(recipe.method.kind) else "masked prompt inside ⟦ ⟧")
            out.write(f"── example {index}: preference pair ({what}) ──\n")
            for name, sequence in (("chosen", example), ("rejected", example["rejected"])):
                out.write(f"{name} ({_counts(sequence)}): {render(sequence, tokenizer)}\n")
            continue
        label = f", label {str(example['label']).lower()}" if "label" in example else ""
        out.write(f"── example {index}: {_counts(example)}{label} (masked text inside ⟦ ⟧) ──\n")
        for image in example.get("images") or []:
            out.write(f"image {image['path']} ({image['width']}x{image['height']} {image['format']})\n")
            if out.isatty():  # a picture for a terminal, not for a file or a pipe
                out.write(half_blocks(image["path"]) + "\n")
        out.write(render(example, tokenizer) + "\n")
    return 0


def _counts(example: dict) -> str:
    trained = sum(1 for label in example["labels"] if label != MASK)
    return f"{len(example['input_ids'])} tokens, {trained} trained"


def _json_example(example: dict, tokenizer) -> dict:
    """input_ids, labels, text and its trained/masked segments; a pair adds its rejected
    sequence, unpaired feedback its label."""
    out = {
        "input_ids": list(example["input_ids"]),
        "labels": list(example["labels"]),
        "text": example.get("text") or tokenizer.decode(example["input_ids"]),
        "segments": segments(example, tokenizer),
    }
    if "rejected" in example:
        out["rejected"] = _json_example(example["rejected"], tokenizer)
    if "label" in example:
        out["label"] = bool(example["label"])
    if example.get("images"):
        out["images"] = example["images"]
    return out


def _vision_examples(recipe, path: str, n: int):
    """(tokenizer, examples) of a vision-language model's recipe, as its collator makes them; None
    for a text model."""
    from tuiapp.core.data.datasets import load_records
    from tuiapp.core.data.images import check_image_file
    from tuiapp.trainer.models import vision

    if not vision.is_vision_model(path, recipe.model.trust_remote_code):
        return None
    processor = vision.load_processor(path, recipe.model.trust_remote_code)
    vision.apply_max_pixels(processor, recipe.vision.max_pixels)  # the images as training sizes them
    collator = vision.VisionCollator(processor)
    examples = []
    for record in load_records(recipe.dataset)[:n]:
        if "messages" not in record:
            continue
        batch = collator([{"messages": record["messages"], "images": record.get("images") or []}])
        images = []
        for image in record.get("images") or []:
            width, height, kind = check_image_file(image)
            images.append({"path": image, "width": width, "height": height, "format": kind})
        examples.append({"input_ids": batch["input_ids"][0].tolist(), "labels": batch["labels"][0].tolist(),
                         "images": images})
    return processor.tokenizer, examples


HALF_BLOCK_WIDTH = 16  # characters of the text output's picture (two pixels a character, one above the other)


def half_blocks(path: str, width: int = HALF_BLOCK_WIDTH) -> str:
    """A small picture of the image for a terminal: '▀' characters whose foreground is the upper
    pixel and background the lower one (24-bit colour escapes)."""
    from PIL import Image

    with Image.open(path) as image:
        rgb = image.convert("RGB")
    height = max(2, round(rgb.height * width / rgb.width / 2) * 2)  # pixel rows, even: two a line
    small = rgb.resize((width, height))
    pixels = small.load()
    lines = []
    for y in range(0, height, 2):
        cells = []
        for x in range(width):
            (r1, g1, b1), (r2, g2, b2) = pixels[x, y], pixels[x, y + 1]
            cells.append(f"\x1b[38;2;{r1};{g1};{b1}m\x1b[48;2;{r2};{g2};{b2}m▀")
        lines.append("".join(cells) + "\x1b[0m")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
