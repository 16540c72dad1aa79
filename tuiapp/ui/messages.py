"""Messages workers post to screens: past-tense facts. Handlers own the widget state.

Dataclasses (Textual's Message initialises itself in __post_init__); identity, not field
equality, as for any message."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message

from tuiapp.core.run_folder.rundir import RunRecord


@dataclass(eq=False)
class RunsLoaded(Message):
    """A batch of run.json files was read (history); `done` on the last batch."""

    rows: list
    done: bool = False


@dataclass(eq=False)
class RunsUpdated(Message):
    """Runs already shown have new figures: metrics summarized, status changed."""

    rows: list
    summaries_done: bool = False


@dataclass(eq=False)
class MetricsRead(Message):
    """The followed run's metrics as read when its view opened (columns and the lines after them)."""

    run_id: str
    data: Any  # core.run_folder.rundata.RunData


@dataclass(eq=False)
class MetricsAppended(Message):
    """New metrics.jsonl records of the followed run."""

    run_id: str
    records: list[dict]


@dataclass(eq=False)
class LogAppended(Message):
    """New lines of a log; `reset` when the view should clear first (new source, truncation)."""

    run_id: str
    source: str
    lines: list[str]
    reset: bool = False


@dataclass(eq=False)
class GenerationsAppended(Message):
    """New generations of the followed RL run's completions.jsonl; `reset` when the view should drop
    what it holds first (the first read, a resume's rewrite of the file)."""

    run_id: str
    generations: list
    reset: bool = False


@dataclass(eq=False)
class RunStatusChanged(Message):
    """The followed run's run.json changed (status, reason, ended...)."""

    run_id: str
    record: RunRecord


@dataclass(eq=False)
class LogSourcesFound(Message):
    run_id: str
    sources: list[tuple[str, Any]]


@dataclass(eq=False)
class SystemSampled(Message):
    sample: Any


@dataclass(eq=False)
class RunStopped(Message):
    run_id: str
    clean: bool
    status: str


@dataclass(eq=False)
class RunLaunched(Message):
    run_id: str
    resumed: bool = False


@dataclass(eq=False)
class RunStopping(Message):
    """The user confirmed a stop; the worker is about to ask the service for it."""

    run_id: str


@dataclass(eq=False)
class ActionFailed(Message):
    """A worker's call into the service (launch, stop, resume, doctor) raised: what to tell the
    user. Screens reset their own state on it; the app shows it (tuiapp.ui.worker_errors)."""

    action: str
    text: str
    expected: bool = True


@dataclass(eq=False)
class DoctorReported(Message):
    """`llmtui doctor`'s report on a live run: every rank's phase, state and stack."""

    run_id: str
    text: str


@dataclass(eq=False)
class RecipeChecked(Message):
    """The form was validated: recipe errors, static findings and the memory estimate."""

    generation: int
    check: Any
    findings_text: str
    has_errors: bool
    estimate: str
    finding_errors: int = 0  # preflight findings of level error (the Checks pane counts them)
    on_cpu: bool = False  # no CUDA here: the ranks are CPU processes
    memory_bytes: int = 0  # RAM per CPU rank, or the total per GPU, as the estimate has it (0: none)
    dry: str = ""  # the dry step's cached verdict in a word (core.prelaunch.door.dry_step_state)


@dataclass(eq=False)
class DryStepped(Message):
    """The form's dry step (ctrl+g) ended: its verdict in a word and its findings."""

    state: str
    findings_text: str


@dataclass(eq=False)
class DatasetInspected(Message):
    name: str
    info: Any = None
    error: str | None = None


@dataclass(eq=False)
class ModelsFound(Message):
    names: list[str]


@dataclass(eq=False)
class CompareLoaded(Message):
    """Runs read for the compare screen (one message per run, so curves appear as they load)."""

    runs: list
    done: bool = False


@dataclass(eq=False)
class ColumnsProgress(Message):
    """A long run without columns, read in a worker process: `state` is "queued", "reading"
    (a process parses its metrics.jsonl) or "read" (its columns are in; the run loads next)."""

    run_id: str
    state: str


@dataclass(eq=False)
class RunsRemoved(Message):
    """Run folders are gone from the runs folder (deleted to the trash, here or from the CLI)."""

    run_ids: list[str]


@dataclass(eq=False)
class GroupsRead(Message):
    """The sweeps' records (runs/.groups/<id>.json) were read, or changed: {id: record}."""

    records: dict[str, dict]


@dataclass(eq=False)
class QueueReordered(Message):
    """A queued run was moved: every queued run's place now ({run id: 1-based position})."""

    run_id: str
    positions: dict[str, int]


@dataclass(eq=False)
class RunMetaChanged(Message):
    """The user tagged, noted, renamed or (un)archived a run: its meta.json now."""

    run_id: str
    notes: dict
    what: str


@dataclass(eq=False)
class GroupLoaded(Message):
    """A sweep's record and its runs (with their metrics summed up), for the group screen."""

    group_id: str
    record: dict
    rows: list


@dataclass(eq=False)
class ToolStarted(Message):
    """An Evaluate or Export form's checks passed and its child process started (`summary` says what runs)."""

    summary: str


@dataclass(eq=False)
class ToolOutput(Message):
    """A line the Evaluate or Export tool printed (its progress)."""

    line: str


@dataclass(eq=False)
class ToolFinished(Message):
    """The Evaluate or Export tool ended: its `result` (eval scores, the export's files), or the
    refusal or failure as `error` (message and fix, no traceback); `refused` when no work started."""

    result: Any = None
    error: str = ''
    refused: bool = False


@dataclass(eq=False)
class AfterTrainingRead(Message):
    """Runs' evaluations or exports changed on disk (from the TUI or a shell): run id -> what they
    hold now (a tuiapp.ui.after_training.AfterTraining)."""

    found: dict[str, Any]


@dataclass(eq=False)
class ServedListed(Message):
    """The models `llmtui serve` serves, read (core.store.served.Served each) with their runs' names."""

    models: list
    names: dict[str, str]


@dataclass(eq=False)
class ServedStopped(Message):
    """A served model was asked to stop; `gone`: nothing of its server is left."""

    run_id: str
    url: str
    gone: bool


@dataclass(eq=False)
class ServingChanged(Message):
    """The runs whose model is served changed (history): run id -> URL."""

    serving: dict[str, str]


@dataclass(eq=False)
class ExportToolsChecked(Message):
    """The Export form's GGUF fields checked (core.after.exporting.gguf_readiness): what the export will
    use, or its refusal with the fix."""

    text: str
    refused: bool = False
    number: int = 0
