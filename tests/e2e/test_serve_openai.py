"""`llmtui serve`: a finished tiny run's model behind the OpenAI-compatible endpoint, started
detached through the real CLI, asked by the official `openai` client (streamed and not) and by
plain HTTP, a wrong token refused, a busy port refused before anything starts, and stopped."""

from __future__ import annotations

import json
import os
import shutil
import urllib.error
import urllib.request

import pytest

from tests.e2e.helpers import free_port, llmtui, post_json
from tuiapp.core.store import served

pytestmark = pytest.mark.slow
TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def run(served_run):
    return served_run


def _serve(run, *args: str, env: dict | None = None):
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        return llmtui("serve", run.name, *args, runs_dir=run.parent, timeout=300)
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_openai_client_streamed_and_not_wrong_token_busy_port_and_stop(run):
    import openai

    port = free_port()
    started = _serve(run, "--port", str(port), env={served.TOKEN_ENV: TOKEN})
    assert started.returncode == 0, started.stdout + started.stderr
    assert f"serving {run.name} on http://localhost:{port}/v1" in started.stdout
    record = served.read_record(run)
    assert record["auth"] is True and TOKEN not in json.dumps(record)  # the token never reaches the record
    assert served.state(record) == served.SERVING
    assert os.getpgid(record["pid"]) == record["pid"] != os.getpgid(0)  # its own session, like a run

    status = llmtui("serve", "--status", runs_dir=run.parent)
    assert f"{run.name}: serving  http://localhost:{port}/v1" in status.stdout

    client = openai.OpenAI(base_url=f"http://localhost:{port}/v1", api_key=TOKEN, max_retries=0)
    assert [m.id for m in client.models.list().data] == [run.name]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(model=run.name, messages=messages, temperature=0, max_tokens=12)
    text = reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens >= 1
    assert reply.usage.prompt_tokens > 5 and text

    # streamed: the same greedy answer, in pieces
    pieces = []
    finish = None
    for chunk in client.chat.completions.create(model=run.name, messages=messages, temperature=0, max_tokens=12,
                                                stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(pieces).strip() == text and len([p for p in pieces if p]) >= 2
    assert finish == reply.choices[0].finish_reason

    # a wrong token, no token, an unknown model: refused with OpenAI's error shapes
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"http://localhost:{port}/v1", api_key="wrong-token", max_retries=0).models.list()
    code, body = post_json(f"http://localhost:{port}/v1/chat/completions", {"model": run.name, "messages": messages})
    assert code == 401 and body["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=messages)
    code, body = post_json(f"http://localhost:{port}/v1/chat/completions",
                       {"model": run.name, "messages": messages, "temperature": 9}, TOKEN)
    assert code == 400 and body["error"]["param"] == "temperature"

    # a second server on the same run, or anything on a busy port, is refused before it starts
    again = _serve(run, "--port", str(free_port()))
    assert again.returncode == 2 and "already served" in again.stderr
    other = run.parent / "copy"
    shutil.copytree(run, other)
    (other / served.SERVE_JSON).unlink()
    busy = llmtui("serve", "copy", "--port", str(port), runs_dir=run.parent)
    assert busy.returncode == 2 and f"cannot listen on localhost:{port}" in busy.stderr
    assert not (other / served.SERVE_JSON).exists()
    # beyond loopback without a token: refused
    wide = llmtui("serve", "copy", "--host", "0.0.0.0", "--port", str(free_port()), runs_dir=run.parent)
    assert wide.returncode == 2 and "no token is set" in wide.stderr

    stopped = _serve(run, "--stop")
    assert stopped.returncode == 0 and "stopped serving" in stopped.stdout
    assert served.state(served.read_record(run)) == served.STOPPED
    assert "loaded in" in served.log_path(run).read_text()
    with pytest.raises(openai.APIConnectionError):
        client.models.list()


def test_plain_http_without_token_and_stop_strings(run):
    port = free_port()
    started = _serve(run, "--port", str(port), env={served.TOKEN_ENV: ""})
    assert started.returncode == 0, started.stderr
    base = f"http://127.0.0.1:{port}/v1"
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": [{"type": "text", "text": "Who are you?"}]}]
    code, full = post_json(f"{base}/chat/completions", {"model": run.name, "messages": messages, "max_tokens": 16,
                                                     "temperature": 0})
    assert code == 200 and full["object"] == "chat.completion", full
    text = full["choices"][0]["message"]["content"]
    assert full["usage"]["total_tokens"] == full["usage"]["prompt_tokens"] + full["usage"]["completion_tokens"]
    if len(text) > 3:  # a stop string cuts the answer where it first appears
        stop = text[2:4]
        code, cut = post_json(f"{base}/chat/completions", {"model": run.name, "messages": messages, "max_tokens": 16,
                                                        "temperature": 0, "stop": [stop]})
        assert code == 200 and cut["choices"][0]["message"]["content"] == text[:text.find(stop)].strip()
        assert cut["choices"][0]["finish_reason"] == "stop"
    # SSE by hand: data lines of chat.completion.chunk, then [DONE]
    request = urllib.request.Request(f"{base}/chat/completions", method="POST", headers={"Content-Type":
                                     "application/json"}, data=json.dumps({"model": run.name, "messages": messages,
                                                                           "max_tokens": 16, "temperature": 0,
                                                                           "stream": True}).encode())
    with urllib.request.urlopen(request, timeout=60) as answer:
        assert answer.headers["Content-Type"].split(";")[0] == "text/event-stream"
        lines = [ln for ln in answer.read().decode().splitlines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[len("data: "):]) for ln in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks).strip() == text
    assert served.stop(run)


def test_completions_continue_a_raw_prompt_and_give_vllm_s_prompt_logprobs(run):
    """POST /v1/completions: a text or token-id prompt continued without a chat template, and
    prompt_logprobs = k as vLLM gives them, equal to the run's model's own log-softmax."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    port = free_port()
    started = _serve(run, "--port", str(port), env={served.TOKEN_ENV: ""})
    assert started.returncode == 0, started.stderr
    base = f"http://127.0.0.1:{port}/v1"
    models = json.loads(urllib.request.urlopen(f"{base}/models", timeout=30).read())
    assert models["data"][0]["root"] == str(run / "final")  # the model's folder, as vLLM's `root`

    tokenizer = AutoTokenizer.from_pretrained(run / "final")
    model = AutoModelForCausalLM.from_pretrained(run / "final").eval()
    ids = tokenizer("The capital of France is", add_special_tokens=False)["input_ids"]
    code, body = post_json(f"{base}/completions", {"model": run.name, "prompt": ids, "max_tokens": 4, "temperature": 0,
                                               "prompt_logprobs": 5})
    assert code == 200 and body["object"] == "text_completion", body
    choice = body["choices"][0]
    scored = choice["prompt_logprobs"]
    assert len(scored) == len(ids) and scored[0] is None
    with torch.no_grad():
        own = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
        greedy = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=4, do_sample=False,
                                pad_token_id=tokenizer.eos_token_id)[0, len(ids):].tolist()
    assert choice["text"] == tokenizer.decode(greedy, skip_special_tokens=True)  # the model's own greedy answer
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": len(greedy),
                             "total_tokens": len(ids) + len(greedy)}
    for position in range(1, len(ids)):
        entries = scored[position]
        top = own[position - 1].topk(5)
        ranked = sorted(entries.items(), key=lambda item: item[1]["rank"])
        assert [int(t) for t, _ in ranked[:5]] == top.indices.tolist()
        for (token, entry), value in zip(ranked[:5], top.values.tolist(), strict=True):
            assert abs(entry["logprob"] - value) < 1e-4 and entry["decoded_token"] == tokenizer.decode([int(token)])
        actual = entries[str(ids[position])]  # the prompt's own token, whatever its rank
        assert actual["rank"] == int((own[position - 1] > own[position - 1, ids[position]]).sum()) + 1

    code, text = post_json(f"{base}/completions", {"model": run.name, "prompt": "The capital of France is",
                                               "max_tokens": 0, "echo": True, "prompt_logprobs": 1})
    assert code == 200 and text["choices"][0]["text"] == tokenizer.decode(ids)
    assert len(text["choices"][0]["prompt_logprobs"]) == len(ids)
    vocab = model.get_output_embeddings().weight.shape[0]
    for bad, param in (({"prompt": [vocab]}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": "a", "stream": True},
                       "stream"), ({"prompt": "a", "prompt_logprobs": -1}, "prompt_logprobs"),
                       ({"prompt": "a", "max_tokens": 10**9}, "max_tokens"), ({"prompt": "a", "temperature": "hot"},
                                                                              "temperature")):
        code, refused = post_json(f"{base}/completions", {"model": run.name, **bad})
        assert code == 400 and refused["error"]["param"] == param, (bad, refused)
    assert served.stop(run)
