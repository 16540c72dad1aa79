"""Provenance of a real run: recorded at launch, printed by `llmtui show`, a differing field seen in
compare's config diff, and `llmtui reproduce` launching the same recipe with no warning and the same
losses (one tiny run and its reproduction, 4 steps each)."""

import json
import shutil

import pytest

from tests.e2e.helpers import llmtui, metrics
from tuiapp.core.data.demo_data import DEMO_VERSION
from tuiapp.ui.comparing import config_rows, load_compare_run

pytestmark = pytest.mark.slow

SETS = ["train.max_steps=4", "train.eval_steps=0", "train.save_steps=0", "train.logging_steps=1"]


def _losses(run_dir):
    return [(r["step"], r["loss"]) for r in metrics(run_dir) if r.get("split", "train") == "train" and "loss" in r]


def test_provenance_show_compare_and_reproduce(runs_dir, tmp_path_factory):
    args = ["run", "recipes/tiny-sft.toml"] + [x for s in SETS for x in ("--set", s)]
    llmtui(*args, runs_dir=runs_dir, timeout=600, check=True)
    (original,) = [p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    made = json.loads((original / "provenance.json").read_text())
    assert made["overrides"] == SETS and made["recipe"]["train"]["max_steps"] == 4
    assert made["data"] == [{"source": "demo:facts", "demo_version": DEMO_VERSION}] and made["seed"] == 42

    shown = llmtui("show", original.name, runs_dir=runs_dir, check=True).stdout
    assert f"transformers {made['packages']['transformers']}" in shown and "seed        42" in shown

    # a twin made "under another transformers": one field of its record edited
    other_root = tmp_path_factory.mktemp("other-runs")
    twin = other_root / (original.name + "-twin")
    shutil.copytree(original, twin)
    edited = json.loads((twin / "provenance.json").read_text())
    edited["packages"]["transformers"] = "4.0.0"
    (twin / "provenance.json").write_text(json.dumps(edited))
    rows = dict(config_rows([load_compare_run(original).recipe, load_compare_run(twin).recipe]))
    assert rows == {"provenance.packages.transformers": [made["packages"]["transformers"], "4.0.0"]}
    assert "transformers 4.0.0" in llmtui("show", twin.name, runs_dir=other_root, check=True).stdout

    done = llmtui("reproduce", original.name, runs_dir=runs_dir, timeout=600, check=True)
    assert "warning" not in done.stderr, done.stderr
    assert "environment: as" in done.stdout
    (again,) = [p for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".") and p != original]
    assert _losses(again) == _losses(original) and len(_losses(original)) == 4
    assert json.loads((again / "provenance.json").read_text())["overrides"] == SETS
    # and a changed environment is named before anything starts
    warned = llmtui("reproduce", twin.name, "--dry-run", runs_dir=other_root, check=True)
    assert "warning: packages.transformers: the run had 4.0.0, here" in warned.stderr
