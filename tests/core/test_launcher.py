import json
import os
from pathlib import Path

import pytest

from tuiapp.core.common.errors import RunError
from tuiapp.core.config.recipe import LaunchSpec
from tuiapp.core.plan.launcher import deepspeed_argv, plan_ranks, supervisor_argv, world_note


def _world(argv):
    import base64
    import json

    (arg,) = [a for a in argv if a.startswith("--world_info=")]
    return json.loads(base64.urlsafe_b64decode(arg.split("=", 1)[1]))


def test_deepspeed_argv_golden():
    """DeepSpeed's per-node launcher, as the `deepspeed` command would start it on one node."""
    argv = deepspeed_argv(Path("/r/run1"), 2, None, 29555, python="/py")
    assert argv == ["/py", "-u", "-m", "deepspeed.launcher.launch", "--world_info=eyJsb2NhbGhvc3QiOiBbMCwgMV19",
                    "--master_addr=127.0.0.1", "--master_port=29555", "--module",
                    "--enable_each_rank_log=/r/run1/ranks", "--log_level=info", "tuiapp.trainer",
                    "--run-dir", "/r/run1"]
    assert _world(argv) == {"localhost": [0, 1]}
    assert '{"localhost": [0, 1]}' in world_note(argv) and world_note(["--num_gpus", "2"]) is None
    argv = deepspeed_argv(Path("/r/run1"), 2, [1, 3], 29555, resume=True, python="/py")
    assert _world(argv) == {"localhost": [1, 3]} and argv[-1] == "--resume"


@pytest.mark.slow  # over ~5 s on 2 cores
def test_the_launch_command_is_the_one_deepspeeds_runner_builds(tmp_path):
    """The same argv as `deepspeed --num_gpus 2 --master_port P --enable_each_rank_log D --module M`
    hands to deepspeed.launcher.launch on one node (its runner logs the command it starts)."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "pkg"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "deepspeed.launcher.runner", "--master_port", "29555",
                          "--num_gpus", "2", "--enable_each_rank_log", str(tmp_path / "ranks"), "--module", "pkg"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    started = [line.split("cmd = ", 1)[1].split() for line in (out.stdout + out.stderr).splitlines()
               if "cmd = " in line]
    assert started, out.stdout + out.stderr
    from tuiapp.core.plan.launcher import local_launch_argv

    assert started[0] == local_launch_argv("pkg", 2, None, 29555, rank_logs=tmp_path / "ranks")


@pytest.mark.slow  # over ~5 s on 2 cores
def test_a_single_rank_starts_as_deepspeeds_launcher_would_start_it(tmp_path):
    """One rank without the launcher: the same environment and arguments as the rank DeepSpeed's
    per-node launcher starts (each run records what its rank saw)."""
    import os
    import subprocess
    import sys

    from tuiapp.core.plan.launcher import local_launch_argv, single_rank_argv

    fake = tmp_path / "pkg"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(
        "import json, os, sys\n"
        "out = os.environ['SEEN']\n"
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, open(out, 'w'))\n")
    base = {**os.environ, "PYTHONPATH": str(tmp_path)}
    base.pop("CUDA_VISIBLE_DEVICES", None)
    run_dir = tmp_path / "run"
    launched = local_launch_argv("pkg", 1, None, 29555, python=sys.executable) + ["--run-dir", str(run_dir)]
    direct = single_rank_argv("pkg", None, 29555, python=sys.executable) + ["--run-dir", str(run_dir)]
    seen = {}
    for name, argv in (("launcher", launched), ("direct", direct)):
        subprocess.run(argv, env={**base, "SEEN": str(tmp_path / name)}, cwd=tmp_path, timeout=300, check=True,
                       capture_output=True)
        seen[name] = json.loads((tmp_path / name).read_text())
        seen[name]["env"].pop("SEEN")
        seen[name]["env"].pop("_", None)  # the program a shell would have run
    assert seen["direct"]["argv"] == seen["launcher"]["argv"] == ["--local_rank=0", "--run-dir", str(run_dir)]
    launcher_env, direct_env = seen["launcher"]["env"], seen["direct"]["env"]
    assert {k: v for k, v in launcher_env.items() if base.get(k) != v} == \
        {k: v for k, v in direct_env.items() if base.get(k) != v}
    assert direct_env["RANK"] == "0" and direct_env["WORLD_SIZE"] == "1" and direct_env["MASTER_PORT"] == "29555"


def test_single_rank_argv_golden(monkeypatch):
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    from tuiapp.core.plan.launcher import master_port_of

    argv = deepspeed_argv(Path("/r/run1"), 1, [3], 29555, resume=True, python="/py")
    assert argv == ["env", "CUDA_VISIBLE_DEVICES=3", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29555", "WORLD_SIZE=1",
                    "CROSS_RANK=0", "CROSS_SIZE=1", "LOCAL_SIZE=1", "RANK=0", "LOCAL_RANK=0",
                    "PYTORCH_NVML_BASED_CUDA_CHECK=1", "/py", "-u", "-m",
                    "tuiapp.trainer", "--local_rank=0", "--run-dir", "/r/run1", "--resume"]
    assert master_port_of(argv) == "29555"


def test_supervisor_argv_golden():
    assert supervisor_argv(Path("/r/x"), python="/py") == ["/py", "-m", "tuiapp.core.lifecycle.supervisor", "/r/x"]


@pytest.mark.parametrize(
    "gpus, cuda, expected",
    [("all", 0, (1, None)), (2, 0, (2, None)), ([0, 1], 0, (2, None)), ("all", 4, (4, None)), ([1, 2], 4, (2, [1, 2]))],
)
def test_plan_ranks(gpus, cuda, expected):
    assert plan_ranks(LaunchSpec(gpus=gpus), cuda) == expected


def test_plan_ranks_rejects_missing_gpus():
    with pytest.raises(RunError) as info:
        plan_ranks(LaunchSpec(gpus=8), 2)
    assert info.value.key == "launch.gpus"
    with pytest.raises(RunError):
        plan_ranks(LaunchSpec(gpus=[5]), 2)


def test_master_port_of_a_recorded_command():
    from tuiapp.core.plan.launcher import master_port_of

    assert master_port_of(["python", "-m", "deepspeed.launcher.runner", "--master_port", "29501"]) == "29501"
    assert master_port_of(deepspeed_argv(Path("/r"), 1, None, 29502)) == "29502"
    assert master_port_of(["--master_port=7"]) == "7"
    assert master_port_of(None) is None and master_port_of(["--master_port"]) is None


def test_rank_env_defaults_and_the_users_settings(tmp_path):
    from tuiapp.core.plan.launcher import rank_env

    env = rank_env(2, base={"LLMTUI_CACHE": str(tmp_path)})
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert env["PYTHONUNBUFFERED"] == "1" and env["TOKENIZERS_PARALLELISM"] == "false"
    assert env["TORCH_EXTENSIONS_DIR"].startswith(str(tmp_path))
    assert env["OMP_NUM_THREADS"] == str(max(1, (os.cpu_count() or 1) // 2))  # the cores shared by 2 ranks
    mine = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:512", "OMP_NUM_THREADS": "3", "TORCH_EXTENSIONS_DIR": "/x"}
    env = rank_env(2, base=mine)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and env["PYTORCH_ALLOC_CONF"] == "max_split_size_mb:512"
    assert env["OMP_NUM_THREADS"] == "3" and env["TORCH_EXTENSIONS_DIR"] == "/x"
    assert rank_env(base={"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.8"})[
        "PYTORCH_CUDA_ALLOC_CONF"] == "garbage_collection_threshold:0.8"
