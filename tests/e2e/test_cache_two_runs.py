"""Two runs that tokenize the same new dataset at once: one cache entry (verified, with its manifest),
and both train to the end. Real runs, started together."""

import json
import os

import pytest

from tests.e2e.helpers import llmtui, run_info, wait_for
from tuiapp.core.data import cache_entry
from tuiapp.core.run_folder.rundir import FINAL

pytestmark = [pytest.mark.slow, pytest.mark.extended]  # `make test-extended`: over the full tier's budget for now

SHORT = ["--set", "train.max_steps=2", "--set", "train.eval_steps=0", "--set", "train.save_steps=0",
         "--set", "dataset.eval_split=0", "--set", "train.max_seq_len=64"]


def test_two_runs_tokenizing_one_dataset_at_once_share_one_entry_and_both_train(runs_dir, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i}: " + "a quick brown fox " * (1 + i % 13)}) + "\n"
                              for i in range(4000)))
    for _ in range(2):
        llmtui("run", "recipes/tiny-pretrain.toml", *SHORT, "--set", f"dataset.name='{corpus}'", "--detach",
               runs_dir=runs_dir, check=True)
    runs = [p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(runs) == 2
    wait_for(lambda: all(run_info(r)["status"] in FINAL for r in runs), timeout=400, interval=1, what="both runs end")
    for run in runs:
        assert run_info(run)["status"] == "succeeded", (run / "stdout.log").read_text()[-3000:]
    data = os.path.join(os.environ["LLMTUI_CACHE"], "data")
    mine = [name for name in os.listdir(data) if not name.startswith(".")
            and cache_entry.read_info(os.path.join(data, name)).get("source") == str(corpus)]
    assert len(mine) == 1, os.listdir(data)
    assert cache_entry.state(os.path.join(data, mine[0])) == ("ok", None)
    assert not [name for name in os.listdir(data) if name.startswith(".")]  # no scratch or half-built folder left
