"""Session-wide setup, whatever order the tests run in (pytest-randomly shuffles it).

- `llmtui_cache`: one cache (tiny model, tokenized data) for the whole session, child processes
  included: LLMTUI_CACHE points there from before the first test to the end of the session.
  The dry step before launch is off (LLMTUI_DRY_STEP=0) unless a test turns it on.
- `tiny_model`: the bundled tiny model, built once into that cache. Tests marked `slow` (they
  launch runs of it) or `tiny` get it built before they start, so no test pays for the build
  inside its own timeout and ranks never race to build it; child processes find it ready.
- `deepspeed_ops`: DeepSpeed JIT-compiles its CPU communication op into TORCH_EXTENSIONS_DIR at the
  first rank start of a machine (1-2 min on 2 cores). Slow tests get it built once, before them,
  so on a cold cache the first of them, whichever it is, does not spend its timeout compiling.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuiapp.core.plan.launcher import torch_extensions_dir

# pytest keeps its rewritten test modules' bytecode only where bytecode may be written: under
# PYTHONDONTWRITEBYTECODE=1 it would rewrite all ~200 test modules on every run (~4 s of the fast tier)
sys.dont_write_bytecode = False

# One OpenMP thread per process the tests start (ranks, servers, tools), unless the caller says otherwise.
# The tiny model gains ~0.7 s in 60 steps from a second thread, but idle OpenMP threads spin: two runs side
# by side (the suite's two workers) burned 24.6 CPU-s in 12.5 s with two threads each, 12.6 CPU-s in 6.5 s
# with one. The launcher's own default (cores / ranks) is tested in tests/core/test_launcher.py.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
OFFLINE = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")


@pytest.fixture(scope="session", autouse=True)
def llmtui_cache(tmp_path_factory):
    """Set LLMTUI_TEST_CACHE to reuse one cache across sessions; by default each session starts cold."""
    cache = os.environ.get("LLMTUI_TEST_CACHE") or str(tmp_path_factory.mktemp("llmtui-cache"))
    with pytest.MonkeyPatch.context() as patch:
        # DeepSpeed's op is built once per environment (the user's llmtui cache), not per session
        patch.setenv("TORCH_EXTENSIONS_DIR", torch_extensions_dir())
        patch.setenv("LLMTUI_CACHE", cache)
        # the dry step before launch is off for the suite's many launches (tests/e2e/test_dry_step.py turns
        # it on): each distinct recipe would pay for a child process of one real step
        patch.setenv("LLMTUI_DRY_STEP", os.environ.get("LLMTUI_TEST_DRY_STEP", "0"))
        for var in OFFLINE:
            if var not in os.environ:
                patch.setenv(var, "1")
        yield Path(cache)


@pytest.fixture(scope="session")
def tiny_model(llmtui_cache) -> Path:
    from tuiapp.trainer.models.tiny import ensure_tiny_model

    return ensure_tiny_model(llmtui_cache)


@pytest.fixture(scope="session")
def deepspeed_ops() -> str:
    """Build (or find built) DeepSpeed's CPU comm op in a child process, as a rank would; its output
    if that failed (the runs then show the real error)."""
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        return f"building DeepSpeed's CPU op timed out: {exc}"
    return "" if done.returncode == 0 else done.stdout + done.stderr


@pytest.fixture(autouse=True)
def _built_before_the_test(request):
    slow = request.node.get_closest_marker("slow")
    if slow or request.node.get_closest_marker("tiny"):
        request.getfixturevalue("tiny_model")
    if slow:
        request.getfixturevalue("deepspeed_ops")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Repeat the random-order seed at the end, where a failure is read, with the command to replay it."""
    seed = getattr(config.option, "randomly_seed", None)
    if seed is None or not config.pluginmanager.has_plugin("randomly"):
        return
    terminalreporter.write_line(
        f"random order seed: {seed} (replay this order: add --randomly-seed={seed} to the same command;"
        " file order: -p no:randomly)"
    )
