"""The models `llmtui serve` serves (V on the history, or the palette's "Served models"): each
run's name, its URL, its state (loading / serving, asked over HTTP) and backend; x stops the one
under the cursor (core.store.served.stop, as `llmtui serve RUN --stop`), d shows doctor's report on it
(its server's state and Python stack). Workers read and stop; the handlers own the table."""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from tuiapp.core.store import served
from tuiapp.core.store.runs import Run, RunStore
from tuiapp.ui.messages import DoctorReported, ServedListed, ServedStopped
from tuiapp.ui.widgets.key_footer import KeyFooter
from tuiapp.ui.worker_errors import reports_errors

COLUMNS = ("run", "url", "state", "backend")


def rows_of(models: list[served.Served], names: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """The table's rows: run name, URL (with 'token' when one is required), state, backend (and GPUs;
    'one base, N runs' when the server holds several runs' adapters)."""
    return [(names.get(m.run_id, m.run_id), m.url + ("  (token)" if m.auth else ""), m.state,
             m.backend + (f" GPU {','.join(map(str, m.gpus))}" if m.gpus else "")
             + (f" · one base, {len(m.shared) + 1} runs" if m.shared else "")) for m in models]


class ServedScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    ServedScreen { align: center middle; }
    #served-box {
        width: 100; max-width: 100%; height: auto; max-height: 90%;
        border: round $primary; border-title-color: $text-accent; background: $surface; padding: 0 1;
    }
    #served-table { height: auto; max-height: 16; }
    #served-status { color: $text-muted; margin-top: 1; }
    """
    BINDINGS = [
        Binding("x", "stop", "Stop", tooltip="Stop serving the model under the cursor (as llmtui serve RUN --stop)"),
        Binding("d", "doctor", "Doctor", tooltip="The server's state and Python stack (llmtui doctor RUN)"),
        Binding("r", "refresh", "Refresh", tooltip="Read every served model's state again"),
        Binding("escape,q", "close", "Close", tooltip="Back to the history"),
    ]

    def __init__(self, runs_root: Path) -> None:
        super().__init__()
        self.runs_root = Path(runs_root)
        self.models: list[served.Served] = []
        self.names: dict[str, str] = {}  # run id -> the name the list shows
        self.stopping: set[str] = set()

    def compose(self) -> ComposeResult:
        with Vertical(id="served-box") as box:
            box.border_title = "Served models (llmtui serve)"
            box.border_subtitle = "x stop · d doctor · r refresh · esc close"
            yield DataTable(id="served-table", cursor_type="row", zebra_stripes=False)
            yield Static("reading…", id="served-status", markup=False)
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*COLUMNS)
        self.list_served()
        if self.app.config.live:  # a server that finishes loading, or dies, shows so
            self.set_interval(max(self.app.config.history_poll_s, 1.0), self.list_served)

    @work(thread=True, exclusive=True, group="served-list")
    def list_served(self) -> None:
        models = served.served_models(RunStore(self.runs_root).run_dirs())
        names = {}
        for model in models:
            try:
                names[model.run_id] = Run(model.run_dir).load().record.name or model.run_id
            except Exception:  # a run folder being deleted: its id will do
                names[model.run_id] = model.run_id
        self.post_message(ServedListed(models, names))

    def on_served_listed(self, message: ServedListed) -> None:
        self.models, self.names = message.models, message.names
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        table.clear()
        for model, row in zip(message.models, rows_of(message.models, message.names), strict=True):
            table.add_row(*row, key=model.run_id)
        if message.models:
            table.move_cursor(row=min(cursor or 0, len(message.models) - 1))
        count = len(message.models)
        self.query_one("#served-status", Static).update(
            "no model is served: `llmtui serve RUN` serves one" if not count else
            f"{count} served model{'s' if count != 1 else ''}" + (f" · stopping {', '.join(sorted(self.stopping))}…"
                                                                  if self.stopping else ""))

    def _cursor_model(self) -> served.Served | None:
        table = self.query_one(DataTable)
        if not self.models or table.cursor_row is None or not 0 <= table.cursor_row < len(self.models):
            return None
        return self.models[table.cursor_row]

    def action_stop(self) -> None:
        model = self._cursor_model()
        if model is None or model.run_id in self.stopping:
            return

        def stop(yes: bool | None) -> None:  # asked first, as the history's x does
            if not yes or model.run_id in self.stopping:
                return
            self.stopping.add(model.run_id)
            self.query_one("#served-status", Static).update(f"stopping {model.run_id}…")
            self.stop_served(model)

        name = self.names.get(model.run_id, model.run_id)  # as the list shows it
        also = (f"; the same server serves {', '.join(self.names.get(r, r) for r in model.shared)}, which "
                "stop too") if model.shared else ""
        self.app.confirm(f"Stop serving {name}?", f"{model.url} ({model.run_id}) stops answering{also}; "
                         "`llmtui serve` starts it again", stop)

    @work(thread=True, group="served-stop")
    @reports_errors("stop")
    def stop_served(self, model: served.Served) -> None:
        self.post_message(ServedStopped(model.run_id, model.url, served.stop(model.run_dir)))

    def on_served_stopped(self, message: ServedStopped) -> None:
        self.stopping.discard(message.run_id)
        if message.gone:
            self.notify(f"stopped serving {message.run_id} on {message.url}", title="Served models", markup=False)
        else:
            self.notify(f"some processes of {message.run_id}'s server could not be killed", title="Served models",
                        severity="error", markup=False)
        self.list_served()

    def action_doctor(self) -> None:
        model = self._cursor_model()
        if model is not None:
            self.notify("reading the server's state and stack (a few seconds)…", title="Doctor")
            self.diagnose(model.run_dir)

    @work(thread=True, exclusive=True, group="served-doctor")
    @reports_errors("doctor")
    def diagnose(self, run_dir: Path) -> None:
        from tuiapp.core.lifecycle import doctor

        self.post_message(DoctorReported(run_dir.name, doctor.diagnose(Run(run_dir).load())))

    def on_doctor_reported(self, message: DoctorReported) -> None:
        self.app.open_report(f"doctor · {message.run_id}", message.text)

    def action_refresh(self) -> None:
        self.list_served()

    def action_close(self) -> None:
        self.dismiss(None)
