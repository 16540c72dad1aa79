"""What the new-experiment form offers to pick: base models and datasets found on this machine,
and the recipes to open (the user's recipes/ and the presets that come with llmtui)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import tomllib
from textual.fuzzy import Matcher

from tuiapp.core.config.recipe import BUNDLED_MODEL
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store.runs import RunStore

DEMO_DATASETS = ["demo:facts", "demo:chat", "demo:text"]
DATA_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".txt")
PRESETS_DIR = Path(__file__).resolve().parents[2] / "recipes"  # the example recipes, one per method
MAX_FOUND = 40  # model candidates listed at once: typing in the model box filters them
FUZZY_SCAN = 2000  # candidates scored fuzzily when too few contain the text (keeps a key press cheap)


def cached_hub_models(cache_dirs: list[Path]) -> list[str]:
    """Hub ids downloaded into the HF cache (folders models--owner--name with a snapshot)."""
    found = []
    for cache in cache_dirs:
        try:
            entries = list(os.scandir(cache))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir() and entry.name.startswith("models--") and (Path(entry.path) / "snapshots").is_dir():
                found.append(entry.name[len("models--"):].replace("--", "/"))
    return sorted(set(found))


def run_models(store: RunStore) -> list[str]:
    """`run:NAME` for every name with a succeeded run that has a final model."""
    names = []
    for run in store.list(refresh=False):
        if run.status == "succeeded" and run.final_path.is_dir():
            names.append(f"run:{run.name}")
    return sorted(set(names))


def run_models_of(runs: list[tuple[str, str, Path]]) -> list[str]:
    """`run_models` from runs already read (the history's rows: name, status, folder): a stat of
    each succeeded run's final model instead of every run.json read again."""
    names = {f"run:{name}" for name, status, path in runs if status == "succeeded" and RunDir(path).final.is_dir()}
    return sorted(names)


def model_candidates(store: RunStore, cache_dirs: list[Path], runs: list[tuple[str, str, Path]] | None = None) -> list[str]:
    """The bundled model, the HF cache's, then `run:NAME`s (the many ones last: see FUZZY_SCAN);
    those of `runs` when given (the history's rows), else of every run folder's run.json."""
    return [BUNDLED_MODEL, *cached_hub_models(cache_dirs), *(run_models(store) if runs is None else run_models_of(runs))]


def local_datasets(base_dir: Path, limit: int = 50) -> list[str]:
    """Data files in ./data (relative to base_dir), for the dataset picker."""
    out = []
    folder = base_dir / "data"
    try:
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.is_file() and entry.name.lower().endswith(DATA_SUFFIXES):
                out.append(f"data/{entry.name}")
                if len(out) >= limit:
                    break
    except OSError:
        pass
    return out


def filter_models(names: list[str], query: str, limit: int = MAX_FOUND) -> list[str]:
    """The candidates that match what is typed in the model box, best first: the bundled model
    and those containing the text, then fuzzy matches (textual.fuzzy, over the first FUZZY_SCAN);
    all of them (up to
    `limit`) when the box is empty or holds a candidate exactly."""
    text = query.strip().lower()
    if not text or query.strip() in names:
        return names[:limit]
    hits = [n for n in names if text in n.lower()]
    hits.sort(key=lambda n: (not n.lower().startswith(text) and not n.lower().startswith("run:" + text), len(n)))
    if len(hits) < limit:
        matcher = Matcher(query.strip())
        seen = set(hits)
        scored = [(matcher.match(n), n) for n in names[:FUZZY_SCAN] if n not in seen]
        hits += [n for score, n in sorted(scored, key=lambda pair: -pair[0]) if score > 0]
    return hits[:limit]


@dataclass(frozen=True)
class RecipeChoice:
    label: str  # recipes/NAME.toml, or preset NAME
    path: Path
    about: str  # method, model, description


def _about(path: Path) -> str:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        return f"cannot read: {exc}"
    method = data.get("method", {}) if isinstance(data.get("method"), dict) else {}
    model = data.get("model", {}) if isinstance(data.get("model"), dict) else {}
    parts = [str(method.get("kind", "?")), f"on {model.get('name', 'tiny')}", str(data.get("description", ""))]
    return " · ".join(p for p in parts if p)


def recipe_choices(recipes_dir: Path, presets_dir: Path = PRESETS_DIR) -> list[RecipeChoice]:
    """Every recipe file to open: the user's recipes/, then the presets (when they are elsewhere)."""
    out, seen = [], set()
    for folder, label in ((recipes_dir, "recipes/{}"), (presets_dir, "preset {}")):
        try:
            paths = sorted(folder.glob("*.toml"))
        except OSError:
            continue
        for path in paths:
            real = path.resolve()
            if real in seen:
                continue
            seen.add(real)
            out.append(RecipeChoice(label.format(path.name if label.startswith("recipes") else path.stem), path,
                                    _about(path)))
    return out
