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
