"""`llmtui serve` supervised like a run, with the real server of the finished tiny SFT run on CPU:
it claims in the device queue (owned by its own process, no GPU and no CPU slot on the CPU),
`llmtui doctor` of the finished run shows the server's state and Python stack, `--status` says
where it is, and the claim goes when the server stops or dies (kill -9). On CUDA with vllm, its server
holds its GPU alone."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time

import psutil
import pytest

from tests.e2e.helpers import llmtui
from tuiapp.core.machine.gpus import cuda_available, detect_gpus
from tuiapp.core.plan import launcher
from tuiapp.core.store import queue, served

pytestmark = pytest.mark.slow


@pytest.fixture
def run(served_run):
    return served_run


def test_queue_claim_doctor_and_the_claim_gone_when_stopped_or_dead(run):
    root = run.parent
    port = launcher.free_port()
    started = llmtui("serve", run.name, "--port", str(port), runs_dir=root, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    record = served.read_record(run)
    claim = queue.claims(root)[served.claim_id(run)]
    assert claim["pid"] == claim["pgid"] == record["pid"] and claim["devices"] == [] and claim["slots_used"] == 0
    assert record["gpus"] == []
    listed = llmtui("queue", runs_dir=root)
    assert f"served by `llmtui serve`: {run.name} (no GPU, no CPU slot)" in listed.stdout, listed.stdout
    # a queued CPU run is not held back by it (1 slot)
    assert queue.fit(1, cuda_gpus=[], live=queue.claims(root), slots=1) == []
    # the server sees no GPU (the transformers backend answers on the CPU)
    assert psutil.Process(record["pid"]).environ().get("CUDA_VISIBLE_DEVICES") == ""

    # doctor of the finished run: the served model's state and stack, no refusal
    report = llmtui("doctor", run.name, runs_dir=root, timeout=120)
    assert report.returncode == 0, report.stderr
    assert f"served model (transformers)  pid {record['pid']}  serving on http://localhost:{port}/v1" in report.stdout
    assert "Thread" in report.stdout and "uvicorn/server.py" in report.stdout  # its Python stack, by py-spy
    status = json.loads(llmtui("serve", run.name, "--status", "--json", runs_dir=root).stdout)
    assert status["state"] == "serving" and status["gpus"] == []

    # stopped: the claim goes; doctor refuses as for any run without a live process
    assert llmtui("serve", run.name, "--stop", runs_dir=root).returncode == 0
    assert not queue.claim_path(root, served.claim_id(run)).exists()
    refused = llmtui("doctor", run.name, runs_dir=root)
    assert refused.returncode == 2 and "no live rank" in refused.stderr

    # served again, then killed: the queue prunes the dead server's claim
    again = llmtui("serve", run.name, "--port", str(port), "--no-wait", runs_dir=root, timeout=120)
    assert again.returncode == 0, again.stderr
    pid = served.read_record(run)["pid"]
    assert served.claim_id(run) in queue.claims(root)
    os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while served.alive(served.read_record(run)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert served.state(served.read_record(run)) == served.EXITED
    assert served.claim_id(run) not in queue.claims(root)
    assert not queue.claim_path(root, served.claim_id(run)).exists()


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None or not cuda_available(), reason="needs CUDA and vllm")
def test_a_vllm_server_claims_its_gpu_alone(run):
    """On CUDA, vLLM's server gets the lowest free GPU, alone in its CUDA_VISIBLE_DEVICES, and holds it in
    the queue (checked while it loads, whatever vLLM makes of the tiny model); stopped, the GPU is free."""
    root = run.parent
    gpus = detect_gpus()
    expected = queue.fit(1, cuda_gpus=gpus, live=queue.claims(root), slots=1)
    assert expected is not None, "no free GPU on this machine"
    started = llmtui("serve", run.name, "--backend", "vllm", "--port", str(launcher.free_port()), "--no-wait",
                     runs_dir=root, timeout=120)
    assert started.returncode == 0, started.stdout + started.stderr
    record = served.read_record(run)
    assert record["backend"] == "vllm" and record["gpus"] == expected
    assert queue.claims(root)[served.claim_id(run)]["devices"] == expected
    env = psutil.Process(record["pid"]).environ()
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, expected))
    assert queue.fit(expected, cuda_gpus=gpus, live=queue.claims(root), slots=1) is None  # a run naming it waits
    assert llmtui("serve", run.name, "--stop", runs_dir=root, timeout=120).returncode == 0
    assert served.claim_id(run) not in queue.claims(root)
