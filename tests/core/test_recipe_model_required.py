"""A recipe file without a [model] table (or without its name) is an error with the fix: it used to
train the bundled test model silently. Recipes built in code keep the schema's default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tuiapp.core.common.errors import RecipeError
from tuiapp.core.config.recipe import load_recipe, parse_recipe

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, needle", [
    ('[method]\nkind = "lora"\n', "a [model] table"),
    ('[model]\ndtype = "float32"\n[method]\nkind = "lora"\n', "its name"),
])
def test_a_recipe_file_without_its_model_is_an_error_with_the_fix(tmp_path, text, needle):
    path = tmp_path / "r.toml"
    path.write_text(text)
    with pytest.raises(RecipeError) as error:
        load_recipe(path)
    message = str(error.value)
    assert str(path) in message and "model.name" in message and needle in message
    assert 'name = "tiny"' in message  # the fix names the bundled model


def test_set_model_name_counts_and_presets_name_their_model(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[method]\nkind = "lora"\n')
    assert load_recipe(path, ["model.name=tiny"]).model.name == "tiny"
    for preset in sorted((ROOT / "recipes").glob("*.toml")):
        assert load_recipe(preset).model.name, preset
    assert parse_recipe('[method]\nkind = "lora"\n').model.name == "tiny"  # built in code: the default


def test_llmtui_run_refuses_before_creating_a_run(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[method]\nkind = "lora"\n')
    result = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(tmp_path / "runs"), "run", str(path)],
                            cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "a [model] table" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
