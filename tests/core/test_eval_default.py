"""Evals asked for (train.eval_steps or sample_prompts) hold out data when eval_split is 0, and
`llmtui validate` says so; the form (tuiapp.ui.formdata) goes through the same validation."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tuiapp.core.config.recipe import AUTO_EVAL_SPLIT, RecipeError, parse_recipe
from tuiapp.core.prelaunch.door import recipe_findings
from tuiapp.core.store.runs import RunStore
from tuiapp.ui import formdata

BASE = 'name = "x"\n[model]\nname = "tiny"\n[method]\nkind = "lora"\n'


def test_eval_steps_hold_out_a_split():
    recipe = parse_recipe(BASE + "[train]\neval_steps = 5\n")
    assert recipe.dataset.eval_split == AUTO_EVAL_SPLIT and recipe.dataset.eval_split_auto
    assert "eval_split = 0.05" in recipe.to_toml()  # the frozen recipe says what the run did


def test_sample_prompts_hold_out_a_split_even_when_eval_split_is_zero():
    recipe = parse_recipe(BASE + '[dataset]\neval_split = 0\n[train]\nsample_prompts = ["hi"]\n')
    assert recipe.dataset.eval_split == AUTO_EVAL_SPLIT


@pytest.mark.parametrize("text, split", [
    (BASE, 0.0),  # no evals asked for: nothing held out
    (BASE + "[dataset]\neval_split = 0.2\n[train]\neval_steps = 5\n", 0.2),  # the user's fraction
    (BASE + '[dataset]\neval_split = "data/eval.jsonl"\n[train]\neval_steps = 5\n', "data/eval.jsonl"),
])
def test_an_own_split_or_no_evals_keep_eval_split(text, split):
    recipe = parse_recipe(text)
    assert recipe.dataset.eval_split == split and not recipe.dataset.eval_split_auto


def test_the_checks_tell_the_user(tmp_path):
    findings = recipe_findings(parse_recipe(BASE + "[train]\neval_steps = 5\n"), RunStore(tmp_path), tmp_path)
    notes = [f for f in findings if f.key == "dataset.eval_split"]
    assert [f.level for f in notes] == ["info"] and "5% of the training data is held out" in notes[0].message


def test_the_form_agrees():
    values = formdata.default_values("lora") | {"train.eval_steps": "10"}
    check = formdata.check_values(values, "lora")
    assert check.recipe.dataset.eval_split == AUTO_EVAL_SPLIT


def test_validate_prints_the_held_out_split(tmp_path):
    (tmp_path / "x.toml").write_text(BASE + "[train]\neval_steps = 5\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "tuiapp.cli", "validate", "x.toml"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "5% of the training data is held out for eval" in out.stdout + out.stderr


def test_a_bad_name_gets_a_human_message():
    with pytest.raises(RecipeError) as caught:
        parse_recipe(BASE.replace('"x"', '"my run!"'))
    text = str(caught.value)
    assert "'my run!' is not a valid name" in text and "letters, digits" in text and "^[" not in text
