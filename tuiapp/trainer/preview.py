"""`llmtui data`: the first training examples exactly as the trainer sees them."""

from __future__ import annotations

import argparse
import json
import sys

from tuiapp.core.errors import UserError
from tuiapp.core.jsonout import error_document, stdout_to_stderr, write_document
from tuiapp.core.kinds import RL_KINDS
from tuiapp.core.recipe import load_recipe

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

    for token, label in zip(example["input_ids"], example["labels"]):
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
        from tuiapp.trainer.data import preview_examples
        from tuiapp.trainer.bundled import resolve_model_path
        from tuiapp.trainer.model import load_tokenizer

        tokenizer = load_tokenizer(resolve_model_path(recipe.model.name), recipe.model.trust_remote_code, recipe)
        if recipe.method.kind in RL_KINDS:  # prompts only: the policy writes the completions
            from tuiapp.trainer import rl

            rl.preview(recipe, tokenizer, args.show, args.json, out)
            return 0
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
                    if recipe.method.kind == "reward" else "masked prompt inside ⟦ ⟧")
            out.write(f"── example {index}: preference pair ({what}) ──\n")
            for name, sequence in (("chosen", example), ("rejected", example["rejected"])):
                out.write(f"{name} ({_counts(sequence)}): {render(sequence, tokenizer)}\n")
            continue
        label = f", label {str(example['label']).lower()}" if "label" in example else ""
        out.write(f"── example {index}: {_counts(example)}{label} (masked text inside ⟦ ⟧) ──\n")
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
    return out


if __name__ == "__main__":
    sys.exit(main())
