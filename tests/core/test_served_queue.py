"""A served model in the device queue (tuiapp.core.store.served): its claim is owned by the server's real
process, holds a GPU under vLLM so queued runs wait for it, holds nothing on the CPU, and goes when
the server is stopped or dies. The real `llmtui serve` server's claim is in
tests/e2e/test_serve_supervised.py."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from tuiapp.core.common.errors import RunError
from tuiapp.core.machine.gpus import GpuInfo
from tuiapp.core.store import queue, served

GPUS = [GpuInfo(i, "H100", 80 * 10**9, 0) for i in range(2)]


def server_process() -> subprocess.Popen:
    """A stand-in server: a real process in its own session, as `llmtui serve` starts one."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                            stdin=subprocess.DEVNULL)


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "runs" / "20260101-000000-tiny-abc"
    path.mkdir(parents=True)
    return path


def serve(run_dir, backend: str, gpus=GPUS) -> subprocess.Popen:
    with queue.decision_lock(run_dir.parent):
        devices = served.take_devices(run_dir, backend, gpus)
        proc = server_process()
        served.claim(run_dir, devices, proc.pid, psutil.Process(proc.pid).create_time())
    served.write_record(run_dir, {"pid": proc.pid, "pgid": proc.pid, "backend": backend, "port": 9,
                                  "create_time": psutil.Process(proc.pid).create_time(), "gpus": devices})
    return proc


def test_a_vllm_server_holds_its_gpu_and_queued_runs_wait_for_it(run_dir):
    proc = serve(run_dir, "vllm")
    try:
        live = queue.claims(run_dir.parent)
        claim = live[served.claim_id(run_dir)]
        assert claim["devices"] == [0] and claim["pid"] == claim["pgid"] == proc.pid and claim["slots_used"] == 0
        assert served.queue_claim(run_dir)["devices"] == [0]
        assert served.queue_claims(run_dir.parent) == {run_dir.name: claim}
        assert queue.fit(2, cuda_gpus=GPUS, live=live, slots=1) is None  # a 2-GPU run waits for the server
        assert queue.fit(1, cuda_gpus=GPUS, live=live, slots=1) == [1]
        assert queue.fit([0], cuda_gpus=GPUS, live=live, slots=1) is None
        # a second served model takes the other GPU; a third is refused, naming who holds them
        other = run_dir.parent / "20260101-000001-other-def"
        other.mkdir()
        serve(other, "vllm")
        try:
            assert served.queue_claim(other)["devices"] == [1]
            with pytest.raises(RunError, match=r"no free GPU to serve on: held by .*abc.serve \(GPUs \[0\]\)"):
                served.take_devices(run_dir.parent / "third", "vllm", GPUS)
        finally:
            served.stop(other, grace_s=5)
        # stopped: its claim goes with it, and the GPU is free again
        assert served.stop(run_dir, grace_s=5)
        assert served.claim_id(run_dir) not in queue.claims(run_dir.parent)
        assert queue.fit(2, cuda_gpus=GPUS, live=queue.claims(run_dir.parent), slots=1) == [0, 1]
    finally:
        proc.kill()
        proc.wait()


def test_a_dead_server_leaves_no_claim(run_dir):
    proc = serve(run_dir, "vllm")
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while psutil.pid_exists(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.queue_claim(run_dir) is None  # pruned: no process of the server is left
    assert not queue.claim_path(run_dir.parent, served.claim_id(run_dir)).exists()
    assert queue.fit(2, cuda_gpus=GPUS, live=queue.claims(run_dir.parent), slots=1) == [0, 1]


def test_on_the_cpu_a_served_model_takes_no_slot(run_dir):
    serve(run_dir, "transformers", gpus=[])
    try:
        live = queue.claims(run_dir.parent)
        assert live[served.claim_id(run_dir)]["devices"] == [] and live[served.claim_id(run_dir)]["slots_used"] == 0
        assert queue.fit(1, cuda_gpus=[], live=live, slots=1) == []  # a queued CPU run still starts
        assert queue.fit(1, cuda_gpus=[], live={**live, "a-run": {"slots_used": 1}}, slots=1) is None
    finally:
        served.stop(run_dir, grace_s=5)
    assert served.queue_claim(run_dir) is None


def test_the_transformers_backend_claims_no_gpu_and_sees_none():
    assert served.take_devices("runs/x", "transformers", GPUS) == []
    assert served.server_env({"A": "1"}, "transformers", [])["CUDA_VISIBLE_DEVICES"] == ""
    assert served.server_env({}, "vllm", [1])["CUDA_VISIBLE_DEVICES"] == "1"
