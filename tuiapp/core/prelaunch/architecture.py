"""The model's architecture against the recipe: its config's sanity and what its profile
(tuiapp.core.plan.model_profile) means for the method. The door (door.py) calls
model_profile_findings in its recipe phase; profile_of gives the dry step and the estimate the profile.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tuiapp.core.common.findings import Finding
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.machine import gpus
from tuiapp.core.plan import model_profile
from tuiapp.core.prelaunch import model_check


def profile_of(recipe: Recipe, base_dir: Path) -> model_profile.ModelProfile | None:
    """The model's profile (made and cached on first use), or None: 'tiny', not here, or unreadable."""
    return _read_profile(recipe, base_dir)[0]


def model_profile_findings(recipe: Recipe, base_dir: Path) -> list[Finding]:
    """The model's config sanity, and what its architecture means for the method (model_profile)."""
    profile, findings = _read_profile(recipe, base_dir)
    if profile is None:
        return findings
    plan = model_profile.plan_model(profile, recipe, cuda=gpus.cuda_available(),
                                    flash_installed=importlib.util.find_spec("flash_attn") is not None)
    return plan.findings


def _read_profile(recipe: Recipe, base_dir: Path) -> tuple[model_profile.ModelProfile | None, list[Finding]]:
    """model.name's profile, or None and why not ([] for 'tiny' and models not here)."""
    folder = model_check.model_folder(recipe.model.name, base_dir)
    if folder is None:
        return None, []
    problems = model_profile.config_problems(folder)
    if problems:
        return None, problems
    try:
        return model_profile.read_profile(folder, trust_remote_code=recipe.model.trust_remote_code), []
    except model_profile.ProfileError as exc:
        if "trust_remote_code" in str(exc):
            return None, [Finding("error", "model.name", f"{folder}: {exc}",
                                  "set model.trust_remote_code = true if you trust the model's own code")]
        if recipe.model.trust_remote_code:  # remote code that cannot be built on the meta device
            return None, [Finding("warning", "model.name", f"{folder}: no model profile ({exc}); the recipe's "
                                  "settings apply as written, unchecked against the architecture")]
        return None, [Finding("error", "model.name", f"{folder}: {exc}", "check that transformers knows the "
                              "architecture (pip install -U transformers) and that the folder is a complete model")]
