"""grpo/rloo with method.vllm_mode = 'server': the rules before launch, the GPUs it takes, its
command, the estimate, its readiness against real processes, doctor, and an adopting supervisor
ending a server left alone. The server itself (vLLM) needs CUDA: its run is in
tests/e2e/test_generation_server_gpu.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil

from tuiapp.core.config.recipe import LaunchSpec, load_recipe, parse_recipe
from tuiapp.core.lifecycle import doctor
from tuiapp.core.lifecycle.supervisor import _only_server_left
from tuiapp.core.machine.gpus import GpuInfo
from tuiapp.core.plan import generation_server, launcher
from tuiapp.core.plan.estimate import PRESET_CONFIGS, estimate_recipe, format_estimate
from tuiapp.core.prelaunch import resources, rl
from tuiapp.core.store import queue
from tuiapp.core.store.runs import RunStore

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "recipes" / "gpu-qwen-0.5b-grpo-vllm-server.toml"


def server_recipe(method: str = "", launch: str = "", model: str = "Qwen/Qwen2.5-0.5B-Instruct"):
    return parse_recipe(f"""
name = "srv"
[model]
name = "{model}"
[dataset]
name = "demo:arith"
[method]
kind = "grpo"
num_generations = 4
max_completion_length = 16
generation_backend = "vllm"
vllm_mode = "server"
{method}
[[method.rewards]]
kind = "format"
pattern = "answer"
[train]
micro_batch = 8
max_steps = 2
precision = "bf16"
[launch]
{launch}
""")


def findings(recipe, gpus: int, key: str | None = None) -> list:
    found = rl.rules(recipe, ranks=1, cuda=True, vllm_installed=True, gpu_count=gpus)
    return [f for f in found if f.level == "error" and (key is None or f.key == key)]


def test_the_server_needs_gpus_of_its_own_besides_the_ranks():
    one = server_recipe(launch="gpus = 1")
    error = findings(one, gpus=1, key="method.vllm_server_gpus")[0]
    assert "need 2 GPUs" in error.message and "has 1" in error.message and "vllm_mode = 'colocate'" in error.fix
    assert not findings(one, gpus=2)
    assert findings(server_recipe(method="vllm_server_gpus = 2", launch="gpus = 2"), gpus=3,
                    key="method.vllm_server_gpus")
    assert not findings(server_recipe(method="vllm_server_gpus = 2", launch="gpus = 'all'"), gpus=3)
    assert findings(server_recipe(launch="gpus = 'all'"), gpus=1, key="method.vllm_server_gpus")  # none left to train
    listed = rl.rules(server_recipe(launch="gpus = [1, 2]"), ranks=2, cuda=True, vllm_installed=True, gpu_count=4)
    assert "GPU(s) 0" in next(f.message for f in listed if f.level == "info" and f.key == "method.vllm_server_gpus")


def test_the_server_is_refused_across_nodes_and_for_a_bundled_model():
    assert findings(server_recipe(launch="nodes = 2\ngpus_per_node = 1"), gpus=4, key="method.vllm_mode")
    bundled = findings(server_recipe(model="tiny"), gpus=2, key="model.name")[0]
    assert "built inside the ranks" in bundled.message and "generation_backend = 'transformers'" in bundled.fix
    # colocated vLLM has none of these rules
    colocated = server_recipe(method="", launch="gpus = 1").model_copy(deep=True)
    colocated.method.vllm_mode = "colocate"
    assert not findings(colocated, gpus=1)


def test_the_ranks_and_the_server_split_the_gpus():
    assert generation_server.split_devices([0, 1], 1, 4) == ([0, 1], [2])
    assert generation_server.split_devices([1, 2], 2, 4) == ([1, 2], [0, 3])
    assert generation_server.split_devices([0], 1, 4, taken=[3, 5]) == ([3], [5])  # the queue's pick: ranks first
    assert generation_server.split_devices([0, 1], 0, 4, taken=[0, 1]) == ([0, 1], [])
    assert launcher.plan_ranks(LaunchSpec(gpus="all"), 4, reserved=1) == (3, None)
    gpus = [GpuInfo(i, "H100", 80 * 10**9, 0) for i in range(4)]
    recipe = server_recipe(method="vllm_server_gpus = 2", launch="gpus = 'all'")
    assert resources.requested_gpus(recipe, gpus) == [0, 1]
    assert resources.launch_world(recipe, gpus, cuda=True).size == 2  # the rules' micro_batch x ranks counts 2
    assert generation_server.server_gpu_count(recipe) == 2
    colocated = recipe.model_copy(deep=True)
    colocated.method.vllm_mode = "colocate"
    assert generation_server.server_gpu_count(colocated) == 0 and resources.requested_gpus(colocated, gpus) == [0, 1, 2, 3]


def test_the_queue_claims_the_servers_gpus_with_the_runs():
    gpus = [GpuInfo(i, "H100", 80 * 10**9, 0) for i in range(4)]
    assert generation_server.devices_wanted(2, None, 0, 4, queued=False) == 2  # no server: as before
    assert generation_server.devices_wanted(1, None, 1, 4, queued=False) == [0, 1]
    assert generation_server.devices_wanted(1, [2], 1, 4, queued=True) == [2, 0]
    want = generation_server.devices_wanted(1, None, 2, 4, queued=True)
    taken = queue.fit(want, cuda_gpus=gpus, live={"other": {"devices": [0]}}, slots=1)
    assert taken == [1, 2, 3]
    assert generation_server.split_devices([0], 2, 4, taken=taken) == ([1], [2, 3])
    # a second run waits: the server's GPUs are held like the ranks'
    assert queue.fit(1, cuda_gpus=gpus, live={"other": {"devices": [0]}, "grpo": {"devices": taken}}, slots=1) is None


def test_the_server_command_is_trl_vllm_serve_on_loopback():
    recipe = server_recipe(method="vllm_server_gpus = 2")
    argv = generation_server.server_argv(recipe, "/models/qwen", 8123, python="/venv/bin/python")
    assert argv[:3] == ["/venv/bin/python", "-m", "trl.scripts.vllm_serve"]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert pairs["--model"] == "/models/qwen" and pairs["--host"] == "127.0.0.1" and pairs["--port"] == "8123"
    assert pairs["--tensor_parallel_size"] == "2" and pairs["--dtype"] == "bfloat16"
    assert pairs["--gpu_memory_utilization"] == "0.9"  # alone on its GPUs unless the recipe says otherwise
    assert pairs["--max_model_len"] == str(recipe.train.max_seq_len)
    shared = server_recipe(method="vllm_gpu_memory_utilization = 0.5")
    assert "0.5" in generation_server.server_argv(shared, "m", 1)
    env = generation_server.rank_env("http://127.0.0.1:8123", 51300)
    assert env == {generation_server.URL_ENV: "http://127.0.0.1:8123", generation_server.GROUP_PORT_ENV: "51300"}


def test_the_estimate_shows_the_server_on_its_own_gpus_and_leaves_the_ranks_whole():
    recipe = server_recipe(launch="gpus = 1")
    config = PRESET_CONFIGS["Qwen/Qwen2.5-0.5B-Instruct"]
    est = estimate_recipe(recipe, config, 1, gpu_memory_bytes=80 * 10**9)
    assert est.generation_share == 0.0 and est.server_gpus == 1 and est.server_share == 0.9
    text = format_estimate(est)
    assert "1 GPU of its own" in text and "90% of each GPU" in text


def test_the_gpu_server_preset_is_valid_and_refused_on_cpu_with_the_fix():
    recipe = load_recipe(PRESET)
    assert recipe.method.vllm_mode == "server" and recipe.method.adapter.kind == "lora"
    cpu = rl.rules(recipe, ranks=1, cuda=False)
    assert "generation_backend = 'transformers'" in next(f.fix for f in cpu if f.key == "method.generation_backend")
    assert not findings(recipe, gpus=2)


# ---------------------------------------------------------------- readiness, against real processes


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_server_is_ready_when_it_answers_health(tmp_path):
    served = tmp_path / "served"
    served.mkdir()
    (served / "health").write_text("ok")
    port = launcher.free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(served)]
    process = generation_server.start(tmp_path, argv, [3])
    try:
        ready = generation_server.wait_ready(process, f"http://127.0.0.1:{port}", 60, tmp_path, poll_s=0.2)
        assert ready.ready and ready.reason is None
    finally:
        process.terminate()
        process.wait(10)
    log = generation_server.log_path(tmp_path).read_text()
    assert log.startswith("$ ") and "http.server" in log.splitlines()[0]


def test_a_server_that_dies_or_hangs_fails_with_its_last_log_line(tmp_path):
    died = generation_server.start(tmp_path, _python("import sys; print('CUDA out of memory while loading'); "
                                                     "sys.exit(3)"), [1])
    port = launcher.free_port()
    result = generation_server.wait_ready(died, f"http://127.0.0.1:{port}", 60, tmp_path, poll_s=0.1)
    assert not result.ready and "exited with code 3" in result.reason
    assert "CUDA out of memory while loading" in result.reason and "vllm-server.log" in result.reason
    hung = generation_server.start(tmp_path, _python("import time; time.sleep(60)"), [1])
    try:
        result = generation_server.wait_ready(hung, f"http://127.0.0.1:{port}", 0.5, tmp_path, poll_s=0.1)
        assert not result.ready and "did not answer within" in result.reason and "vllm_server_timeout_s" in result.reason
        stopped = generation_server.wait_ready(hung, f"http://127.0.0.1:{port}", 60, tmp_path,
                                               stopped=lambda: True, poll_s=0.1)
        assert not stopped.ready and "stopped" in stopped.reason
    finally:
        hung.kill()
        hung.wait(10)
    assert "code 9" in generation_server.died_reason(9, tmp_path)


def test_the_server_gets_only_its_gpus(tmp_path):
    printer = generation_server.start(tmp_path, _python("import os; print('visible', os.environ['CUDA_VISIBLE_DEVICES'])"), [2, 3])
    assert printer.wait(30) == 0
    assert "visible 2,3" in generation_server.log_path(tmp_path).read_text()


# ---------------------------------------------------------------- doctor and adoption


def test_doctor_shows_the_server_and_its_stack(tmp_path):
    store = RunStore(tmp_path / "runs")
    run = store.create(server_recipe())
    server = subprocess.Popen([sys.executable, "-c", "import time\ndef serving():\n    time.sleep(120)\nserving()"])
    try:
        time.sleep(0.5)
        run.update(status="starting", phase="starting vLLM server", started=time.time(), world_size=1,
                   generation_server={"pid": server.pid, "gpus": [1], "url": "http://127.0.0.1:9", "log":
                                      generation_server.LOG_NAME})
        report = doctor.diagnose(store.get(run.id), timeout_s=20)
        assert f"vLLM generation server  pid {server.pid}  GPUs [1]" in report and "starting at" in report
        if doctor.py_spy():
            assert "serving" in report  # the server's own stack
    finally:
        server.kill()
        server.wait(10)


def test_an_adopting_supervisor_ends_a_server_left_alone():
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                               "time.sleep(60)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 20
        while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
            time.sleep(0.1)
        family = [psutil.Process(parent.pid), *psutil.Process(parent.pid).children()]
        assert len(family) == 2
        assert _only_server_left(family, parent.pid)
        assert not _only_server_left([*family, psutil.Process(other.pid)], parent.pid)  # a rank is still there
    finally:
        for process in psutil.Process(parent.pid).children() + [parent, other]:
            process.kill()
        parent.wait(10)
        other.wait(10)
