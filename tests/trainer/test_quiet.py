"""The torch-side tools print their own lines: DeepSpeed's accelerator guess, printed when
transformers imports it, is dropped (real interpreters, the real DeepSpeed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.e2e.helpers import ROOT

pytestmark = pytest.mark.slow  # two interpreters importing DeepSpeed: ~10 s

FIRST_USE = "from deepspeed.accelerator import get_accelerator; get_accelerator()"


def _output(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}  # let DeepSpeed guess, as users' do
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_the_tools_drop_deepspeeds_accelerator_guess():
    import torch

    quiet = _output(f"from tuiapp.trainer.tools.quiet import quiet_libraries; quiet_libraries(); {FIRST_USE}")
    assert "Setting accelerator" not in quiet and "Setting ds_accelerator" not in quiet, quiet
    if not torch.cuda.is_available():  # without a GPU DeepSpeed warns; the filter is what drops it
        assert "Setting accelerator to CPU" in _output(FIRST_USE)
