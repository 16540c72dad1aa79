"""`llmtui eval RUN` and the TUI's Evaluate without data named: the held-out split of the demo the run
trained on (demo:shapes -> its image QA split), demo:facts-heldout for the other demos, and none for a
run that trained on the user's own data. Runs made by the store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tuiapp.core.after import evaluation
from tuiapp.core.config.recipe import load_recipe
from tuiapp.core.store.runs import RunStore

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


def test_a_run_on_its_own_data_has_no_default_and_eval_asks_for_held_out_data(tmp_path):
    """It was evaluated on the demo facts, which it never saw: a perplexity of nothing it learned."""
    data = tmp_path / "mine.jsonl"
    data.write_text('{"instruction": "Say hi", "output": "hi"}\n', encoding="utf-8")
    recipe = load_recipe(ROOT / "recipes" / "tiny-lora.toml")
    recipe.dataset.name = str(data)
    store = RunStore(tmp_path / "runs")
    run = store.create(recipe)
    assert evaluation.default_data(run.path) == ""
    mixed = load_recipe(ROOT / "recipes" / "tiny-mixture.toml")
    mixed.dataset.sources[1].name = str(data)
    assert evaluation.default_data(store.create(mixed).path) == ""  # one source of the user's own
    out = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(tmp_path / "runs"), "eval", run.id],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert f"trained on {data}: name the held-out data" in out.stderr
    assert "fix: pass --data FILE with records the run did not train on" in out.stderr
    assert not (run.path / "evals").exists()  # nothing started, nothing written
