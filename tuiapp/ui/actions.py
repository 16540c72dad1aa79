"""What the screens ask of core, as plain blocking functions (called from thread workers):
check a form, launch, stop, resume and diagnose a run. The same calls `llmtui
validate/run/stop/resume/doctor` make (the run service decides; these only call it), so the app
and the CLI behave the same. They raise UserError (RunError, service.LaunchRefused) when the
service refuses; the workers report it through tuiapp.ui.worker_errors."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuiapp.core.common.errors import UserError
from tuiapp.core.store.runs import Run, RunStore

if TYPE_CHECKING:  # imported when a form is checked or a recipe read: ~0.2 s of the app's start-up
    from tuiapp.core.config.recipe import Recipe
    from tuiapp.ui import formdata


@dataclass
class FormReport:
    check: formdata.FormCheck
    findings: str = ""
    has_errors: bool = False
    estimate: str = ""
    finding_errors: int = 0  # preflight findings of level error
    on_cpu: bool = False  # no CUDA on this machine: the estimate speaks of CPU ranks
    memory_bytes: int = 0  # the verdict's figure: RAM per CPU rank, or the total per GPU (0: no estimate)
    dry: str = ""  # the dry step's cached verdict in a word (door.dry_step_state); "" while the recipe has errors


@functools.lru_cache(maxsize=1)
def machine_on_cpu() -> bool:
    """No CUDA device here (judged once, without torch): runs get CPU ranks."""
    from tuiapp.core.machine.gpus import cuda_available

    return not cuda_available()


def check_form(values: dict[str, str], kind: str, runs_root: Path, base_dir: Path) -> FormReport:
    """Recipe errors, then (for a valid recipe) static findings and the memory estimate."""
    from tuiapp.ui import formdata

    file = f"recipes/{values.get('name') or 'run'}.toml"
    check = formdata.check_values(values, kind, file)
    report = FormReport(check, has_errors=bool(check.errors))
    if check.recipe is None:
        return report
    try:
        from tuiapp.core.prelaunch import door

        store = RunStore(runs_root)
        findings = door.recipe_findings(check.recipe, store, base_dir)
        if not door.has_errors(findings):  # a cached dry step verdict is one file read; ctrl+g runs one
            report.dry, dry_findings = door.dry_step_state(check.recipe, store, base_dir, run=False)
            findings += dry_findings
        report.findings = door.format_findings(findings)
        report.has_errors = door.has_errors(findings)
        report.finding_errors = sum(f.level == "error" for f in findings)
        report.on_cpu = machine_on_cpu()
        try:
            estimated = door.estimate_report(check.recipe, store, base_dir)
            report.estimate = estimated["text"]
            data = estimated["json"]
            report.memory_bytes = int(data["ram_per_rank"] if report.on_cpu else data["memory"]["total"])
        except UserError as exc:
            report.estimate = f"no estimate:\n{exc}"
    except ImportError as exc:  # core checks mid-rewrite: say so, keep the form usable
        report.findings = f"checks unavailable: {exc}"
    except Exception as exc:
        report.findings = f"checks failed: {exc!r}"
    return report


def dry_step(recipe: Recipe, runs_root: Path, base_dir: Path) -> tuple[str, str]:
    """One real step of the recipe's method on a shrunken copy of its model, as `llmtui run` takes
    before launch (a child process; seconds to a minute), its verdict cached: (state, findings text)."""
    from tuiapp.core.prelaunch import door

    state, findings = door.dry_step_state(recipe, RunStore(runs_root), base_dir, run=True)
    return state, door.format_findings(findings)


def launch(recipe: Recipe, runs_root: Path, base_dir: Path, recipe_file: str | None = None) -> str:
    """Plan (every pre-flight check), create the run folder, start its supervisor; the run's id.
    Raises service.LaunchRefused (findings) or another UserError, as `llmtui run` would."""
    from tuiapp.core.lifecycle import service

    store = RunStore(runs_root)
    plan = service.plan_launch(recipe, store, base_dir, service.LaunchOptions(recipe_file=recipe_file))
    return service.launch(plan, store).id


def stop(run_path: Path) -> tuple[bool, str]:
    """Graceful stop (checkpoint, then exit); (no process left, final status)."""
    from tuiapp.core.lifecycle import service

    run = Run(run_path).load()
    clean = service.stop(run, wait=True)
    return clean, run.load().status


def resume(run_path: Path) -> None:
    """Continue a stopped or failed run from its last complete checkpoint, the way it ran."""
    from tuiapp.core.lifecycle import service

    service.resume(Run(run_path).load())


def diagnose(run_path: Path) -> str:
    """`llmtui doctor`: every rank's phase, state and Python stack (blocking, a few seconds);
    UserError when the run has no live process here."""
    from tuiapp.core.lifecycle import doctor

    return doctor.diagnose(Run(run_path).load())


def recipe_to_clone(run_path: Path) -> tuple[Recipe, str]:
    """A run's frozen recipe, its model as the user typed it ('run:NAME', not the resolved
    folder), and the run's name; UserError when the recipe cannot be read."""
    run = Run(run_path).load()
    recipe = run.recipe()
    if run.record.model_ref:
        recipe.model.name = run.record.model_ref
    return recipe, run.name
