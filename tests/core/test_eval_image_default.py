"""`llmtui eval RUN` and the TUI's Evaluate without data named: the held-out split of the demo the run
trained on (demo:shapes -> its image QA split), demo:facts-heldout otherwise. Runs made by the store."""

from __future__ import annotations

from pathlib import Path

from tuiapp.core import evaluation
from tuiapp.core.recipe import load_recipe
from tuiapp.core.runs import RunStore

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_data_is_the_held_out_split_of_the_demo_the_run_trained_on(tmp_path):
    store = RunStore(tmp_path)
    shapes = store.create(load_recipe(ROOT / "recipes" / "tiny-vlm-lora.toml"))
    facts = store.create(load_recipe(ROOT / "recipes" / "tiny-lora.toml"))
    other = store.create(load_recipe(ROOT / "recipes" / "tiny-dpo.toml"))
    assert evaluation.default_data(shapes.path) == "demo:shapes-heldout"
    assert evaluation.default_data(facts.path) == "demo:facts-heldout" == evaluation.DEFAULT_DATA
    assert evaluation.default_data(other.path) == evaluation.DEFAULT_DATA
    assert evaluation.default_data(tmp_path / "missing") == evaluation.DEFAULT_DATA  # no recipe: the default
