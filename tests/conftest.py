import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def llmtui_cache(tmp_path_factory):
    """One cache (tiny model, tokenized data) for the whole session, used by child processes too."""
    cache = os.environ.get("LLMTUI_TEST_CACHE") or str(tmp_path_factory.mktemp("llmtui-cache"))
    os.environ["LLMTUI_CACHE"] = cache
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    return Path(cache)
