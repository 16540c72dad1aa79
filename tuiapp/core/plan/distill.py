"""Knowledge distillation's bundled teacher, on the pure side: 'tiny-teacher' is the tiny model
(estimate.TINY_CONFIG) with these changes, built by tuiapp.trainer.methods.distill with the tiny tokenizer.
estimate.teacher_parameters counts a teacher for the memory estimate (one extra frozen copy)."""

from __future__ import annotations

from tuiapp.core.common.methods import is_distill

TEACHER_NAME = "tiny-teacher"
BUNDLED_TEACHERS = ("tiny", TEACHER_NAME)
# a teacher behind an OpenAI-compatible server (`llmtui serve`, vLLM): method.teacher = its /v1 URL;
# read through POST /v1/completions with vLLM's prompt_logprobs (mode 'offline' only)
TEACHER_KEY_ENVS = ("LLMTUI_TEACHER_API_KEY", "OPENAI_API_KEY", "LLMTUI_SERVE_TOKEN")


def served_teacher(name: str) -> bool:
    return name.startswith(("http://", "https://"))


def teacher_base_url(name: str) -> str:
    """A served teacher's URL ending in /v1 (as the judge's)."""
    url = name.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"
# 1.5 times as wide, one untied layer, and a larger init range so that its random next-token
# distributions are peaked (something to learn) rather than flat
TEACHER_CHANGES = {"hidden_size": 192, "intermediate_size": 528, "num_hidden_layers": 1, "tie_word_embeddings": False,
                   "initializer_range": 0.2}
# the share of every token's input embedding that is one common random vector: the teacher's
# distributions then have a part shared by all contexts, which a student can learn from a few
# batches and which holds on held-out text (a purely random function of the context does not)
TEACHER_SHARED_EMBEDDING = 0.7

# 'tiny-student': a bundled model.name smaller than the tiny model (half the layers, half the width),
# with the tiny tokenizer, so that a teacher trained from 'tiny' (recipes/tiny-distill-teacher.toml)
# distils into a smaller student (recipes/tiny-distill.toml); built by tuiapp.trainer.models.tiny_student
STUDENT_NAME = "tiny-student"
STUDENT_CHANGES = {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2}


def student_config(tiny_config: dict) -> dict:
    """The bundled student's HF config dict, from the tiny model's."""
    return {**tiny_config, **STUDENT_CHANGES}


# ---- the offline teacher cache on disk (tuiapp.trainer.methods.distill.compute_topk writes it: one
# topk.safetensors per teacher, dataset and top_k, under the cache's distill/ folder)

TOPK_ID_BYTES, TOPK_LOGIT_BYTES, OFFSET_BYTES = 4, 4, 8  # int32 ids, float32 logits, int64 offsets
CHARS_PER_TOKEN = 4.0  # a byte-level BPE on English text; the tiny tokenizer on the demo data: 4.0
TOKENS_PER_TURN = 5  # ChatML around each message: <|im_start|>, the role, newline, <|im_end|>, newline


def topk_cache_bytes(tokens: int, examples: int, top_k: int) -> int:
    """The cache file's size for `tokens` tokens over `examples` examples: top_k ids and logits per
    token, plus one offset per example (the safetensors header, under 1 KB, left out)."""
    return tokens * top_k * (TOPK_ID_BYTES + TOPK_LOGIT_BYTES) + (examples + 1) * OFFSET_BYTES


def _record_tokens(record: dict, max_seq_len: int) -> int:
    """One normalised record's tokens, guessed from its characters, at most max_seq_len."""
    turns = record.get("messages") or []
    if turns:
        chars = sum(len(str(m.get("content") or "")) for m in turns)
        guess = chars / CHARS_PER_TOKEN + TOKENS_PER_TURN * len(turns)
    else:
        guess = len(str(record.get("text") or "")) / CHARS_PER_TOKEN
    return min(max_seq_len, max(1, round(guess)))


def teacher_cache_size(recipe, base_dir=None) -> dict | None:
    """mode 'offline': {'bytes', 'tokens', 'examples'} the teacher's cached top-k take on disk, the
    tokens guessed from the dataset's characters (CHARS_PER_TOKEN, each example cut at max_seq_len);
    None for another method or mode, or when the rows cannot be read here (a hub dataset)."""
    from tuiapp.core.data import datasets

    method = recipe.method
    if not is_distill(method.kind) or method.mode != "offline" or recipe.dataset.streaming:
        return None
    try:
        source = datasets.resolve_source(recipe.dataset, base_dir)
        if source.kind == "hub":
            return None
        rows, records, _, _ = datasets.sample_rows(source)
        normalised, _, _ = datasets.normalise_rows(rows, recipe.dataset, source.name)
    except (datasets.DatasetError, OSError, ValueError):
        return None
    if not normalised:
        return None
    per_row = sum(_record_tokens(r, recipe.train.max_seq_len) for r in normalised) / len(normalised)
    examples = records * len(normalised) // max(1, len(rows))  # the rows that normalise to examples
    if recipe.dataset.max_samples:
        examples = min(examples, recipe.dataset.max_samples)
    tokens = round(per_row * examples)
    return {"bytes": topk_cache_bytes(tokens, examples, method.top_k), "tokens": tokens, "examples": examples}


def teacher_cache_text(size: dict) -> str:
    """The estimate's disk row for teacher_cache_size's figures."""
    mb = size["bytes"] / 1e6
    amount = f"{mb / 1e3:.1f} GB" if mb >= 1000 else f"{mb:.1f} MB"
    return (f"disk         teacher cache {amount}: top-k logits of ~{size['tokens']:,} tokens "
            f"({size['examples']:,} examples), once, in the cache's distill/ folder")
