"""Messages workers post to screens: past-tense facts. Handlers own the widget state."""

from __future__ import annotations

from typing import Any

from textual.message import Message


class RunsLoaded(Message):
    """A batch of run.json files was read (history); `done` on the last batch."""

    def __init__(self, rows: list, done: bool = False) -> None:
        super().__init__()
        self.rows = rows
        self.done = done


class RunsUpdated(Message):
    """Runs already shown have new figures: metrics summarized, status changed."""

    def __init__(self, rows: list, summaries_done: bool = False) -> None:
        super().__init__()
        self.rows = rows
        self.summaries_done = summaries_done


class MetricsAppended(Message):
    """New metrics.jsonl records of the followed run."""

    def __init__(self, run_id: str, records: list[dict]) -> None:
        super().__init__()
        self.run_id = run_id
        self.records = records


class LogAppended(Message):
    """New lines of a log; `reset` when the view should clear first (new source, truncation)."""

    def __init__(self, run_id: str, source: str, lines: list[str], reset: bool = False) -> None:
        super().__init__()
        self.run_id = run_id
        self.source = source
        self.lines = lines
        self.reset = reset


class GenerationsAppended(Message):
    """New generations of the followed RL run's completions.jsonl; `reset` when the view should drop
    what it holds first (the first read, a resume's rewrite of the file)."""

    def __init__(self, run_id: str, generations: list, reset: bool = False) -> None:
        super().__init__()
        self.run_id = run_id
        self.generations = generations
        self.reset = reset


class RunStatusChanged(Message):
    """The followed run's run.json changed (status, reason, ended...)."""

    def __init__(self, run_id: str, info: dict) -> None:
        super().__init__()
        self.run_id = run_id
        self.info = info


class LogSourcesFound(Message):
    def __init__(self, run_id: str, sources: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.run_id = run_id
        self.sources = sources


class SystemSampled(Message):
    def __init__(self, sample: Any) -> None:
        super().__init__()
        self.sample = sample


class RunStopped(Message):
    def __init__(self, run_id: str, clean: bool, status: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.clean = clean
        self.status = status


class RunLaunched(Message):
    def __init__(self, run_id: str, resumed: bool = False) -> None:
        super().__init__()
        self.run_id = run_id
        self.resumed = resumed


class RunStopping(Message):
    """The user confirmed a stop; the worker is about to ask the service for it."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id


class ActionFailed(Message):
    """A worker's call into the service (launch, stop, resume, doctor) raised: what to tell the
    user. Screens reset their own state on it; the app shows it (tuiapp.ui.worker_errors)."""

    def __init__(self, action: str, text: str, expected: bool = True) -> None:
        super().__init__()
        self.action = action  # 'launch', 'stop', 'resume', 'doctor'
        self.text = text
        self.expected = expected  # a UserError (a refusal with its fix), not a bug


class DoctorReported(Message):
    """`llmtui doctor`'s report on a live run: every rank's phase, state and stack."""

    def __init__(self, run_id: str, text: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.text = text


class RecipeChecked(Message):
    """The form was validated: recipe errors, static findings and the memory estimate."""

    def __init__(self, generation: int, check: Any, findings_text: str, has_errors: bool, estimate: str,
                 finding_errors: int = 0, on_cpu: bool = False) -> None:
        super().__init__()
        self.finding_errors = finding_errors  # preflight findings of level error (the Checks pane counts them)
        self.on_cpu = on_cpu  # no CUDA here: the ranks are CPU processes
        self.generation = generation
        self.check = check
        self.findings_text = findings_text
        self.has_errors = has_errors
        self.estimate = estimate


class DatasetInspected(Message):
    def __init__(self, name: str, info: Any = None, error: str | None = None) -> None:
        super().__init__()
        self.name = name
        self.info = info
        self.error = error


class ModelsFound(Message):
    def __init__(self, names: list[str]) -> None:
        super().__init__()
        self.names = names


class CompareLoaded(Message):
    """Runs read for the compare screen (one message per run, so curves appear as they load)."""

    def __init__(self, runs: list, done: bool = False) -> None:
        super().__init__()
        self.runs = runs
        self.done = done


class RunsRemoved(Message):
    """Run folders are gone from the runs folder (deleted to the trash, here or from the CLI)."""

    def __init__(self, run_ids: list[str]) -> None:
        super().__init__()
        self.run_ids = run_ids


class GroupsRead(Message):
    """The sweeps' records (runs/.groups/<id>.json) were read, or changed: {id: record}."""

    def __init__(self, records: dict[str, dict]) -> None:
        super().__init__()
        self.records = records


class QueueReordered(Message):
    """A queued run was moved: every queued run's place now ({run id: 1-based position})."""

    def __init__(self, run_id: str, positions: dict[str, int]) -> None:
        super().__init__()
        self.run_id = run_id
        self.positions = positions


class RunMetaChanged(Message):
    """The user tagged, noted, renamed or (un)archived a run: its meta.json now."""

    def __init__(self, run_id: str, notes: dict, what: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.notes = notes
        self.what = what  # 'tags', 'note', 'name', 'archived'


class GroupLoaded(Message):
    """A sweep's record and its runs (with their metrics summed up), for the group screen."""

    def __init__(self, group_id: str, record: dict, rows: list) -> None:
        super().__init__()
        self.group_id = group_id
        self.record = record
        self.rows = rows


class ToolStarted(Message):
    """An Evaluate or Export form's checks passed and its child process started (`summary` says what runs)."""

    def __init__(self, summary: str) -> None:
        super().__init__()
        self.summary = summary


class ToolOutput(Message):
    """A line the Evaluate or Export tool printed (its progress)."""

    def __init__(self, line: str) -> None:
        super().__init__()
        self.line = line


class ToolFinished(Message):
    """The Evaluate or Export tool ended: its `result` (eval scores, the export's files), or the
    refusal or failure as `error` (message and fix, no traceback); `refused` when no work started."""

    def __init__(self, result: Any = None, error: str = "", refused: bool = False) -> None:
        super().__init__()
        self.result = result
        self.error = error
        self.refused = refused


class AfterTrainingRead(Message):
    """Runs' evaluations or exports changed on disk (from the TUI or a shell): run id -> what they
    hold now (a tuiapp.ui.after_training.AfterTraining)."""

    def __init__(self, found: dict[str, Any]) -> None:
        super().__init__()
        self.found = found


class ServedListed(Message):
    """The models `llmtui serve` serves, read (core.served.Served each) with their runs' names."""

    def __init__(self, models: list, names: dict[str, str]) -> None:
        super().__init__()
        self.models = models
        self.names = names


class ServedStopped(Message):
    """A served model was asked to stop; `gone`: nothing of its server is left."""

    def __init__(self, run_id: str, url: str, gone: bool) -> None:
        super().__init__()
        self.run_id = run_id
        self.url = url
        self.gone = gone


class ServingChanged(Message):
    """The runs whose model is served changed (history): run id -> URL."""

    def __init__(self, serving: dict[str, str]) -> None:
        super().__init__()
        self.serving = serving


class ExportToolsChecked(Message):
    """The Export form's GGUF fields checked (core.exporting.gguf_readiness): what the export will
    use, or its refusal with the fix."""

    def __init__(self, text: str, refused: bool = False, number: int = 0) -> None:
        super().__init__()
        self.text = text
        self.refused = refused
        self.number = number  # which check of the form: only the latest is shown
