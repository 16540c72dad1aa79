"""`llmtui run | stop | resume | doctor`: launching a run through the run service
(tuiapp.core.lifecycle.service) and following it: start-up phases, progress lines, evaluations, the outcome as
the exit code. Ctrl-C stops the run cleanly. Scale-out flags and lines are tuiapp.cli.scale's."""

from __future__ import annotations

import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from tuiapp.cli import manage, numbers, scale
from tuiapp.core.common.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from tuiapp.core.config.recipe import load_recipe
from tuiapp.core.lifecycle import service
from tuiapp.core.plan import launcher
from tuiapp.core.prelaunch import door
from tuiapp.core.run_folder import events as ev
from tuiapp.core.run_folder.metrics import JsonlReader
from tuiapp.core.run_folder.progress import fmt_duration, fmt_number, progress_line
from tuiapp.core.run_folder.rundir import ACTIVE, FINAL, read_phases
from tuiapp.core.run_folder.runstate import fmt_clock
from tuiapp.core.store import queue
from tuiapp.core.store.runs import RunStore

OUTCOME_EXIT = {"succeeded": EXIT_OK, "failed": EXIT_FAILED, "stopped": EXIT_INTERRUPTED}
FOLLOW_S = 0.2  # how often `llmtui run` looks at the run it follows (a look reads a few files: ~0.1 ms)


def _say(line: str) -> None:
    print(line, flush=True)


def cmd_run(args) -> int:
    store = RunStore(args.runs_dir)
    recipe = load_recipe(args.recipe, args.set)
    options = scale.launch_options(args)
    options.oversubscribe = args.oversubscribe
    if options.node_rank:  # node K joins the run node 0 started
        joining = service.plan_join(recipe, store, Path.cwd(), options, say=_say)
        if args.dry_run:
            print("\n".join(joining.preview()))
            return EXIT_OK
        run = service.join(joining, say=_say)
    else:
        plan, code = plan_or_exit(recipe, store, Path.cwd(), options, args.dry_run)
        if plan is None:
            return code
        run = service.launch(plan, store, say=_say)
    if args.detach:
        print(f"detached; follow with `llmtui show {run.id}`, stop with `llmtui stop {run.id}`")
        return EXIT_OK
    code = follow(run, store)
    if options.node_rank:
        scale.print_node_outcome(run, options.node_rank)
    return code


def plan_or_exit(recipe, store, base: Path, options, dry_run: bool) -> tuple[service.LaunchPlan | None, int]:
    """Plan a launch and print its refusal or its findings (stderr); on a dry run print the preview too
    (SLURM's closing line goes to stderr, its stdout being the sbatch script). The plan to launch, or
    None and the exit code when nothing is to be launched."""
    try:
        with waiting_clock(CHECKING, sys.stderr):
            plan = service.plan_launch(recipe, store, base, options)
    except service.LaunchRefused as exc:
        print(exc, file=sys.stderr)
        return None, EXIT_BAD_INPUT
    notes = door.format_findings(plan.findings)
    if notes:
        print(notes, file=sys.stderr)
    if dry_run:
        print("\n".join(plan.preview(store.root)))
        print("dry run: nothing was created", file=sys.stderr if plan.mode == "slurm" else sys.stdout)
        return None, EXIT_OK
    return plan, EXIT_OK


PHASE_REDRAW_S = 1.0  # a terminal's phase line is redrawn in place each second
PHASE_REPEAT_S = 10.0  # a pipe or file gets the line again every 10 s (no carriage returns there)
OPS_NOTE = ("DeepSpeed's CPU comm op: compiled once per Python environment (1-2 min on a busy machine; "
            "`make install` builds it), then cached")


def phase_line(phase: str | None, since: float | None, hang: str | None, now: float) -> str:
    """'starting: building ops 0:42 (what it is)': the phase, how long it has lasted, and a hang."""
    phase = phase or "launching"
    clock = f" {fmt_clock(now - since)}" if since else ""
    note = f" ({OPS_NOTE})" if phase == "building ops" else ""
    return f"starting: {phase}{clock}{note}" + (f" — ! {hang}" if hang else "")


class PhaseClock:
    """The start-up phase line with its clock: on a terminal one line redrawn in place every
    second; elsewhere a new line when the phase changes and every PHASE_REPEAT_S while it lasts.
    `say` prints any other line (ending a redrawn one first)."""

    def __init__(self, out) -> None:
        self.out = out
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        self.open = False  # a redrawn line is on screen without its newline
        self.last = 0.0

    def due(self, now: float) -> bool:
        return self.last > 0 and now - self.last >= (PHASE_REDRAW_S if self.tty else PHASE_REPEAT_S)

    def show(self, line: str, changed: bool, now: float) -> None:
        self.last = now
        if self.tty:
            if changed:
                self.end_line()
            self.out.write("\r\033[K" + line)
            self.out.flush()
            self.open = True
        else:
            print(line, file=self.out, flush=True)

    def end_line(self) -> None:
        if self.open:
            self.out.write("\n")
            self.out.flush()
            self.open = False

    def say(self, *args, **kwargs) -> None:
        self.end_line()
        print(*args, file=self.out, **{k: v for k, v in kwargs.items() if k != "file"})


CHECKING = door.CHECKING_LINE


@contextmanager
def waiting_clock(label: str, out):
    """A wait of the CLI's own (the checks before launch) as a phase line with its clock: redrawn each
    second on a terminal, repeated every PHASE_REPEAT_S elsewhere; ended before the block's output."""
    clock, started, done = PhaseClock(out), time.monotonic(), threading.Event()

    def tick() -> None:
        clock.show(f"{label} {fmt_clock(0)}", True, started)
        while not done.wait(0.2):
            now = time.monotonic()
            if clock.due(now):
                clock.show(f"{label} {fmt_clock(now - started)}", False, now)

    ticker = threading.Thread(target=tick, name="waiting-clock", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        clock.end_line()


def follow(run, store) -> int:
    """Print start-up phases and progress lines until the run ends; Ctrl-C stops the run cleanly."""
    follower = _Follower(run)
    interrupted = False

    def on_interrupt(signum, frame):
        nonlocal interrupted
        if interrupted:
            return
        interrupted = True
        print("\nstopping the run (checkpoint, then exit)...", flush=True)
        service.stop(run, wait=False)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        while not follower.step():
            time.sleep(FOLLOW_S)
    finally:
        follower.clock.end_line()
        signal.signal(signal.SIGINT, previous)
    bell = "\a" if sys.stdout.isatty() else ""  # the terminal's own notification when the run ends
    print(f"{bell}{run.id}: {run.status}" + (f" — {run.record.reason}" if run.record.reason else ""))
    if run.status == "succeeded":
        print(f"final model: {run.final_path}")
    return OUTCOME_EXIT.get(run.status, EXIT_FAILED)


class _Follower:
    """What `llmtui run` prints while it follows a run: its place in the queue, each start-up phase with
    its clock, tokenizing progress, evaluation progress, then a line per step and per evaluation."""

    def __init__(self, run) -> None:
        self.run = run
        self.reader = JsonlReader(run.metrics_path)
        self.events = JsonlReader(run.events_path)  # eval_progress: `eval 120/400` while the ranks evaluate
        self.rows: list[dict] = []
        self.shown: tuple = ()
        self.shown_figure: dict | None = None
        self.clock = PhaseClock(sys.stdout)

    def step(self) -> bool:
        """One look at the run; True once it has ended (its last evaluation printed)."""
        run = self.run
        record = run.load().refresh_truth().record
        if run.status == "queued":
            self._queued()
        if run.status == "starting" and not self.rows:
            self._starting(record)
        for event in self.events.read_new():
            if event.get("event") == ev.EVAL_PROGRESS:
                total = event.get("total")
                self.clock.say(f"eval {event.get('done')}/{total if total else '?'}  step {event.get('step')}  "
                               f"{fmt_duration(event.get('elapsed_s'))}", flush=True)
        for row in self.reader.read_new():
            if row.get("split", "train") == "train" and "step" in row:
                self.rows.append(row)
                self.clock.say(progress_line(row, self.rows), flush=True)
            elif row.get("split") == "eval":
                self.clock.say(f"eval step {row.get('step')}: loss {fmt_number(row.get('eval_loss'), '.4f')}", flush=True)
        if run.status not in FINAL:
            return False
        for row in self.reader.read_new():
            if row.get("split") == "eval":
                self.clock.say(f"eval step {row.get('step')}: loss {fmt_number(row.get('eval_loss'), '.4f')}")
        return True

    def _queued(self) -> None:
        place = queue.position(self.run.path.parent, self.run.id)
        if ("queued", place) != self.shown:
            self.shown = ("queued", place)
            self.clock.say(f"queued: #{place} in line (`llmtui queue`)" if place else "queued", flush=True)

    def _starting(self, record) -> None:
        hang = (record.hang or {}).get("message")
        state = (record.phase, hang)
        now = time.time()
        if state != self.shown or self.clock.due(now):  # each phase with its clock, redrawn while it lasts
            changed = state != self.shown
            self.shown = state
            self.clock.show(phase_line(record.phase, record.phase_since, hang, now), changed, now)
        figure = (read_phases(self.run.path).get(0) or {}).get("progress")
        if isinstance(figure, dict) and figure.get("total") and figure != self.shown_figure:
            self.shown_figure = figure  # rank 0 tokenizing: documents, throughput, ETA
            self.clock.say(f"tokenizing {figure.get('done', 0):,}/{figure['total']:,} docs  "
                           f"{figure.get('docs_per_s') or 0:,.0f} docs/s  {figure.get('mb_per_s') or 0:.1f} MB/s  "
                           f"ETA {fmt_duration(figure.get('eta_s'))}", flush=True)


def cmd_stop(args) -> int:
    run = RunStore(args.runs_dir).get(args.run)
    if run.status not in ACTIVE:
        print(f"{run.id} is {run.status}; nothing to stop")
        return EXIT_OK
    queued = run.status == "queued"  # nothing trained yet: no checkpoint to save, it never starts
    print(f"cancelling {run.id} (queued, never started)..." if queued
          else f"stopping {run.id} (checkpoint, then exit; killed after {args.grace:.0f}s)...")
    gone = service.stop(run, grace_s=args.grace)
    run.load()
    reason = f" — {run.record.reason}" if queued and run.record.reason else ""
    print(f"{run.id}: {run.status}{reason}" + ("" if gone else " (some processes could not be killed)"))
    return EXIT_OK if gone else EXIT_FAILED


def cmd_resume(args) -> int:
    store = RunStore(args.runs_dir)
    run = store.get(args.run)
    options = scale.resume_options(args)
    service.resume(run, options, say=_say)
    if args.detach:
        return EXIT_OK
    code = follow(run, store)
    if options.node_rank:
        scale.print_node_outcome(run, options.node_rank)
    return code


def cmd_doctor(args) -> int:
    from tuiapp.core.lifecycle import doctor

    print(doctor.diagnose(RunStore(args.runs_dir).get(args.run)))
    return EXIT_OK


# ---------------------------------------------------------------- parser


def add_run(add) -> None:
    p = add("run", cmd_run, "validate a recipe, create a run and launch it")
    p.add_argument("recipe")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a recipe key")
    p.add_argument("--dry-run", action="store_true", help="validate and print the command; create nothing")
    p.add_argument("--detach", action="store_true", help="return at once; the run goes on")
    p.add_argument("--oversubscribe", action="store_true", help="launch even when the memory estimate is over twice "
                   "what this machine has, or launch.gpus asks for more CPU ranks than it has cores")
    manage.add_queue_arguments(p)
    scale.add_run_arguments(p)


def add_control(add) -> None:
    """stop, resume, doctor."""
    p = add("stop", cmd_stop, "stop a run gracefully (checkpoint, then exit)")
    p.add_argument("run")
    p.add_argument("--grace", type=numbers.non_negative(), default=launcher.STOP_GRACE_S, help="seconds before SIGKILL")

    p = add("resume", cmd_resume, "continue a stopped or failed run from its last checkpoint")
    p.add_argument("run")
    p.add_argument("--detach", action="store_true")
    scale.add_resume_arguments(p)

    p = add("doctor", cmd_doctor, "every rank's phase, state and Python stack; which rank is behind")
    p.add_argument("run")
