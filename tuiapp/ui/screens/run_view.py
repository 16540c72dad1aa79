"""One run: loss, LR, memory, throughput, log tail and eval samples, followed live; an online RL
run's generations with their rewards, step by step.

Thread workers tail metrics.jsonl (and an RL run's completions.jsonl) and the logs by offset and
post MetricsAppended / GenerationsAppended / LogAppended / RunStatusChanged; the handlers feed
RunData, the GenerationBrowser and the widgets. The first read of the metrics is read_run_data's
(MetricsRead): a long run's columns (metrics.columns, or the TUI's cache) and only the lines after
them, never the whole file parsed again.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.markup import escape
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Input, Static
from textual.worker import get_current_worker

from tuiapp.core.common.methods import is_preference, is_rl
from tuiapp.core.run_folder import reward_health, sequence_line
from tuiapp.core.run_folder.completions import GenerationsTail
from tuiapp.core.run_folder.metrics import read_jsonl, train_rows
from tuiapp.core.run_folder.rundata import RunData, columns_cache, read_run_data
from tuiapp.core.run_folder.rundir import RunDir, RunRecord
from tuiapp.core.run_folder.tail import TextTail, log_sources
from tuiapp.core.store import meta
from tuiapp.core.store.runs import ACTIVE, Run
from tuiapp.ui import actions, after_training
from tuiapp.ui.after_training import AfterTraining
from tuiapp.ui.footer_keys import footer_by_priority
from tuiapp.ui.generations import GenerationBrowser
from tuiapp.ui.manage_keys import META_BINDINGS, RunMetaActions, Target
from tuiapp.ui.messages import (
    ActionFailed,
    AfterTrainingRead,
    DoctorReported,
    GenerationsAppended,
    LogAppended,
    LogSourcesFound,
    MetricsAppended,
    MetricsRead,
    RunLaunched,
    RunMetaChanged,
    RunStatusChanged,
    RunStopped,
    RunStopping,
    SystemSampled,
)
from tuiapp.ui.run_panes import memory_text, samples_text, speed_text, status_text
from tuiapp.ui.widgets.charts import MetricChart
from tuiapp.ui.widgets.generations import GenerationsView
from tuiapp.ui.widgets.header import AppHeader
from tuiapp.ui.widgets.key_footer import KeyFooter
from tuiapp.ui.widgets.log_tail import LogTail
from tuiapp.ui.widgets.pane_deck import Pane, PaneDeck, PaneDeckActions, pane_bindings
from tuiapp.ui.worker_errors import reports_errors

RESUMABLE = ("stopped", "failed")
HACKING_CHECK_S = 10.0  # how often a live RL run's rewards are read again for the hacking check


class RewardHackingRead(Message):
    """The followed RL run's reward-hacking warning lines (reward_health.hacking_lines; [] = none)."""

    def __init__(self, run_id: str, lines: list[str]) -> None:
        super().__init__()
        self.run_id = run_id
        self.lines = lines


def reward_hacking_lines(run_path: Path, recipe: dict | None) -> list[str]:
    """The warning and its samples, from the run folder's train rows and latest generations."""
    path = RunDir(run_path).metrics
    rows = train_rows(read_jsonl(path)) if path.is_file() else []
    return reward_health.hacking_lines(rows, recipe, run_path)


def first_log(sources: list[tuple[str, Path]]) -> int:
    """The log shown first: rank 0's (of the latest attempt: names start with its start time),
    where the trainer writes; else the launcher's stdout."""
    ranks = [i for i, (label, _) in enumerate(sources) if label.startswith("ranks/") and label.endswith("rank0.log")]
    return ranks[-1] if ranks else 0


class RunViewScreen(RunMetaActions, PaneDeckActions, Screen):
    BINDINGS = [
        Binding("x", "stop", "Stop", tooltip="Stop gracefully: checkpoint, then exit"),
        Binding("r", "resume", "Resume", tooltip="Resume a stopped or failed run from its last checkpoint"),
        Binding("e", "clone", "Clone", tooltip="New experiment from this run's recipe"),
        Binding("l", "next_log", "Log source", tooltip="Switch between rank 0's log, the other ranks' and stdout.log"),
        Binding("slash", "search_log", "Search log", tooltip="Search the log (n / N: next / previous match, end: follow)"),
        Binding("d", "doctor", "Doctor", tooltip="Every rank's phase, state and Python stack, and which rank is behind"),
        Binding("C", "chat", "Chat", tooltip="Talk to the final model (ctrl+b there: its base beside)"),
        Binding("E", "evaluate", "Evaluate", tooltip="Score the final model vs its base on held-out data "
                "(loss, perplexity, exact match, ROUGE-L), as `llmtui eval`"),
        Binding("X", "export", "Export", tooltip="Write the final model to a folder (merged, cast), as `llmtui export`"),
        Binding("p", "next_pane", "Pane", tooltip="Next pane (1-6 pick one; 7 Rewards of a preference run, "
                "Generations of a grpo/rloo run)"),
        Binding("left_square_bracket", "step(-1)", "Prev step", tooltip="Generations of the previous logged step"),
        Binding("right_square_bracket", "step(1)", "Next step",
                tooltip="Generations of the next logged step (the last one follows new steps again)"),
        Binding("z", "zoom", "Zoom", tooltip="Maximize the current pane, or restore"),
        Binding("escape", "back", "Back", tooltip="Back to the history"),
        *META_BINDINGS,
        *pane_bindings(7),  # 7: Rewards, Generations
    ]
    _sequence_text: str | None = None  # the sequence-parallel line of the Speed pane (sequence_line.show_lines)

    # the footer's keys, most important first, as many as fit (the help screen and palette list all);
    # stop leads while the run lives, resume once it stopped or failed; then the log's own keys
    # while it has the focus
    FOOTER_PRIORITY = ["follow", "find(1)", "find(-1)", "back", "next_pane", "zoom", "clone", "chat", "search_log", "next_log", "help", "doctor",
                       "tag", "note", "rename"]

    @property
    def active_bindings(self):
        status = self.record.status
        first = ["stop"] if status in ACTIVE else ["resume"] if status in RESUMABLE else []
        steps = ["step(-1)", "step(1)"]  # first while the Generations pane shows, else last
        shown = self.is_rl and any(deck.active_id == "pane-generations" for deck in self.query(PaneDeck))
        priority = (steps if shown else []) + first + self.FOOTER_PRIORITY + \
            [a for a in ("stop", "resume") if a not in first] + ([] if shown else steps)
        return footer_by_priority(self.app, super().active_bindings, priority, self.size.width)

    def on_resize(self) -> None:
        self.refresh_bindings()

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.record = RunRecord()  # run.json as last read
        self.data = RunData()
        self.system = None
        self.sources: list[tuple[str, Path]] = []
        self.source_index = 0
        self.log_chosen = False  # the user picked a log with `l`: a new attempt's log does not take over
        self.loaded = False  # first read of metrics.jsonl done
        self.stopping = False  # the user confirmed a stop that is under way
        self.diagnosing = False
        self.is_rl = False  # grpo/rloo: the Generations pane follows completions.jsonl
        self.generations = GenerationBrowser()
        self.hacking: list[str] = []  # grpo/rloo: a shaping reward gamed while the primary stays flat
        self.generations_shown: tuple | None = None  # the step drawn last
        self.after: AfterTraining | None = None  # evaluations and exports (None: not read yet)

    @property
    def run_path(self) -> Path:
        return self.app.config.runs_root / self.run_id

    def compose(self) -> ComposeResult:
        yield AppHeader()
        yield Static("", id="rv-status")
        method_panes = self._method_panes()
        deck = PaneDeck(
            Pane("Loss", MetricChart("loss", id="chart-loss"), id="pane-loss"),
            Pane("LR", MetricChart("learning rate", id="chart-lr"), MetricChart("grad norm", robust=True, id="chart-grad"), id="pane-lr"),
            Pane("Memory", MetricChart("memory GB per rank", id="chart-mem"), Static("", id="rv-mem"), id="pane-mem"),
            Pane("Speed", MetricChart("tokens/s", robust=True, id="chart-speed"), Static("", id="rv-speed"), id="pane-speed"),
            Pane("Log", Static("", id="rv-log-source"), LogTail(id="rv-log"),
                 Input(placeholder="search the log (enter; n / N next / previous)", id="rv-log-search"), id="pane-log"),
            Pane("Samples", VerticalScroll(Static("", id="rv-samples", markup=False)), id="pane-samples"),
            *method_panes,
            id="rv-deck",
        )
        deck.set_class(bool(method_panes), "-seven")  # wide: a grid of 4 x 2, pane 7 two columns wide
        yield deck
        yield KeyFooter(compact=True)

    def _method_panes(self) -> list[Pane]:
        """Pane 7 of some methods. Preference runs: Rewards, the implicit rewards of the chosen and
        rejected answers and their margin, the fraction of pairs ranked right (and KTO's KL).
        grpo/rloo: Generations, each logged step's completions with every reward's score."""
        method = Run(self.run_path).load().record.method
        self.is_rl = is_rl(method)
        if self.is_rl:
            pane = Pane("Generations", VerticalScroll(GenerationsView(self.generations, id="rv-generations"),
                                                      id="rv-generations-scroll"), id="pane-generations")
        elif is_preference(method):
            pane = Pane("Rewards", MetricChart("rewards", id="chart-rewards"),
                        MetricChart("reward accuracy", id="chart-accuracy"), id="pane-rewards")
        else:
            return []
        return [pane.add_class("method-pane")]

    def on_mount(self) -> None:
        run = Run(self.run_path).load()
        self.record = run.record
        self.sub_title = meta.read_meta(self.run_path).get("display_name") or run.name
        self._bind_charts()
        self.query_one("#rv-log-search", Input).display = False
        self.sources = log_sources(self.run_path)
        self.source_index = first_log(self.sources)
        self._show_status()
        self._show_panes()
        self.set_interval(1.0, self._tick_clock)  # start-up and stop clocks move between file changes
        self.follow_metrics()
        self.follow_log(self.sources[self.source_index][1], self.sources[self.source_index][0])
        if self.app.config.system_monitor:
            self.monitor_system()

    def _bind_charts(self) -> None:
        """Point the charts at self.data's series (again once the first read replaced it)."""
        data = self.data
        self.query_one("#chart-loss", MetricChart).set_series([("train", data.loss), ("eval", data.eval_loss)])
        self.query_one("#chart-lr", MetricChart).set_series([("lr", data.series["lr"])])
        self.query_one("#chart-grad", MetricChart).set_series([("grad norm", data.series["grad_norm"])])
        self.query_one("#chart-speed", MetricChart).set_series([("tokens/s", data.series["tokens_per_s"])])
        if self.query("#chart-rewards"):  # preference runs (dpo, simpo, cpo, orpo, kto, reward)
            self.query_one("#chart-rewards", MetricChart).set_series(
                [("chosen", data.series["rewards/chosen"]), ("rejected", data.series["rewards/rejected"]),
                 ("margin", data.series["rewards/margins"])])
            self.query_one("#chart-accuracy", MetricChart).set_series(
                [("accuracy", data.series["rewards/accuracies"]), ("kl", data.series["kl"])])
        self.query_one("#chart-mem", MetricChart).set_series(sorted(data.memory.items()))

    # ------------------------------------------------------------ workers

    @work(thread=True, exclusive=True, group="metrics")
    def follow_metrics(self) -> None:
        config = self.app.config
        worker = get_current_worker()
        data, reader = read_run_data(RunDir(self.run_path).metrics, columns_cache(self.run_path))
        self.post_message(MetricsRead(self.run_id, data))
        generations = GenerationsTail(self.run_path) if self.is_rl else None
        run = Run(self.run_path)
        last_record: RunRecord | None = None
        last_after: tuple | None = None  # the evals/ and exports/ folders' stamp when last read
        last_status_check = 0.0
        last_hacking_check, rewards_changed = 0.0, self.is_rl
        while not worker.is_cancelled:
            records = reader.read_new()
            if records:
                self.post_message(MetricsAppended(self.run_id, records))
                rewards_changed = self.is_rl
            if rewards_changed and time.monotonic() - last_hacking_check >= HACKING_CHECK_S:
                last_hacking_check, rewards_changed = time.monotonic(), False
                self.post_message(RewardHackingRead(self.run_id, reward_hacking_lines(self.run_path,
                                                                                      run.load().record.recipe)))
            if generations is not None:
                found, reset = generations.read_new()
                if found or reset:
                    self.post_message(GenerationsAppended(self.run_id, found, reset))
            now = time.monotonic()
            if now - last_status_check >= 1.0 or last_record is None:
                last_status_check = now
                record = run.load().refresh_truth().record
                if record != last_record:
                    last_record = record.copy()
                    self.post_message(RunStatusChanged(self.run_id, last_record))
                stamp = after_training.stamp(self.run_path)  # `llmtui eval` / export from a shell too
                if stamp != last_after:
                    last_after = stamp
                    self.post_message(AfterTrainingRead({self.run_id: after_training.read(self.run_path)}))
            if not config.live:
                return
            time.sleep(config.poll_s if (last_record is not None and last_record.status in ACTIVE) else config.poll_s * 4)

    @work(thread=True, exclusive=True, group="log")
    def follow_log(self, path: Path, label: str) -> None:
        config = self.app.config
        worker = get_current_worker()
        tail = TextTail(path)
        found = [s[0] for s in self.sources]
        last_scan = time.monotonic()
        while not worker.is_cancelled:
            lines, reset = tail.read_new()
            if lines or reset:
                self.post_message(LogAppended(self.run_id, label, lines, reset))
            if not config.live:
                return
            if time.monotonic() - last_scan > 3.0:
                last_scan = time.monotonic()
                sources = log_sources(self.run_path)
                if [s[0] for s in sources] != found:
                    found = [s[0] for s in sources]
                    self.post_message(LogSourcesFound(self.run_id, sources))
            time.sleep(config.poll_s)

    @work(thread=True, exclusive=True, group="system")
    def monitor_system(self) -> None:
        from tuiapp.ui.system import SystemSampler

        worker = get_current_worker()
        sampler = SystemSampler()
        try:
            while not worker.is_cancelled:
                self.post_message(SystemSampled(sampler.sample()))
                for _ in range(20):
                    if worker.is_cancelled:
                        return
                    time.sleep(0.1)
        finally:
            sampler.close()

    # ------------------------------------------------------------ handlers

    def on_metrics_read(self, message: MetricsRead) -> None:
        self.data = message.data
        self._bind_charts()
        self.loaded = True
        self._show_status()
        self._show_panes()

    def on_metrics_appended(self, message: MetricsAppended) -> None:
        if not message.records:
            return
        self.data.extend(message.records)
        mem_chart = self.query_one("#chart-mem", MetricChart)
        if len(mem_chart.series) != len(self.data.memory):
            mem_chart.set_series(sorted(self.data.memory.items()))
        for chart in self.query(MetricChart):
            chart.data_changed()
        self._show_status()
        self._show_panes()

    def on_after_training_read(self, message: AfterTrainingRead) -> None:
        after = message.found.get(self.run_id)
        if after is None:
            return
        before, self.after = self.after, after
        if before is not None:  # arrived while the view is open: say so
            for text in after_training.news(before, after):
                self.notify(text, title=str(self.sub_title or self.run_id), markup=False)
        self._show_status()
        self._show_panes()

    def on_reward_hacking_read(self, message: RewardHackingRead) -> None:
        if message.lines != self.hacking:
            self.hacking = message.lines
            self._show_status()

    def on_generations_appended(self, message: GenerationsAppended) -> None:
        if message.reset:
            self.generations.clear()
        self.generations.add(message.generations)
        self._show_generations()

    def on_pane_deck_activated(self, message: PaneDeck.Activated) -> None:
        self.refresh_bindings()  # the step keys lead the footer while the Generations pane shows

    def on_run_status_changed(self, message: RunStatusChanged) -> None:
        self.record = message.record
        if self.record.status not in ACTIVE:
            self.stopping = False
        self._show_status()
        self.refresh_bindings()

    def on_log_appended(self, message: LogAppended) -> None:
        if message.source == self.sources[self.source_index][0]:
            self.query_one("#rv-log", LogTail).show(message.lines, message.reset)

    def on_log_sources_found(self, message: LogSourcesFound) -> None:
        current = self.sources[self.source_index][0]
        self.sources = message.sources
        labels = [s[0] for s in self.sources]
        latest = first_log(self.sources)
        if not self.log_chosen and labels[latest] != current:
            # a resume's rank 0 writes a new log: follow it, as the view did when it opened
            self._switch_log(latest)
            return
        self.source_index = labels.index(current) if current in labels else 0
        self._show_log_source()

    def _switch_log(self, index: int) -> None:
        self.source_index = index
        label, path = self.sources[index]
        self._show_log_source()
        self.query_one("#rv-log", LogTail).show([], reset=True)
        self.follow_log(path, label)

    def on_system_sampled(self, message: SystemSampled) -> None:
        self.system = message.sample
        self._show_panes()

    def on_run_stopping(self, message: RunStopping) -> None:
        self.stopping = True  # says `stopping` now; the supervisor writes it within ~0.2 s
        self._show_status()
        self.refresh_bindings()

    def on_run_stopped(self, message: RunStopped) -> None:
        self.stopping = False
        # the attempt ends now: a status alone would count it as not ended and say `took 0s` until
        # the next read of run.json
        record = self.record.copy()
        record.status, record.ended = message.status, record.ended or self.app.config.clock()
        self.record = record
        self._show_status()
        self.refresh_bindings()
        note = "" if message.clean else " (some processes had to be killed)"
        self.notify(f"{self._run_name()}: {message.status}{note}", title="Stopped")

    def _run_name(self) -> str:
        """The run's recipe name (its id until run.json says)."""
        return self.record.name if self.record.name is not None else self.run_id

    def managed_run(self) -> Target:
        """The run this view shows (the tag, note and rename keys act on it)."""
        return Target(self.run_id, self.run_path, str(self.sub_title or self.run_id), str(self.record.status))

    def on_run_meta_changed(self, message: RunMetaChanged) -> None:
        notes = message.notes
        self.sub_title = notes.get("display_name") or self._run_name()
        said = {"tag": "tags: " + (" ".join(f"#{t}" for t in notes.get("tags") or []) or "none"),
                "note": "note saved" if notes.get("note") else "note cleared",
                "rename": f"shown as {self.sub_title}"}
        self.notify(said.get(message.what, "saved"), title=str(self.sub_title))

    def on_run_launched(self, message: RunLaunched) -> None:
        self.notify("resumed from the last checkpoint", title=self._run_name())

    def on_action_failed(self, message: ActionFailed) -> None:
        """The app shows the error; here, only this screen's state goes back."""
        if message.action == "stop":
            self.stopping = False
            self._show_status()
            self.refresh_bindings()
        elif message.action == "doctor":
            self.diagnosing = False

    def on_doctor_reported(self, message: DoctorReported) -> None:
        self.diagnosing = False
        self.app.open_report(f"doctor · {self._run_name()}", message.text)

    # ------------------------------------------------------------ drawing

    def _tick_clock(self) -> None:
        if self.stopping or self.record.status in ACTIVE:
            self._show_status()

    def _show_status(self) -> None:
        text = status_text(self.record, self.data, self.app.config.clock(), stopping=self.stopping, run_path=self.run_path,
                           after=self.after)
        if self.hacking:  # grpo/rloo: the warning, then the samples that show it
            from tuiapp.ui.run_panes import literal

            text += "\n" + "\n".join(f"[$warning]{literal(line)}[/]" for line in self.hacking[:4])
        self.query_one("#rv-status", Static).update(text)

    def _show_panes(self) -> None:
        self.query_one("#rv-mem", Static).update(memory_text(self.data, self.system, self.app.config.system_monitor))
        if self._sequence_text is None:  # train.sequence_parallel: the degree and each rank's share, read once
            self._sequence_text = "".join("\n" + line.strip() for line in sequence_line.show_lines(self.run_path))
        self.query_one("#rv-speed", Static).update(speed_text(self.data) + self._sequence_text)
        self.query_one("#rv-samples", Static).update(samples_text(self.data, self.after))
        self._show_log_source()

    def _show_generations(self) -> None:
        """Draw the step shown; another step than before starts at its top (more of the same step
        keeps where the user scrolled)."""
        self.query_one("#rv-generations", GenerationsView).refresh(layout=True)
        if self.generations.current != self.generations_shown:
            self.generations_shown = self.generations.current
            self.query_one("#rv-generations-scroll", VerticalScroll).scroll_home(animate=False)

    def _show_log_source(self) -> None:
        label = self.sources[self.source_index][0] if self.sources else "-"
        count = len(self.sources)
        self.query_one("#rv-log-source", Static).update(
            f"log [reverse] {escape(label)} [/] {self.source_index + 1}/{count} · l next · / search · end follow")

    # ------------------------------------------------------------ actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        status = self.record.status
        if action == "stop":
            return True if status in ACTIVE and not self.stopping else None
        if action == "step":
            return self.is_rl
        if action in ("resume", "doctor"):
            allowed = RESUMABLE if action == "resume" else ACTIVE
            return True if status in allowed else None
        return True

    def action_stop(self) -> None:
        if self.record.status not in ACTIVE:
            self.notify("the run is not running")
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self.stop_run()

        name = self._run_name()
        self.app.confirm(f"Stop {name}?", "It saves a checkpoint first; resume later with r.", answer)

    @work(thread=True, exclusive=True, group="control")
    @reports_errors("stop")
    def stop_run(self) -> None:
        self.post_message(RunStopping(self.run_id))
        clean, status = actions.stop(self.run_path)
        self.post_message(RunStopped(self.run_id, clean, status))

    def action_resume(self) -> None:
        if self.record.status not in RESUMABLE:
            self.notify("only a stopped or failed run can be resumed")
            return
        self.resume_run()

    @work(thread=True, exclusive=True, group="control")
    @reports_errors("resume")
    def resume_run(self) -> None:
        actions.resume(self.run_path)  # the service picks the backend: local, node mode, SLURM
        self.post_message(RunLaunched(self.run_id, resumed=True))

    def action_doctor(self) -> None:
        if self.diagnosing:
            return
        self.diagnosing = True
        self.notify("reading every rank's phase and stack (a few seconds)…", title="Doctor")
        self.diagnose()

    @work(thread=True, exclusive=True, group="doctor")
    @reports_errors("doctor")
    def diagnose(self) -> None:
        self.post_message(DoctorReported(self.run_id, actions.diagnose(self.run_path)))

    def action_clone(self) -> None:
        self.app.open_clone(self.run_path)

    def action_chat(self) -> None:
        self.app.open_chat(self.run_id)

    def _has_final(self, verb: str) -> bool:
        if RunDir(self.run_path).final.is_dir():
            return True
        self.notify(f"no final model yet ({self.record.status or 'unknown'}); {verb} a succeeded run",
                    title=verb.capitalize(), severity="warning")
        return False

    def action_evaluate(self) -> None:
        if self._has_final("evaluate"):
            self.app.open_evaluate(self.run_id)

    def action_export(self) -> None:
        if self._has_final("export"):
            self.app.open_export(self.run_id)

    def pane_shown(self) -> None:
        """The log pane shown: the log takes the keys (home/end, n/N, scrolling); the Generations
        pane: its scroll takes the arrows."""
        active = self.query_one(PaneDeck).active_id
        if active == "pane-log":
            self.query_one("#rv-log", LogTail).focus()
        elif active == "pane-generations":
            self.query_one("#rv-generations-scroll", VerticalScroll).focus()

    def action_step(self, delta: int) -> None:
        """The previous or next logged step's generations (the pane comes to the front)."""
        deck = self.query_one(PaneDeck)
        if deck.active_id != "pane-generations":
            deck.activate("pane-generations")
            self.pane_shown()
        if self.generations.move(delta):
            self._show_generations()
        elif self.generations.current is not None:
            self.notify("the first kept step" if delta < 0 else "the newest step: following it", timeout=2)

    def action_search_log(self) -> None:
        self.query_one(PaneDeck).activate("pane-log")
        search = self.query_one("#rv-log-search", Input)
        search.display = True
        search.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "rv-log-search":
            return
        event.stop()
        log = self.query_one("#rv-log", LogTail)
        event.input.display = False
        log.focus()
        if event.value and not log.search(event.value):
            self.notify(f"not in the log: {event.value}", severity="warning")

    def action_back(self) -> None:
        search = self.query_one("#rv-log-search", Input)
        if search.display:  # esc leaves the search first
            search.display = False
            self.query_one("#rv-log", LogTail).focus()
            return
        super().action_back()

    def action_next_log(self) -> None:
        self.sources = log_sources(self.run_path)
        self.log_chosen = True
        self._switch_log((self.source_index + 1) % len(self.sources))
