"""A run's frozen recipe (its recipe.toml, as launched), parsed: the one reader of it for the
supervisor, the ranks, the CLI and the UI. The run folder itself (core.run_folder.rundir) is paths
only and sits below the recipe schema, so the parse lives here."""

from __future__ import annotations

from pathlib import Path

from tuiapp.core.common.errors import RunError
from tuiapp.core.config.recipe import Recipe, parse_recipe
from tuiapp.core.run_folder.rundir import RunDir


def frozen_recipe(run_dir: str | Path | RunDir) -> Recipe:
    """The run's recipe.toml, parsed and checked: a RunError naming the file when it cannot be
    read, a RecipeError naming the key when it does not check."""
    path = (run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)).recipe_toml
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RunError(message=f"cannot read the frozen recipe: {exc}", file=str(path)) from None
    return parse_recipe(text, str(path))
