"""Export a run's model from the app (X on the history or the run view), as `llmtui export` does:
a new folder, the adapter merged into its base or not, the weights cast or not; then the files
written. Refusals (a folder that is not empty, no final model...) are shown in the form with the
fix; the export runs in a child process (core.exporting)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Checkbox, Input, Label, Select, Static

from tuiapp.core import exporting
from tuiapp.core.child_tool import ChildTool
from tuiapp.core.errors import UserError
from tuiapp.core.runs import Run
from tuiapp.ui.tool_form import ToolFormScreen

FILES_SHOWN = 8


def out_folder(text: str, base_dir: Path) -> str:
    """The folder typed, made absolute against the app's folder."""
    path = Path(text.strip()).expanduser()
    return str(path if path.is_absolute() else base_dir / path)


def files_text(folder: str, files: list[str]) -> str:
    shown = files[:FILES_SHOWN]
    more = [f"… and {len(files) - FILES_SHOWN} more"] if len(files) > FILES_SHOWN else []
    return "\n".join([f"wrote {len(files)} file{'s' if len(files) != 1 else ''} to {folder}:",
                      *(f"  {name}" for name in shown), *more])


class ExportScreen(ToolFormScreen):
    ACTION = "exports"

    def compose(self) -> ComposeResult:
        with Vertical(id="tool-box"):
            yield Static(f"Export {self.run_id}", id="tool-title", markup=False)
            with Horizontal(classes="tool-field"):
                yield Label("to   ", classes="tool-label")
                yield Input(f"exports/{self.run_id}", placeholder="a new (or empty) folder", compact=True,
                            id="export-out")
            with Horizontal(classes="tool-field"):
                yield Label("dtype", classes="tool-label")
                yield Select([(name, name) for name in exporting.DTYPES], prompt="as trained", compact=True,
                             id="export-dtype")
            yield Checkbox("merge the adapter into its base model", False, compact=True, id="export-merge")
            yield from self.tool_lines()

    def request(self) -> exporting.ExportRequest:
        out = self.query_one("#export-out", Input).value
        if not out.strip():
            raise UserError(message="no folder to export to", key="to", fix="type a new (or empty) folder")
        dtype = self.query_one("#export-dtype", Select).value
        return exporting.ExportRequest(out=out_folder(out, self.base_dir),
                                       merge=self.query_one("#export-merge", Checkbox).value,
                                       dtype=None if dtype is Select.NULL else str(dtype))

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
