"""Evaluate a run's model from the app (E on the history or the run view), as `llmtui eval` does:
held-out data (the demo by default, or a local file), a record limit, with or without the base
model; the scores (loss, perplexity, exact match, ROUGE-L, tuned vs base) and where they were
saved. The evaluation runs in a child process (core.after.evaluation); the history's eval column picks
the result up."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Checkbox, Input, Label, Static

from tuiapp.core.after import evaluation
from tuiapp.core.common.child_tool import ChildTool
from tuiapp.core.common.errors import UserError
from tuiapp.core.run_folder import evals
from tuiapp.ui.tool_form import ToolFormScreen


def data_argument(text: str, base_dir: Path) -> str:
    """The --data the child gets: a demo as typed, a path found under the app's folder made absolute
    (anything else as typed, so the refusal names it)."""
    text = text.strip()
    path = Path(text).expanduser()
    if text.startswith("demo:") or path.is_absolute() or not (base_dir / path).exists():
        return text
    return str(base_dir / path)


def parse_limit(text: str) -> int:
    text = text.strip() or "0"
    if not text.isdigit():
        raise UserError(message=f"limit '{text}' is not a number of records", key="limit",
                        fix="type 0 for all the records, or how many to read first (e.g. 100)")
    return int(text)


class EvaluateScreen(ToolFormScreen):
    ACTION = "evaluates"

    def compose(self) -> ComposeResult:
        with Vertical(id="tool-box"):
            yield Static(f"Evaluate {self.run_title}", id="tool-title", markup=False)
            with Horizontal(classes="tool-field"):
                yield Label("data ", classes="tool-label")
                yield Input(evaluation.default_data(self.run_path), placeholder="demo:facts-heldout or a "
                            ".jsonl/.json/.csv file",
                            compact=True, id="eval-data")
            with Horizontal(classes="tool-field"):
                yield Label("limit", classes="tool-label")
                yield Input("0", placeholder="0 = all records", compact=True, id="eval-limit")
            yield Checkbox("the base model too (tuned vs base)", True, compact=True, id="eval-base")
            yield from self.tool_lines()

    def request(self) -> evaluation.EvalRequest:
        data = self.query_one("#eval-data", Input).value
        if not data.strip():
            error = evaluation.no_default_data(self.run_path, in_form=True)
            raise UserError(message=error.message, key="data", fix=error.fix)
        return evaluation.EvalRequest(data=data_argument(data, self.base_dir),
                                      limit=parse_limit(self.query_one("#eval-limit", Input).value),
                                      no_base=not self.query_one("#eval-base", Checkbox).value)

    def plan(self, request: evaluation.EvalRequest) -> evaluation.EvalPlan:
        return evaluation.plan(self.run_path, request, self.base_dir)

    def tool_of(self, planned: evaluation.EvalPlan) -> ChildTool:
        return evaluation.tool(planned)

    def run_plan(self, planned: evaluation.EvalPlan, on_line: Callable[[str], None], child: ChildTool) -> dict:
        return evaluation.run(planned, on_line, child)

    def summary_of(self, planned: evaluation.EvalPlan) -> str:
        return planned.summary

    def show_result(self, result: Any) -> None:
        lines = evals.table(result) + [f"saved {result['path']}"]
        self.show("#tool-result", "\n".join(lines))
