"""Everything checked before a launch, shared by `llmtui validate/run` and the TUI form."""

from __future__ import annotations

import importlib.util
import re
import shutil
import statistics
from pathlib import Path

from tuiapp.core.common.errors import UserError
from tuiapp.core.common.findings import Finding, format_findings, has_errors  # noqa: F401 (callers use checks.*)
from tuiapp.core.common.methods import is_preference, is_rl, trains_on_text
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.data import datasets
from tuiapp.core.machine import gpus
from tuiapp.core.plan import estimate, long_context, model_profile, probe
from tuiapp.core.prelaunch import (
    agent,
    benchmark_checks,
    dry_step,
    model_check,
    preference,
    preflight,
    rl,
    vision_checks,
)
from tuiapp.core.store.runs import RunStore


def resolve_recipe(recipe: Recipe, store: RunStore) -> tuple[Recipe, str]:
    """Resolve 'run:NAME' into the earlier run's final folder; returns (recipe, original name)."""
    ref = recipe.model.name
    path = store.resolve_model(ref)
    recipe = rl.resolve_reward_models(recipe, store)  # grpo/rloo: `run:NAME` reward models
    if path == ref:
        return recipe, ref
    resolved = recipe.model_copy(deep=True)
    resolved.model.name = path
    return resolved, ref


def _dataset_findings(recipe: Recipe, base_dir: Path) -> list[Finding]:
    """The dataset's findings; a mixture's, source by source (their keys dataset.sources.N.*)."""
    if not recipe.dataset.sources or is_rl(recipe.method.kind):  # rl: mixture_rules refuses sources
        return _one_dataset_findings(recipe, base_dir)
    out = vision_checks.mixture_findings(recipe, base_dir)
    if out:
        return out  # each source's images would be judged for a mixture that cannot train
    for index, (source, spec) in enumerate(zip(recipe.dataset.sources, recipe.dataset.source_specs(), strict=True)):
        one = recipe.model_copy(update={"dataset": spec})
        for finding in _one_dataset_findings(one, base_dir):
            key, fix = (_source_keys(text, index) if text else text for text in (finding.key, finding.fix))
            out.append(Finding(finding.level, key, f"source '{source.key}': {finding.message}", fix))
    return out


_SOURCE_KEY = re.compile(r"\bdataset\.(name|format|columns|split|eval_split|max_samples)\b")


def _source_keys(text: str, index: int) -> str:
    """A single dataset's keys in a finding's key or fix as the source's: dataset.sources.N.columns."""
    return _SOURCE_KEY.sub(lambda match: f"dataset.sources.{index}.{match.group(1)}", text)


def _one_dataset_findings(recipe: Recipe, base_dir: Path) -> list[Finding]:
    if is_rl(recipe.method.kind):  # prompts only, and the columns the rewards read
        return rl.data_findings(recipe, base_dir) + agent.records_findings(recipe, base_dir)  # and tools
    try:
        info = datasets.inspect_dataset(recipe.dataset, base_dir=base_dir)
    except UserError as exc:
        where = f"{exc.file}{f':{exc.line}' if exc.line else ''}: " if exc.file else ""  # key and fix: their own places
        return [Finding("error", exc.key or "dataset.name", where + exc.message, exc.fix or "")]
    if info.count == 0:
        return [Finding("error", "dataset.name", "the dataset has no records", "check the file or max_samples")]
    if info.with_images:
        return vision_checks.data_findings(recipe, info, base_dir)
    if info.kind and (is_preference(recipe.method.kind) or info.kind in ("pairs", "unpaired")):
        return preference.data_findings(recipe, info.kind, info.source)  # pairs, labelled answers
    wants_text = trains_on_text(recipe.method.kind)
    if info.format != "text" and wants_text:
        return [Finding("info", "dataset.format", f"{info.format} records are flattened to text for pretraining", "")]
    if info.format == "text" and not wants_text:
        return [
            Finding(
                "error",
                "dataset.format",
                f"method '{recipe.method.kind}' needs conversations, but the data is plain text",
                "use an alpaca/sharegpt/messages dataset, or method.kind = 'pretrain'",
            )
        ]
    return []


def model_config(recipe: Recipe, base_dir: Path) -> dict | None:
    try:
        return estimate.load_model_config(recipe.model.name, base_dir)
    except UserError:
        return None


def static_findings(recipe: Recipe, store: RunStore, base_dir: Path) -> list[Finding]:
    """Recipe rules, the dataset and the base model (folder, HF cache or hub); no GPU, disk or
    memory checks."""
    try:
        recipe, ref = resolve_recipe(recipe, store)
    except UserError as exc:
        return [Finding("error", exc.key or "model.name", exc.message, exc.fix or "")]
    findings = preflight.recipe_rules(recipe)
    findings += preference.rules(recipe)
    findings += rl.rules(recipe)
    findings += agent.rules(recipe)  # agentic GRPO, images and async generation
    findings += probe.rules(recipe)
    findings += long_context.rules(recipe, cuda=gpus.cuda_available())  # train.sequence_parallel, tiled MLP, activation offload
    findings += _dataset_findings(recipe, base_dir)
    findings += vision_checks.unused_findings(recipe, base_dir)
    findings += benchmark_checks.findings(recipe, base_dir)
    label = f"{ref} ({recipe.model.name})" if ref != recipe.model.name else None
    found = model_check.model_findings(recipe, base_dir, label=label)
    findings += found
    if not has_errors(found):
        findings += model_profile_findings(recipe, base_dir)
    return findings


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


def before_launch(recipe: Recipe, store: RunStore, base_dir: Path) -> list[Finding]:
    """All checks before a launch: recipe, data, GPUs, disk and memory."""
    findings = static_findings(recipe, store, base_dir)
    recipe, _ = resolve_recipe(recipe, store)
    store.root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(store.root).free
    config = model_config(recipe, base_dir)
    findings += preflight.run_preflight(recipe, store.root, config, free_bytes=free)
    findings += preference.adapter_findings(recipe, config)
    findings += long_context.config_rules(recipe, config, gpus.cuda_available())  # heads, RoPE
    if not has_errors(findings):  # last: one real step on a shrunken copy of the model (cached)
        profile = profile_of(recipe, base_dir)
        findings += dry_step.dry_findings(recipe, base_dir, profile.label if profile is not None else None)
    unique = {(f.level, f.key, f.message): f for f in findings}
    return list(unique.values())


def estimate_report(recipe: Recipe, store: RunStore, base_dir: Path, nodes: int | None = None,
                    gpus: int | None = None) -> dict:
    """The memory estimate of `llmtui estimate` and the TUI form, for the recipe's nodes x GPUs
    per node (launch.nodes, gpus_per_node, hosts); `nodes` / `gpus` override them."""
    recipe, _ = resolve_recipe(recipe, store)
    profile_of(recipe, base_dir)  # the exact parameter counts the estimate reads, made once per model
    config = estimate.load_model_config(recipe.model.name, base_dir)
    result = preflight.memory_estimate(recipe, config, base_dir=base_dir, nodes=nodes, per_node=gpus)
    text, data = estimate.format_estimate(result), result.to_json()
    past = probe.past_ratios(store.root)  # the estimate's error on runs that probed and measured
    if past:
        text += "\n" + probe.error_line(store.root)
        data["past_measured_over_predicted"] = {"median": statistics.median(past), "runs": len(past)}
    return {"text": text, "json": data}
