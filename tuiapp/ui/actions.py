"""What the screens ask of core, as plain blocking functions (called from thread workers):
check a form, launch, stop and resume a run. The same calls `llmtui validate/run/stop/resume`
make, so the app and the CLI behave the same."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tuiapp.core.errors import UserError
from tuiapp.core.recipe import Recipe
from tuiapp.core.runs import Run, RunStore
from tuiapp.ui import formdata


@dataclass
class FormReport:
    check: formdata.FormCheck
    findings: str = ""
    has_errors: bool = False
    estimate: str = ""


def check_form(values: dict[str, str], kind: str, runs_root: Path, base_dir: Path) -> FormReport:
    """Recipe errors, then (for a valid recipe) static findings and the memory estimate."""
    file = f"recipes/{values.get('name') or 'run'}.toml"
    check = formdata.check_values(values, kind, file)
    report = FormReport(check, has_errors=bool(check.errors))
    if check.recipe is None:
        return report
    try:
        from tuiapp.core import checks

        store = RunStore(runs_root)
        findings = checks.static_findings(check.recipe, store, base_dir)
        report.findings = checks.format_findings(findings)
        report.has_errors = checks.has_errors(findings)
        try:
            report.estimate = checks.estimate_report(check.recipe, store, base_dir)["text"]
        except UserError as exc:
            report.estimate = f"no estimate:\n{exc}"
    except ImportError as exc:  # core checks mid-rewrite: say so, keep the form usable
        report.findings = f"checks unavailable: {exc}"
    except Exception as exc:
        report.findings = f"checks failed: {exc!r}"
    return report


class LaunchRefused(Exception):
    """Preflight found errors; the text is what `llmtui run` would print."""


def launch(recipe: Recipe, runs_root: Path, base_dir: Path, recipe_file: str | None = None) -> str:
    """Preflight, create the run folder, start its detached supervisor; the run's id."""
    from tuiapp.core import checks, launcher

    store = RunStore(runs_root)
    resolved, model_ref = checks.resolve_recipe(recipe, store)
    findings = checks.before_launch(resolved, store, base_dir)
    if checks.has_errors(findings):
        raise LaunchRefused(checks.format_findings(findings))
    run = store.create(resolved, recipe_file=recipe_file)
    if model_ref != resolved.model.name:
        run.update(model_ref=model_ref)
    launcher.start(run)
    return run.id


def stop(run_path: Path) -> tuple[bool, str]:
    """Graceful stop (checkpoint, then exit); (no process left, final status)."""
    from tuiapp.core import launcher

    run = Run(run_path)
    clean = launcher.stop(run, wait=True)
    return clean, run.load().status


def resume(run_path: Path) -> None:
    """Start a stopped or failed run again from its last complete checkpoint."""
    from tuiapp.core import launcher

    run = Run(run_path).load()
    run.recipe()  # a readable frozen recipe, or a clear error
    run.update(status="created", reason=None)
    launcher.start(run, resume=True)
