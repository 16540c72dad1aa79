"""The dataset's checks before a launch: its records load, suit the method (text or chats, pairs,
labelled answers, prompts with their reward columns, images), and a mixture's sources one by one.
The door (door.py) calls dataset_findings in its recipe phase.
"""

from __future__ import annotations

import re
from pathlib import Path

from tuiapp.core.common.errors import UserError
from tuiapp.core.common.findings import Finding
from tuiapp.core.common.methods import is_preference, is_rl, trains_on_text
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.data import datasets
from tuiapp.core.prelaunch import agent, preference, rl, vision_checks


def dataset_findings(recipe: Recipe, base_dir: Path) -> list[Finding]:
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
