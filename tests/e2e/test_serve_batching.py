"""`llmtui serve RUN --continuous-batching`: the finished tiny SFT run answered by transformers'
continuous batching. Requests asked at once are generated together (their streams all start before
the first one ends; one at a time, each would start after the one before it ended), and each
greedy answer equals the run's own (its model answering alone, as `llmtui chat` and the server
without batching answer). What the batch cannot do per request is refused, never answered wrong:
another temperature is a 400 naming it, /v1/completions a 400; stop strings are cut by llmtui.
Several runs, or a run whose repetition_penalty is not 1, are refused before anything starts."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.helpers import free_port, llmtui, post_json
from tuiapp.core.store import served

pytestmark = pytest.mark.slow
QUESTIONS = ["What is the capital of Japan?", "What is the capital of France?", "Who wrote Hamlet?",
             "What is the largest planet?", "What is the boiling point of water?", "Who painted the Mona Lisa?",
             "What is the capital of Italy?", "How many legs does a spider have?"]
MAX_TOKENS = 16


def _streamed(url: str, body: dict) -> dict:
    """A streamed answer: its text, and when its first piece of text and its end arrived."""
    request = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    pieces, first, finish = [], None, None
    with urllib.request.urlopen(request, timeout=120) as answer:
        for raw in answer:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[len("data: "):])["choices"][0]
            if choice["delta"].get("content"):
                first = first or time.monotonic()
                pieces.append(choice["delta"]["content"])
            finish = choice.get("finish_reason") or finish
    return {"text": "".join(pieces).strip(), "first": first, "done": time.monotonic(), "finish": finish}


def _own_answers(run) -> list[str]:
    from tuiapp.core.after.targets import model_target
    from tuiapp.trainer.tools import inference

    loaded = inference.load("tuned", model_target(run))
    settings = inference.frozen_recipe(run).generate.model_copy(update={"temperature": 0.0,
                                                                         "max_new_tokens": MAX_TOKENS})
    return [inference.generate(loaded, [{"role": "user", "content": q}], settings)["text"] for q in QUESTIONS]


def test_requests_at_once_are_batched_and_answer_as_alone(served_run):
    run = served_run
    port = free_port()
    started = llmtui("serve", run.name, "--continuous-batching", "--port", str(port), runs_dir=run.parent,
                     timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    record = served.read_record(run)
    assert record["batching"] is True and "--continuous-batching" in record["argv"]
    assert "continuous batching" in llmtui("serve", run.name, "--status", runs_dir=run.parent).stdout
    chat = f"http://127.0.0.1:{port}/v1/chat/completions"
    own = _own_answers(run)
    assert len(set(own)) > 1 and all(own)

    def ask(question):
        return post_json(chat, {"model": run.name, "messages": [{"role": "user", "content": question}],
                            "temperature": 0, "max_tokens": MAX_TOKENS})

    post_json(chat, {"model": run.name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})  # warm
    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        answers = list(pool.map(ask, QUESTIONS))
    assert [code for code, _ in answers] == [200] * len(QUESTIONS)
    assert [body["choices"][0]["message"]["content"] for _, body in answers] == own

    with ThreadPoolExecutor(len(QUESTIONS)) as pool:
        streams = list(pool.map(lambda q: _streamed(chat, {"model": run.name, "max_tokens": MAX_TOKENS,
                                                           "messages": [{"role": "user", "content": q}]}),
                                QUESTIONS))
    assert [s["text"] for s in streams] == own
    first_end = min(s["done"] for s in streams)
    started_together = sum(1 for s in streams if s["first"] is not None and s["first"] < first_end)
    assert started_together >= len(QUESTIONS) // 2, [(s["first"], s["done"]) for s in streams]  # one batch

    # what one batch cannot do per request is refused, naming the fix
    code, body = post_json(chat, {"model": run.name, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0.7})
    assert code == 400 and body["error"]["param"] == "temperature"
    assert "without --continuous-batching" in body["error"]["message"]
    code, body = post_json(f"http://127.0.0.1:{port}/v1/completions", {"model": run.name, "prompt": "The"})
    assert code == 400 and "--continuous-batching" in body["error"]["message"]

    # stop strings: cut by llmtui, streamed or not
    text = own[0]
    stop = text[2:4]
    code, cut = post_json(chat, {"model": run.name, "messages": [{"role": "user", "content": QUESTIONS[0]}],
                             "temperature": 0, "max_tokens": MAX_TOKENS, "stop": [stop]})
    assert code == 200 and cut["choices"][0]["message"]["content"] == text[:text.find(stop)].strip()
    assert cut["choices"][0]["finish_reason"] == "stop"
    streamed = _streamed(chat, {"model": run.name, "messages": [{"role": "user", "content": QUESTIONS[0]}],
                                "max_tokens": MAX_TOKENS, "stop": stop})
    assert streamed["text"] == text[:text.find(stop)].strip() and streamed["finish"] == "stop"
    assert served.stop(run)


def test_what_one_batch_cannot_keep_is_refused_before_anything_starts(served_run):
    run = served_run
    other = run.parent / "copy"
    shutil.copytree(run, other)
    both = llmtui("serve", run.name, "copy", "--continuous-batching", "--port", str(free_port()),
                  runs_dir=run.parent)
    assert both.returncode == 2 and "serves one run" in both.stderr, both.stderr
    recipe = other / "recipe.toml"
    text = recipe.read_text()
    assert "repetition_penalty = 1.0" in text
    recipe.write_text(text.replace("repetition_penalty = 1.0", "repetition_penalty = 1.2"))
    penalty = llmtui("serve", "copy", "--continuous-batching", "--port", str(free_port()), runs_dir=run.parent)
    assert penalty.returncode == 2 and "repetition_penalty is 1.2" in penalty.stderr, penalty.stderr
    assert "llmtui serve copy" in penalty.stderr
    assert not served.record_path(run).exists() and not served.record_path(other).exists()
