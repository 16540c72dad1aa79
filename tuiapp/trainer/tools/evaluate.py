"""`llmtui eval`: a run's model against its base on held-out data.

    python -m tuiapp.trainer.tools.evaluate RUN_DIR --data NAME --out FILE [--format F] [--checkpoint N]
        [--no-base] [--limit N] [--gen-limit N] [--tasks T1,T2] [--task-limit N]

- loss and perplexity over the tokens that train (the same chat template and assistant-only
  labels as training, tuiapp.trainer.dataset.data), for data of any supported format;
- for prompt→response records: greedy answers scored by exact match and ROUGE-L (rouge-score);
- lm-evaluation-harness tasks (`--tasks`) when the package and the task data are here.
A vision-language model reads each record's images through its processor, for the loss (the
training collator) and the answers: exact match scores image QA (demo:shapes-heldout).
The result goes to FILE (runs/<id>/evals/<time>.json, read by tuiapp.core.run_folder.evals).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

import torch

from tuiapp.core.after.targets import model_target
from tuiapp.core.common import trainer_tools
from tuiapp.core.common.errors import UserError
from tuiapp.core.config.recipe import DatasetSpec
from tuiapp.core.data.datasets import load_records
from tuiapp.core.run_folder import evals
from tuiapp.trainer.dataset.data import IGNORE, _chat_example, _text_example
from tuiapp.trainer.tools import inference
from tuiapp.trainer.tools.quiet import quiet_libraries

SAMPLES = 5  # answers kept in the result per model


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- records


def conversations(record: dict) -> list[dict] | None:
    """A canonical record as the chat whose assistant turns are scored (None: plain text)."""
    if "text" in record:
        return None
    if "messages" in record:
        return record["messages"]
    if "chosen" in record:  # a preference pair: the chosen answer
        return [*record["prompt"], *record["chosen"]]
    if "completion" in record:  # feedback: a good answer scores like a chat, a bad one is skipped
        return [*record["prompt"], *record["completion"]] if record.get("label") else []
    return None


def prompt_response(messages: list[dict] | None) -> tuple[list[dict], str] | None:
    """(prompt turns, reference answer) when the chat ends with an assistant turn."""
    if not messages or messages[-1].get("role") != "assistant" or len(messages) < 2:
        return None
    return messages[:-1], str(messages[-1].get("content") or "")


def example(record: dict, tokenizer, max_len: int) -> dict | None:
    messages = conversations(record)
    if messages is None:
        return _text_example(record.get("text") or "", tokenizer, max_len)
    if not messages:
        return None
    return _chat_example(messages, record.get("tools"), tokenizer, max_len)


# ---------------------------------------------------------------- metrics


def _inputs(loaded: inference.Loaded, record: dict, max_len: int, collator) -> tuple[dict, object] | None:
    """(model inputs, labels) of a record: a vision-language model's through the training collator
    (images and all), a text model's as training tokenizes it."""
    device = next(loaded.model.parameters()).device
    if collator is not None:
        messages = conversations(record)
        if not messages:
            return None
        batch = {k: v.to(device) for k, v in collator([{"messages": messages, "images": record.get("images") or []}]).items()}
        return batch, batch.pop("labels")
    item = example(record, loaded.tokenizer, max_len)
    if item is None:
        return None
    return ({"input_ids": torch.tensor([item["input_ids"]], device=device)},
            torch.tensor([item["labels"]], device=device))


def loss_of(loaded: inference.Loaded, records: list[dict], max_len: int) -> dict:
    """Mean cross-entropy over the trained tokens of every record, and its perplexity."""
    from tuiapp.trainer.models.vision import VisionCollator

    model = loaded.model
    collator = VisionCollator(loaded.processor) if loaded.processor is not None else None
    total, count, used = 0.0, 0, 0
    with torch.no_grad():
        for record in records:
            inputs = _inputs(loaded, record, max_len, collator)
            if inputs is None:
                continue
            batch, labels = inputs
            logits = model(**batch).logits[:, :-1].float()
            target = labels[:, 1:]
            mask = target != IGNORE
            if not mask.any():
                continue
            nll = torch.nn.functional.cross_entropy(logits[mask], target[mask], reduction="sum")
            total += float(nll)
            count += int(mask.sum())
            used += 1
    if not count:
        return {"loss": None, "perplexity": None, "tokens": 0, "scored": 0}
    loss = total / count
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "tokens": count, "scored": used}


def normalize(text: str) -> str:
    """Case, spacing and final punctuation do not count for exact match."""
    return " ".join(text.lower().split()).rstrip(" .!?")


class _Words:
    """Tokens for ROUGE: words in any script (rouge-score's own keeps only a-z and 0-9)."""

    def tokenize(self, text: str) -> list[str]:
        return re.findall(r"\w+", text.lower())


def generation_of(loaded: inference.Loaded, pairs: list[tuple[list[dict], str, list[str]]], settings) -> dict:
    """Greedy answers to the prompts (with their images), scored against the references."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], tokenizer=_Words())
    greedy = settings.model_copy(update={"temperature": 0.0})
    exact = rouge = 0.0
    samples = []
    for prompt, reference, images in pairs:
        room = len(loaded.tokenizer(reference, add_special_tokens=False)["input_ids"]) + 16
        answer = inference.generate(loaded, prompt, greedy.model_copy(update={
            "max_new_tokens": min(settings.max_new_tokens, room)}), images=images)["text"]
        exact += normalize(answer) == normalize(reference)
        rouge += scorer.score(reference, answer)["rougeL"].fmeasure
        if len(samples) < SAMPLES:
            samples.append({"prompt": prompt[-1]["content"], "reference": reference, "answer": answer,
                            **({"images": images} if images else {})})
    n = len(pairs)
    return {"exact_match": exact / n, "rouge_l": rouge / n, "generated": n, "samples": samples} if n else {}


def tasks_of(loaded: inference.Loaded, tasks: list[str], limit: int | None) -> dict:
    """lm-evaluation-harness scores of the model on `tasks` (their data must be available here)."""
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        raise UserError(message="--tasks needs lm-evaluation-harness, which is not installed",
                        fix="pip install lm-eval (then the tasks' data must be in the local datasets cache)") from None
    model = HFLM(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=1)
    try:
        out = lm_eval.simple_evaluate(model=model, tasks=tasks, limit=limit)
    except Exception as exc:  # unknown task, or its data not downloadable offline
        raise UserError(message=f"lm-eval tasks {', '.join(tasks)} could not run: {type(exc).__name__}: {exc}",
                        fix="check the task names (lm-eval --tasks list); offline, each task's dataset must "
                        "already be in the local datasets cache") from None
    scores = {}
    for task, metrics in (out or {}).get("results", {}).items():
        scores[task] = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return scores


# ---------------------------------------------------------------- the tool


def evaluate(args) -> dict:
    target = model_target(args.run_dir, args.checkpoint, purpose="be evaluated")
    recipe = inference.frozen_recipe(args.run_dir)
    columns = dict(item.split("=", 1) for item in args.columns.split(",") if "=" in item)
    spec = DatasetSpec(name=args.data, format=args.format, columns=columns)
    records = load_records(spec, Path.cwd())
    if args.limit:
        records = records[: args.limit]
    pairs = [(*p, list(r.get("images") or [])) for r in records
             if (p := prompt_response(conversations(r))) is not None]
    pairs = pairs[: args.gen_limit] if args.gen_limit else []
    names = ["tuned"] if args.no_base else ["tuned", "base"]
    result: dict = {"time": time.time(), "data": args.data, "format": args.format, "records": len(records),
                    "target": target.as_dict(), "checkpoint": args.checkpoint, "models": {}}
    trust = recipe.model.trust_remote_code
    for name in names:
        loaded = inference.load(name, target, trust)
        say(f"{name}: {loaded.label} loaded in {loaded.load_s:.1f}s; loss over {len(records)} records")
        scores = loss_of(loaded, records, recipe.train.max_seq_len)
        if pairs:
            say(f"{name}: answering {len(pairs)} prompts")
            scores.update(generation_of(loaded, pairs, recipe.generate))
        if args.tasks:
            say(f"{name}: lm-eval tasks {args.tasks}")
            result.setdefault("tasks", {})[name] = tasks_of(loaded, args.tasks.split(","), args.task_limit)
        result["models"][name] = scores
        del loaded
    return result


def main(argv=None) -> int:
    quiet_libraries()
    parser = argparse.ArgumentParser(prog=trainer_tools.prog("evaluate"))
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--format", default="auto")
    parser.add_argument("--columns", default="", help="ROLE=COLUMN,... (the recipe's dataset.columns)")
    parser.add_argument("--checkpoint", type=int, default=None)
    parser.add_argument("--no-base", action="store_true")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--gen-limit", type=int, default=50)
    parser.add_argument("--tasks", default="")
    parser.add_argument("--task-limit", type=int, default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    try:
        result = evaluate(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    evals.write(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
