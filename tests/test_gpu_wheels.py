"""`make gpu-wheels` (tools/wheelhouse.py gpu): the GPU check's optional packages as pinned wheels for a
box without an index, binary only, no dependencies (torch and triton are there already)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_wheels_downloads_the_pinned_optional_packages_binary_only(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "wheelhouse.py"), "gpu", str(tmp_path), "--print"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert [line.split()[-1] for line in lines] == ["liger-kernel==0.8.5", "torchao==0.18.0", "bitsandbytes==0.50.2"]
    for line in lines:
        assert "--no-deps" in line and "--only-binary=:all:" in line and "--python-version 3.12" in line
        assert "manylinux_2_28_x86_64" in line and str(tmp_path) in line


def test_gpu_wheels_base_puts_first_what_a_box_with_only_torch_lacks(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "wheelhouse.py"), "gpu", str(tmp_path), "--print",
                           "--base"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    wanted = [line.split()[-1] for line in lines]
    # llmtui's own dependencies at pyproject.toml's pins, the optional three last
    for pin in ("transformers==5.23.0", "deepspeed==0.19.8", "trl==1.16.0", "datasets==5.2.0", "pydantic==2.14.3"):
        assert pin in wanted
    assert wanted[-3:] == ["liger-kernel==0.8.5", "torchao==0.18.0", "bitsandbytes==0.50.2"]
    assert len(set(w.split("==")[0] for w in wanted)) == len(wanted)  # one version of each
    deepspeed = next(line for line in lines if line.endswith("deepspeed==0.19.8"))
    assert " wheel " in deepspeed and "--no-build-isolation" in deepspeed  # published as source: built here
    assert all("--only-binary=:all:" in line for line in lines if line is not deepspeed)


def test_gpu_box_without_wheels_says_how_to_make_them(tmp_path):
    import os

    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_box.sh"), "--stages", "mfu"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "WHEELS": str(tmp_path)})
    assert done.returncode == 2
    assert f"no wheels in {tmp_path}" in done.stderr and "make gpu-wheels BASE=1" in done.stderr
