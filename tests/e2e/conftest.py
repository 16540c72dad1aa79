import pytest

from tests.e2e.helpers import kill_runs


@pytest.fixture
def runs_dir(tmp_path):
    """A runs folder whose runs are ended after the test, whatever happened."""
    yield tmp_path
    kill_runs(tmp_path)
