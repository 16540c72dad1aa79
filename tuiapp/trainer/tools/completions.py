"""`POST /v1/completions` of `llmtui serve` (openai_server, in place of transformers' own route): a raw
prompt (text or token ids) continued without a chat template, and, as vLLM's server gives them, the
prompt's own log-probabilities.

    {model, prompt: str | [int], max_tokens? (16; 0 = score only), temperature?, top_p?, echo?,
     prompt_logprobs?: k}

`prompt_logprobs = k` adds `choices[0].prompt_logprobs`: None for the first token, then for each
later one a map of token id -> {logprob, rank, decoded_token} over the k most likely tokens at that
position and the prompt's own token (so k or k + 1 entries), as vLLM answers it. A distillation
run's served teacher is read this way (tuiapp.trainer.methods.distill.compute_topk_served)."""

from __future__ import annotations

import time
import uuid

import torch

MAX_PROMPT_LOGPROBS = 4096  # method.top_k's own bound


def read_request(body: dict, endpoint, error) -> dict:
    """The request's checked fields, or `error(status, message, param=...)` raised."""
    if body.get("model") != endpoint.model_id:
        raise error(404, f"The model '{body.get('model')}' does not exist; this server has '{endpoint.model_id}'",
                    code="model_not_found", param="model")
    if body.get("stream"):
        raise error(400, "stream is not supported on /v1/completions", param="stream")
    if (body.get("n") or 1) != 1:
        raise error(400, "only n=1 is supported", param="n")
    prompt = body.get("prompt")
    vocab = _vocab_size(endpoint.loaded.model)
    if isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        if not all(0 <= i < vocab for i in prompt):
            raise error(400, f"prompt token ids must be in 0..{vocab - 1}", param="prompt")
        ids = list(prompt)
    elif isinstance(prompt, str) and prompt:
        if len(prompt.encode()) // endpoint.token_bytes >= endpoint.context:
            raise error(400, f"the prompt holds more tokens than this model's context of {endpoint.context:,}",
                        code="context_length_exceeded", param="prompt")
        with endpoint.tokenizer_lock:
            ids = endpoint.counter(prompt, add_special_tokens=False)["input_ids"]
    else:
        raise error(400, "prompt must be a non-empty string or a non-empty array of token ids", param="prompt")
    numbers = {}
    for key, default, low, high in (("max_tokens", 16, 0, endpoint.context), ("prompt_logprobs", None, 0,
                                                                               MAX_PROMPT_LOGPROBS)):
        value = body.get(key, default)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high):
            raise error(400, f"{key} must be an integer from {low} to {high}", param=key)
        numbers[key] = value
    if len(ids) + numbers["max_tokens"] > endpoint.context:
        raise error(400, f"the prompt's {len(ids):,} tokens + max_tokens {numbers['max_tokens']:,} are more than this "
                    f"model's context of {endpoint.context:,}", code="context_length_exceeded", param="max_tokens")
    sampling = {}
    for key, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = body.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)
                                  or not low <= value <= high):
            raise error(400, f"{key} must be a number from {low} to {high}", param=key)
        sampling[key] = value
    return {"ids": ids, **numbers, **sampling, "echo": bool(body.get("echo"))}


def _vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0]) if model.get_output_embeddings() is not None else \
        int(model.config.vocab_size)


def prompt_logprobs(model, tokenizer, ids: list[int], k: int) -> list[dict | None]:
    """vLLM's prompt_logprobs of `ids` under `model`: one forward, position i's distribution read
    from the logits of position i - 1."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    out: list[dict | None] = [None]
    k = min(k, logprobs.shape[-1])
    for i in range(1, len(ids)):
        row = logprobs[i - 1]
        values, indices = row.topk(k)
        entries = {t: (v, rank) for rank, (v, t) in enumerate(zip(values.tolist(), indices.tolist(), strict=True),
                                                               start=1)}
        actual = ids[i]
        if actual not in entries:
            value = row[actual]
            entries[actual] = (float(value), int((row > value).sum()) + 1)
        out.append({str(t): {"logprob": lp, "rank": rank, "decoded_token": tokenizer.decode([t])}
                    for t, (lp, rank) in entries.items()})
    return out


def complete(endpoint, request: dict) -> dict:
    """The text_completion answer (run on the engine's inference thread, between its generations)."""
    loaded = endpoint.loaded
    model, tokenizer, ids = loaded.model, loaded.tokenizer, request["ids"]
    scored = prompt_logprobs(model, tokenizer, ids, request["prompt_logprobs"]) \
        if request["prompt_logprobs"] is not None else None
    new: list[int] = []
    if request["max_tokens"]:
        temperature = request["temperature"] if request["temperature"] is not None else 1.0
        options = {"do_sample": temperature > 0, "max_new_tokens": request["max_tokens"],
                   "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else
                   tokenizer.eos_token_id}
        if temperature > 0:
            options.update(temperature=temperature, top_p=request["top_p"] if request["top_p"] is not None else 1.0)
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([ids], device=model.device),
                                 attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=model.device),
                                 **options)
        new = out[0, len(ids):].tolist()
    finish = "stop" if new and new[-1] == tokenizer.eos_token_id else "length"
    text = tokenizer.decode(new, skip_special_tokens=True)
    if request["echo"]:
        text = tokenizer.decode(ids) + text
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    if scored is not None:
        choice["prompt_logprobs"] = scored
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": endpoint.model_id, "choices": [choice],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(new), "total_tokens": len(ids) + len(new)}}
