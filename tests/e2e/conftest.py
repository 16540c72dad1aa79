import shutil

import pytest

from tests.after_runs import sft_run
from tests.e2e.helpers import kill_runs
from tuiapp.core.store import served


@pytest.fixture
def runs_dir(tmp_path):
    """A runs folder whose runs are ended after the test, whatever happened."""
    yield tmp_path
    kill_runs(tmp_path)


@pytest.fixture
def served_run(tmp_path_factory, tmp_path):
    """A private copy of the finished tiny SFT run, for `llmtui serve` (it writes serve.json and
    serve.log into the run); its server, if any, is stopped after the test."""
    source = sft_run(tmp_path_factory)
    root = tmp_path / "runs"
    root.mkdir()
    shutil.copytree(source, root / source.name)
    path = root / source.name
    yield path
    served.stop(path, grace_s=5)
