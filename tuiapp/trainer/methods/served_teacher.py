"""A distillation teacher behind an OpenAI-compatible server (method.teacher = its /v1 URL: `llmtui
serve` or vLLM): its top-k at every position of every example, read through POST /v1/completions
with vLLM's prompt_logprobs, in the table compute_topk makes from a local teacher.

The log-probabilities stand in for the logits: the loss takes a softmax over each position's k
values, which a constant per position (the log of the full softmax's sum) does not change."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from tuiapp.core.common.openai_http import EndpointError, request_json
from tuiapp.core.plan.distill import TEACHER_KEY_ENVS, teacher_base_url

IN_FLIGHT = 8  # requests at once (a vLLM server batches them; `llmtui serve` answers one at a time)
FAR = -1e9  # a missing entry's value (a vocabulary smaller than top_k): no weight in the softmax
TOKEN_AGREEMENT = 0.9  # the share of the first example's tokens the two tokenizers must decode alike


class ServedTeacherError(RuntimeError):
    pass


def served_model(name: str) -> dict:
    """The first model the server lists ({id, root?, ...})."""
    url = teacher_base_url(name)
    try:
        listed = [m for m in request_json(url + "/models", key_envs=TEACHER_KEY_ENVS).get("data") or []
                  if isinstance(m, dict) and m.get("id")]
    except EndpointError as exc:
        raise ServedTeacherError(f"the teacher's server {url} {exc.message}") from None
    if not listed:
        raise ServedTeacherError(f"the teacher's server {url} lists no model")
    return listed[0]


def _row_topk(entries: dict, top_k: int) -> tuple[list[int], list[float]]:
    """One position's k most likely tokens from vLLM's {token id: {logprob, rank}} (which also holds
    the prompt's own token, whatever its rank)."""
    ranked = sorted(((int(t), float(e["logprob"])) for t, e in entries.items()), key=lambda item: -item[1])[:top_k]
    return [t for t, _ in ranked], [v for _, v in ranked]


def score(url: str, model: str, ids: list[int], top_k: int) -> list[dict | None]:
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": top_k}
    try:
        answer = request_json(url + "/completions", body, key_envs=TEACHER_KEY_ENVS, timeout=600)
    except EndpointError as exc:
        raise ServedTeacherError(f"the teacher's server {url} {exc.message}") from None
    found = (answer.get("choices") or [{}])[0].get("prompt_logprobs")
    if not isinstance(found, list) or len(found) != len(ids):
        raise ServedTeacherError(f"the teacher's server {url} gave no prompt_logprobs for a {len(ids)}-token prompt "
                                 "(serve the teacher with `llmtui serve` or vLLM)")
    return found


def check_tokenizer(tokenizer, ids: list[int], scored: list[dict | None], url: str) -> None:
    """The server's decoding of the prompt's own tokens against the student tokenizer's: a teacher
    with another tokenizer reads other words from the same ids."""
    pairs = [(tokenizer.decode([token]), entries.get(str(token), {}).get("decoded_token"))
             for token, entries in zip(ids[1:], scored[1:], strict=True) if entries]
    pairs = [(ours, theirs) for ours, theirs in pairs if theirs is not None]
    if pairs and sum(ours == theirs for ours, theirs in pairs) < TOKEN_AGREEMENT * len(pairs):
        ours, theirs = next((a, b) for a, b in pairs if a != b)
        raise ServedTeacherError(f"the teacher at {url} decodes the student's token ids as other text ({ours!r} is "
                                 f"{theirs!r} there): not the same tokenizer; use a teacher of the student's family")


def compute_topk_served(name: str, datasets: list, top_k: int, tokenizer=None) -> dict[str, torch.Tensor]:
    """compute_topk's table from the served teacher: for each example, position t's row is the
    distribution of token t + 1 (vLLM's prompt_logprobs[t + 1]); the last position, whose next
    token is outside the example and never trained, is left at zeros."""
    url, model = teacher_base_url(name), served_model(name)["id"]
    examples = [row for dataset in datasets for row in dataset["input_ids"]]
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        answers = list(pool.map(lambda ids: score(url, model, list(ids), top_k), examples))
    if tokenizer is not None and examples:
        check_tokenizer(tokenizer, list(examples[0]), answers[0], url)
    sizes = [len(e) for scored in answers for e in scored if e]  # k + 1, or the vocabulary when it is smaller
    width = min(top_k, max(sizes)) if sizes else top_k
    ids_out, values_out, lengths = [], [], []
    for tokens, scored in zip(examples, answers, strict=True):
        ids = torch.zeros(len(tokens), width, dtype=torch.int32)
        values = torch.full((len(tokens), width), FAR, dtype=torch.float32)
        values[-1] = 0.0
        for t in range(len(tokens) - 1):
            top_ids, top_values = _row_topk(scored[t + 1], width)
            ids[t, :len(top_ids)] = torch.tensor(top_ids, dtype=torch.int32)
            values[t, :len(top_values)] = torch.tensor(top_values)
        ids_out.append(ids)
        values_out.append(values)
        lengths.append(len(tokens))
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return {"ids": torch.cat(ids_out), "logits": torch.cat(values_out), "offsets": offsets}
