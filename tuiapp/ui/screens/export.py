"""Export a run's model from the app (X on the history or the run view), as `llmtui export` does:
a new folder, the adapter merged into its base or not, the weights cast or not, GGUF files of some
types (with a llama.cpp folder, or the converter `make gguf` unpacked), their parity check and an
Ollama name; then the files written. What the GGUF export will use, or why it would be refused
(core.after.exporting.gguf_readiness, the checks `llmtui export` makes), shows under its fields as they
change, before anything starts; other refusals (a folder that is not empty, no final model...)
are shown with the fix when it starts. The export runs in a child process (core.after.exporting)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Checkbox, Input, Label, Select, Static

from tuiapp.core.after import exporting
from tuiapp.core.common.child_tool import ChildTool
from tuiapp.core.common.errors import UserError
from tuiapp.core.prelaunch.model_check import adapter_kind
from tuiapp.core.run_folder.rundir import RunDir
from tuiapp.core.store.runs import Run
from tuiapp.ui.messages import ExportToolsChecked, ToolFinished
from tuiapp.ui.tool_form import ToolFormScreen

FILES_SHOWN = 8


def out_folder(text: str, base_dir: Path) -> str:
    """The folder typed, made absolute against the app's folder."""
    path = Path(text.strip()).expanduser()
    return str(path if path.is_absolute() else base_dir / path)


FIELD_WORDS = (  # core's CLI flags (longest first) as the Export form's fields
    ("--llama-cpp", "the llama field"), ("--ollama", "the ollama field"), ("--gguf", "the gguf field"),
    ("--no-parity", "no parity check"), ("--merge", "merge"), ("--dtype", "dtype"), ("--out", "the to field"),
)


def form_words(text: str) -> str:
    """A refusal of core's (worded for `llmtui export`) in the form's words: its fields, not flags."""
    text = re.sub(r"\b(add|pass) --(gguf|llama-cpp|ollama) (\S+)", r"type \3 in the \2 field", text)
    text = text.replace("the llama-cpp field", "the llama field")
    for flag, words in FIELD_WORDS:
        text = re.sub(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", words, text)
    return text


def files_text(folder: str, files: list[str]) -> str:
    shown = files[:FILES_SHOWN]
    more = [f"… and {len(files) - FILES_SHOWN} more"] if len(files) > FILES_SHOWN else []
    return "\n".join([f"wrote {len(files)} file{'s' if len(files) != 1 else ''} to {folder}:",
                      *(f"  {name}" for name in shown), *more])


class ExportScreen(ToolFormScreen):
    DEFAULT_CSS = """
    #export-gguf-check { color: $text-success; margin-bottom: 1; }
    #export-gguf-check.-refused { color: $text-error; }
    """
    ACTION = "exports"

    def in_form_words(self, text: str) -> str:
        return form_words(text)

    def compose(self) -> ComposeResult:
        with Vertical(id="tool-box"):
            yield Static(f"Export {self.run_title}", id="tool-title", markup=False)
            with Horizontal(classes="tool-field"):
                yield Label("to   ", classes="tool-label")
                yield Input(f"exports/{self.run_id}", placeholder="a new (or empty) folder", compact=True,
                            id="export-out")
            with Horizontal(classes="tool-field"):
                yield Label("dtype", classes="tool-label")
                yield Select([(name, name) for name in exporting.DTYPES], prompt="as trained", compact=True,
                             id="export-dtype")
            if adapter_kind(RunDir(self.run_path).final):
                yield Checkbox("merge the adapter into its base model", False, compact=True, id="export-merge")
            else:  # every weight trained: export refuses --merge
                yield Checkbox("merge: no adapter, every weight trained", False, compact=True, disabled=True,
                               id="export-merge")
            with Horizontal(classes="tool-field"):
                yield Label("gguf ", classes="tool-label")
                yield Input("", placeholder="GGUF types, e.g. q8_0,q4_k_m (empty: no GGUF)", compact=True,
                            id="export-gguf")
            with Horizontal(classes="tool-field"):
                yield Label("llama", classes="tool-label")
                yield Input("", placeholder="llama.cpp folder (empty: the converter `make gguf` unpacked)",
                            compact=True, id="export-llama-cpp")
            with Horizontal(classes="tool-field"):
                yield Label("ollama", classes="tool-label")
                yield Input("", placeholder="a name to `ollama create` from the GGUF (optional)", compact=True,
                            id="export-ollama")
            yield Checkbox("parity check of the GGUF (greedy answers vs the trained model)", True, compact=True,
                           id="export-parity")
            yield Static("", id="export-gguf-check", markup=False)
            yield from self.tool_lines()

    _checks = 0  # the GGUF fields' checks started; only the latest one's answer is shown
    _gguf_refusal: str | None = None  # the GGUF line's refusal as shown

    def on_mount(self) -> None:
        super().on_mount()
        self.show("#export-gguf-check", "")

    def _text(self, selector: str) -> str | None:
        return self.query_one(selector, Input).value.strip() or None

    def request(self) -> exporting.ExportRequest:
        out = self.query_one("#export-out", Input).value
        if not out.strip():
            raise UserError(message="no folder to export to", key="to", fix="type a new (or empty) folder")
        llama_cpp = self._text("#export-llama-cpp")
        return self._request(out_folder(out, self.base_dir), llama_cpp and out_folder(llama_cpp, self.base_dir))

    def _request(self, out: str, llama_cpp: str | None) -> exporting.ExportRequest:
        dtype = self.query_one("#export-dtype", Select).value
        return exporting.ExportRequest(out=out, merge=self.query_one("#export-merge", Checkbox).value,
                                       dtype=None if dtype is Select.NULL else str(dtype),
                                       gguf=self._text("#export-gguf"), llama_cpp=llama_cpp,
                                       no_parity=not self.query_one("#export-parity", Checkbox).value,
                                       ollama=self._text("#export-ollama"))

    @on(Input.Changed, "#export-gguf, #export-llama-cpp, #export-ollama")
    @on(Checkbox.Changed, "#export-parity")
    def gguf_fields_changed(self) -> None:
        """What the GGUF export will use, or its refusal, checked again as its fields change."""
        out = self.query_one("#export-out", Input).value.strip() or "."
        llama_cpp = self._text("#export-llama-cpp")
        self._checks += 1
        self.check_gguf(self._request(out_folder(out, self.base_dir),
                                      llama_cpp and out_folder(llama_cpp, self.base_dir)), self._checks)

    @work(thread=True, group="gguf-check")
    def check_gguf(self, request: exporting.ExportRequest, number: int) -> None:
        try:
            text = exporting.gguf_readiness(request)
        except UserError as exc:
            self.post_message(ExportToolsChecked(f"✗ {exc}", refused=True, number=number))
        else:
            self.post_message(ExportToolsChecked(f"✓ {text}" if text else "", number=number))

    def on_export_tools_checked(self, message: ExportToolsChecked) -> None:
        if message.number != self._checks:
            return  # a check of fields changed since: its answer is stale
        self.show("#export-gguf-check", message.text)
        self.query_one("#export-gguf-check", Static).set_class(message.refused, "-refused")
        self._gguf_refusal = message.text if message.refused else None

    def on_tool_finished(self, message: ToolFinished) -> None:
        """A launch refused for what the GGUF line already says: said once, in the form's error line."""
        if message.error and self._gguf_refusal == f"✗ {message.error}":
            self.show("#export-gguf-check", "")
            self._gguf_refusal = None

    def plan(self, request: exporting.ExportRequest) -> exporting.ExportPlan:
        return exporting.plan(Run(self.run_path).load(), request)

    def tool_of(self, planned: exporting.ExportPlan) -> ChildTool:
        return exporting.tool(planned)

    def run_plan(self, planned: exporting.ExportPlan, on_line: Callable[[str], None], child: ChildTool) -> list:
        return [str(planned.out), exporting.run(planned, on_line, child)]

    def summary_of(self, planned: exporting.ExportPlan) -> str:
        return f"exporting {planned.run_id} to {planned.out}…"

    def show_result(self, result: Any) -> None:
        folder, files = result
        self.show("#tool-result", files_text(folder, files))
