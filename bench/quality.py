"""Does fine-tuning help? Base tiny model vs a run's final model on held-out demo questions.

    .venv/bin/python bench/quality.py RUN_DIR [--limit N]

Asks every held-out phrasing from `facts_eval_pairs()` (never seen in training) with greedy
decoding and reports the exact-answer rate and the key-word rate (the answer's last word).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tuiapp.core.data.demo_data import facts_eval_pairs
from tuiapp.trainer.models.tiny import ensure_tiny_model


def answer(model, tokenizer, question: str) -> str:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=24, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def key_word(sentence: str) -> str:
    return sentence.rstrip(".").split()[-1].lower() if sentence.strip() else ""


def score(model, tokenizer, pairs) -> dict:
    exact = keyword = 0
    examples = []
    for question, expected in pairs:
        got = answer(model, tokenizer, question)
        exact += got == expected
        keyword += key_word(got) == key_word(expected)
        if len(examples) < 3:
            examples.append({"question": question, "expected": expected, "answer": got})
    n = max(1, len(pairs))
    return {"exact": exact / n, "keyword": keyword / n, "examples": examples}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--limit", type=int, default=60)
    args = parser.parse_args(argv)
    pairs = facts_eval_pairs()[:: max(1, len(facts_eval_pairs()) // args.limit)][: args.limit]
    torch.manual_seed(0)
    base_path = ensure_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(base_path)
    results = {}
    for label, path in (("base", base_path), ("fine-tuned", args.run_dir / "final")):
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        results[label] = score(model, tokenizer, pairs)
    print(f"| model | exact answer | key word | ({len(pairs)} held-out questions) |")
    print("|---|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {r['exact']:.0%} | {r['keyword']:.0%} | e.g. {r['examples'][0]['answer']!r} |")
    print(json.dumps(results, indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
