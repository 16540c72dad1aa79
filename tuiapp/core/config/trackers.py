"""Experiment trackers a run also reports to (`train.report_to`): TensorBoard, Weights & Biases,
MLflow, through transformers' own callbacks on rank 0. Offline by default, inside the run folder:

  tensorboard  event files in runs/<id>/tensorboard/           (TENSORBOARD_LOGGING_DIR)
  wandb        runs/<id>/wandb/offline-run-*, `wandb sync` later (WANDB_MODE=offline, WANDB_DIR)
  mlflow       a file store in runs/<id>/mlruns/                 (MLFLOW_TRACKING_URI)

An environment variable the user set wins (WANDB_MODE=online, a tracking server's URI...).
Each tracker's package is an optional extra; a missing one is a pre-flight error.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from tuiapp.core.common.findings import Finding

# tracker -> (module that must import, extra of llmtui that installs it)
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def installed(tracker: str) -> bool:
    module = PACKAGES[tracker][0]
    return importlib.util.find_spec(module) is not None


def install_hint(tracker: str) -> str:
    return f"pip install 'llmtui[{PACKAGES[tracker][1]}]' (or remove \"{tracker}\" from train.report_to)"


def findings(report_to: list[str]) -> list[Finding]:
    """A pre-flight error for each tracker whose package is not installed here."""
    return [Finding("error", "train.report_to", f"'{name}' needs the {PACKAGES[name][0]} package, which is not "
                    "installed", install_hint(name))
            for name in report_to if name in PACKAGES and not installed(name)]


def environment(report_to: list[str], run_dir: Path) -> dict[str, str]:
    """The variables each tracker reads, pointing into the run folder (defaults only)."""
    run_dir = Path(run_dir)
    env: dict[str, str] = {}
    if "tensorboard" in report_to:
        env["TENSORBOARD_LOGGING_DIR"] = str(run_dir / "tensorboard")
    if "wandb" in report_to:
        env.update(WANDB_MODE="offline", WANDB_DIR=str(run_dir), WANDB_PROJECT="llmtui", WANDB_SILENT="true")
    if "mlflow" in report_to:
        # MLflow 3 keeps its file store in "maintenance mode" and refuses it unless allowed
        env.update(MLFLOW_TRACKING_URI=(run_dir / "mlruns").resolve().as_uri(), MLFLOW_EXPERIMENT_NAME="llmtui",
                   MLFLOW_ALLOW_FILE_STORE="true")
    return env


def training_kwargs(report_to: list[str], run_dir: Path) -> dict:
    """TrainingArguments for the trackers; sets their environment defaults in this process.
    A missing package is an error here too (a rank on another node may lack what this one has)."""
    missing = [name for name in report_to if not installed(name)]
    if missing:
        name = missing[0]
        raise RuntimeError(f"train.report_to: '{name}' needs the {PACKAGES[name][0]} package, which is not "
                           f"installed on this node; {install_hint(name)}")
    for key, value in environment(report_to, run_dir).items():
        os.environ.setdefault(key, value)
    return {"report_to": list(report_to), "run_name": Path(run_dir).name}
