"""`llmtui serve RUN_A RUN_B`: two LoRA runs of the tiny model served by one server, the base loaded
once and each run's adapter on it. /v1/models lists both, a request's `model` picks the adapter, and
answers asked at once, the two runs interleaved, equal each run's own answer (its model loaded alone,
as `llmtui chat` loads it): peft's active adapter never leaks from one request into another. The
record, --status, --stop and the queue claim cover both runs; a full-weight run, or another base,
is refused before anything starts."""

from __future__ import annotations

import importlib.util
import json
import shutil
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.after_runs import lora_run, lora_run_b, sft_run
from tests.e2e.helpers import free_port, llmtui, post_json
from tuiapp.core.machine.gpus import cuda_available
from tuiapp.core.store import queue, served

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What is the capital of Japan?"}]
PROMPTS = ["The capital of France is", "Question: What is the capital of Japan?\nAnswer:"]


@pytest.fixture
def two_loras(tmp_path_factory, tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    paths = []
    for source in (lora_run(tmp_path_factory), lora_run_b(tmp_path_factory)):
        shutil.copytree(source, root / source.name)
        paths.append(root / source.name)
    yield paths
    for path in paths:
        served.stop(path, grace_s=5)


def _own_answers(run) -> dict:
    """The run's own greedy answers, its model loaded alone (as `llmtui chat` and a one-run server do)."""
    import torch

    from tuiapp.core.after.targets import model_target
    from tuiapp.trainer.tools import inference

    target = model_target(run)
    loaded = inference.load("tuned", target)
    settings = inference.frozen_recipe(run).generate.model_copy(update={"temperature": 0.0, "max_new_tokens": 12})
    chat = inference.generate(loaded, QUESTION, settings)["text"]
    texts = []
    for prompt in PROMPTS:
        ids = loaded.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = loaded.model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                        dtype=torch.long), max_new_tokens=10, do_sample=False,
                                        pad_token_id=loaded.tokenizer.pad_token_id)
        texts.append(loaded.tokenizer.decode(out[0, len(ids):], skip_special_tokens=True))
    return {"chat": chat, "completions": texts}


def test_two_lora_runs_on_one_base_answer_each_as_alone(two_loras):
    a, b = two_loras
    port = free_port()
    started = llmtui("serve", a.name, b.name, "--port", str(port), runs_dir=a.parent, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    assert f'models "{a.name}", "{b.name}"' in started.stdout
    base = f"http://127.0.0.1:{port}/v1"
    listed = json.loads(urllib.request.urlopen(f"{base}/models", timeout=30).read())
    assert [m["id"] for m in listed["data"]] == [a.name, b.name]
    assert [m["root"] for m in listed["data"]] == [str(a / "final"), str(b / "final")]

    own = {run.name: _own_answers(run) for run in (a, b)}
    assert own[a.name]["completions"] != own[b.name]["completions"]  # two adapters that answer apart

    def ask(job):
        model, kind, index = job
        if kind == "chat":
            code, body = post_json(f"{base}/chat/completions", {"model": model, "messages": QUESTION, "temperature": 0,
                                                             "max_tokens": 12})
            return code, body["choices"][0]["message"]["content"] if code == 200 else body
        code, body = post_json(f"{base}/completions", {"model": model, "prompt": PROMPTS[index], "temperature": 0,
                                                    "max_tokens": 10})
        return code, body["choices"][0]["text"] if code == 200 else body

    jobs = [(run.name, kind, index) for index in (0, 1) for kind in ("chat", "completions") for run in (a, b)] * 2
    with ThreadPoolExecutor(8) as pool:  # both runs' requests in the server at once, interleaved
        answers = list(pool.map(ask, jobs))
    for (model, kind, index), (code, text) in zip(jobs, answers, strict=True):
        expected = own[model]["chat"] if kind == "chat" else own[model]["completions"][index]
        assert code == 200 and text == expected, (model, kind, index, text, expected)

    code, body = post_json(f"{base}/chat/completions", {"model": "gpt-4o", "messages": QUESTION})
    assert code == 404 and body["error"]["param"] == "model"
    assert a.name in body["error"]["message"] and b.name in body["error"]["message"]

    # one server, two records: each run reads served, with the other; one queue claim
    ra, rb = served.read_record(a), served.read_record(b)
    assert ra["pid"] == rb["pid"] and ra["runs"] == rb["runs"] == [a.name, b.name]
    assert (ra["model"], rb["model"]) == (a.name, b.name)
    status = llmtui("serve", "--status", runs_dir=a.parent)
    url = served.url_of(ra)
    assert f"{a.name}: serving  {url}" in status.stdout and f"{b.name}: serving  {url}" in status.stdout
    assert f"with {b.name}" in status.stdout
    listed = {m.run_id: m for m in served.served_models([a, b])}
    assert listed[a.name].shared == (b.name,) and listed[b.name].shared == (a.name,)
    assert list(served.queue_claims(a.parent)) == [a.name]
    listed = llmtui("queue", runs_dir=a.parent)
    assert f"served by `llmtui serve`: {a.name} with {b.name} (one server) (no GPU, no CPU slot)" in listed.stdout

    # stopping either stops the one server: both records read stopped, the claim is gone
    stopped = llmtui("serve", b.name, "--stop", runs_dir=a.parent)
    assert stopped.returncode == 0 and f"with {a.name}" in stopped.stdout
    assert served.state(served.read_record(a)) == served.state(served.read_record(b)) == served.STOPPED
    assert queue.claims(a.parent) == {}


def test_a_full_run_or_another_base_is_refused_before_anything_starts(two_loras, tmp_path_factory):
    a, b = two_loras
    full = sft_run(tmp_path_factory)
    shutil.copytree(full, a.parent / full.name)
    refused = llmtui("serve", a.name, full.name, "--port", str(free_port()), runs_dir=a.parent)
    assert refused.returncode == 2 and "is a full model" in refused.stderr, refused.stderr
    assert "serve them separately" in refused.stderr
    # b's adapter recorded on another base (the full run's model folder)
    info = b / "final" / "llmtui.json"
    meta = json.loads(info.read_text())
    meta["base_model"] = str(a.parent / full.name / "final")
    info.write_text(json.dumps(meta))
    other = llmtui("serve", a.name, b.name, "--port", str(free_port()), runs_dir=a.parent)
    assert other.returncode == 2 and "one server holds one base model" in other.stderr, other.stderr
    twice = llmtui("serve", a.name, a.name, "--port", str(free_port()), runs_dir=a.parent)
    assert twice.returncode == 2 and "named twice" in twice.stderr
    checkpoint = llmtui("serve", a.name, b.name, "--checkpoint", "3", runs_dir=a.parent)
    assert checkpoint.returncode == 2 and "--checkpoint" in checkpoint.stderr
    assert not any(served.record_path(p).exists() for p in (a, b, a.parent / full.name))


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not cuda_available(), reason="needs CUDA and vllm")
def test_vllm_serves_both_adapters_as_its_lora_modules(two_loras):
    """On CUDA with vllm: one vLLM server, the base with both runs' adapters (--lora-modules), each a
    model of /v1/models answering by its own name."""
    a, b = two_loras
    port = free_port()
    started = llmtui("serve", a.name, b.name, "--backend", "vllm", "--port", str(port), runs_dir=a.parent,
                     timeout=900)
    assert started.returncode == 0, started.stdout + started.stderr
    record = served.read_record(a)
    assert record["backend"] == "vllm" and served.read_record(b)["pid"] == record["pid"]
    assert f"{a.name}={a / 'final'}" in record["argv"] and f"{b.name}={b / 'final'}" in record["argv"]
    base = f"http://127.0.0.1:{port}/v1"
    ids = [m["id"] for m in json.loads(urllib.request.urlopen(f"{base}/models", timeout=30).read())["data"]]
    assert a.name in ids and b.name in ids
    for run in (a, b):
        code, body = post_json(f"{base}/completions", {"model": run.name, "prompt": PROMPTS[0], "max_tokens": 4,
                                                    "temperature": 0})
        assert code == 200 and body["model"] == run.name, body
    assert llmtui("serve", a.name, "--stop", runs_dir=a.parent, timeout=120).returncode == 0
