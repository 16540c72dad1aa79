"""The history table: a virtual (Line API) data table of runs.

Textual's DataTable re-measures and re-renders every cell of the screen on each update (about
0.2 s per update at 160x48 with 10,000 rows on a small machine, and seconds to take in 10,000
rows). This widget draws only the visible lines from the rows it is given, so 10,000 runs, live
updates, sorting and filtering cost the same as ten. The name column stays put while the
others scroll sideways.

A sweep is one line (a GroupRow: name, progress, best metric and combination) that unfolds into
its runs, shown indented by what varies between them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tuiapp.core.run_folder.evals import perplexity_text as eval_cell
from tuiapp.core.run_folder.progress import fmt_bytes, fmt_number, fmt_time
from tuiapp.core.run_folder.runstate import FLAGS
from tuiapp.ui.groups import METRIC_LABELS, GroupRow, combination
from tuiapp.ui.history import RunRow
from tuiapp.ui.widgets.sparkline import BLOCKS, WEB_BLOCKS, sparkline


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int
    right: bool = False


FIXED = [Column("mark", "", 2), Column("name", "name", 20)]
COLUMNS = [
    Column("status", "status", 17),
    Column("step", "step", 11, True),
    Column("last_loss", "loss", 8, True),
    Column("spark", "loss curve", 13),
    Column("best_eval", "best eval", 10, True),
    Column("preference", "acc/margin", 12, True),  # preference runs: best reward accuracy / margin
    Column("reward", "reward", 9, True),  # grpo/rloo runs: mean total reward of the last 10% of steps
    Column("tokens_per_s", "tok/s", 8, True),
    Column("peak_mem", "peak mem", 9, True),
    Column("duration", "duration", 10, True),
    Column("started", "started", 17),
    Column("method", "method", 14),
    Column("model", "model", 18),
    Column("dataset", "dataset", 16),
    Column("eval_ppl", "eval ppl", 18, True),  # the latest `llmtui eval`: tuned perplexity (base)
    Column("bench", "bench", 24),  # benchmarks: each task's main metric (core.run_folder.benchmarks)
]
SORTABLE = [c.key for c in FIXED[1:] + COLUMNS]
# the look of each shown status (marks in tuiapp.core.run_folder.runstate): one style class per key
STATUS_STYLES = ("created", "queued", "starting", "running", "stopping", "stopped", "succeeded", "failed", "unknown", *FLAGS)


def run_label(row: RunRow) -> str:
    """The name cell: the display name, else the name; a sweep's run is indented under its
    sweep and named by what varies (its name less the sweep's, 'lr0.003-rank8')."""
    if row.group_id is None:
        return row.title
    prefix = f"{(row.group or {}).get('name')}-"
    label = row.display_name or (row.name[len(prefix):] if row.name.startswith(prefix) else combination(row))
    return "└ " + (label or row.name)


def tags_text(row: RunRow) -> str:
    return "".join(f" #{tag}" for tag in row.tags)


def group_cells(group: GroupRow) -> tuple[str, str, str]:
    """A sweep's line: name (with ▸ folded / ▾ unfolded), progress, best metric and combination."""
    best = group.best
    rest = f"best {group.best_value:.4f} · {combination(best)}" if best else f"no {METRIC_LABELS[group.metric]} yet"
    return ("▾ " if group.expanded else "▸ ") + group.name, f"▦ {group.progress()}", rest


def cells(row: RunRow, now: float, web: bool = False) -> dict[str, str]:
    """The text of each column of a row (`web`: glyphs a browser font has, for serve-ui)."""
    view = row.view(now)
    step = ""
    if row.step is not None:
        step = f"{row.step:.0f}" + (f"/{row.max_steps:.0f}" if row.max_steps else "")
    return {
        "name": run_label(row) + tags_text(row),
        "status": view.cell,
        "step": step,
        "last_loss": fmt_number(row.last_loss, ".4f") if row.last_loss is not None else "",
        "spark": (sparkline(row.losses, 12, WEB_BLOCKS if web else BLOCKS) if row.losses or not row.unreadable
                  else "! unreadable" if web else "⚠ unreadable"),
        "best_eval": fmt_number(row.best_eval_loss, ".4f") if row.best_eval_loss is not None else "",
        "preference": preference_cell(row),
        "reward": fmt_number(row.reward, ".3f") if row.reward is not None else "",
        "tokens_per_s": fmt_number(row.tokens_per_s, ".0f") if row.tokens_per_s is not None else "",
        "peak_mem": fmt_bytes(row.peak_mem) if row.peak_mem is not None else "",
        "duration": row.time_text(now),
        "started": fmt_time(row.started or row.created),
        "method": row.method,
        "model": row.model,
        "dataset": row.dataset,
        "eval_ppl": eval_cell(row.eval_ppl, row.eval_base_ppl),
        "bench": " · ".join(f"{task} {value:.3g}" for task, value in row.bench.items()),
    }


def preference_cell(row: RunRow) -> str:
    """'0.74/1.02': a preference run's best reward accuracy and margin; blank for other runs."""
    if row.best_accuracy is None and row.best_margin is None:
        return ""
    return f"{fmt_number(row.best_accuracy, '.2f')}/{fmt_number(row.best_margin, '.2f')}"


def fit(text: str, width: int, right: bool = False) -> str:
    """Text in exactly `width` cells (one of them a gap), cut with an ellipsis."""
    room = width - 1
    if cell_len(text) > room:
        text = set_cell_size(text, room - 1) + "…"
    pad = room - cell_len(text)
    return (" " * pad + text + " ") if right else (text + " " * pad + " ")


class RunsTable(ScrollView, can_focus=True):
    """Runs, one per line, under a header that shows the sort column."""

    DEFAULT_CSS = """
    RunsTable { height: 1fr; }
    """
    COMPONENT_CLASSES = {
        "runs-table--header", "runs-table--cursor", "runs-table--cursor-blurred", "runs-table--marked",
        "runs-table--spark", "runs-table--empty", "runs-table--group", "runs-table--tags", *(f"runs-table--status-{key}" for key in STATUS_STYLES),
    }
    BINDINGS = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
        Binding("left", "scroll_left", "Left", show=False),
        Binding("right", "scroll_right", "Right", show=False),
        Binding("enter", "open", "Open", tooltip="Open the run under the cursor"),
    ]

    class Opened(Message):
        def __init__(self, run_id: str) -> None:
            super().__init__()
            self.run_id = run_id

    class Highlighted(Message):
        def __init__(self, run_id: str | None) -> None:
            super().__init__()
            self.run_id = run_id

    class HeaderClicked(Message):
        def __init__(self, column: str) -> None:
            super().__init__()
            self.column = column

    def __init__(self, *, now=None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.rows: list[RunRow | GroupRow] = []
        self.marked: set[str] = set()
        self.serving: dict[str, str] = {}  # run id -> URL of its served model
        self.cursor = 0
        self.sort_key: str | None = None
        self.sort_reverse = False
        self.empty_text = "loading runs…"
        self._now = now
        self._fixed_width = sum(c.width for c in FIXED)
        self._scroll_width = sum(c.width for c in COLUMNS)
        self.virtual_size = Size(self._fixed_width + self._scroll_width, 1)

    # ------------------------------------------------------------ data in

    def set_rows(self, rows: list[RunRow | GroupRow], marked: set[str] | None = None) -> None:
        current = self.cursor_run_id
        self.rows = rows
        if marked is not None:
            self.marked = set(marked)
        if current is not None:
            for index, row in enumerate(rows):
                if row.id == current:
                    self.cursor = index
                    break
        self.cursor = max(0, min(self.cursor, len(rows) - 1))
        self.virtual_size = Size(self._fixed_width + self._scroll_width, len(rows) + 1)
        self.refresh()
        if self.cursor_run_id != current:
            self.post_message(self.Highlighted(self.cursor_run_id))

    def set_serving(self, serving: dict[str, str]) -> None:
        self.serving = dict(serving)
        self.refresh()

    def set_sort(self, key: str | None, reverse: bool) -> None:
        self.sort_key, self.sort_reverse = key, reverse
        self.refresh()

    @property
    def cursor_run_id(self) -> str | None:
        """The id of the line under the cursor: a run's, or 'group:<id>' on a sweep's line."""
        return self.rows[self.cursor].id if 0 <= self.cursor < len(self.rows) else None

    @property
    def cursor_row(self) -> RunRow | GroupRow | None:
        return self.rows[self.cursor] if 0 <= self.cursor < len(self.rows) else None

    def move_to_id(self, row_id: str) -> None:
        """Put the cursor on a line by id (a run, or 'group:<id>')."""
        for index, row in enumerate(self.rows):
            if row.id == row_id:
                self._move_to(index)
                return

    @property
    def now(self) -> float:
        return self._now() if self._now else self.app.config.clock()

    # ------------------------------------------------------------ drawing

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            style = self.get_component_rich_style("runs-table--header")
            return self._arrows(self._line(self._header_cells(), style, width), style, width)
        index = int(self.scroll_offset.y) + y - 1
        if not self.rows and y == 2:
            style = self.get_component_rich_style("runs-table--empty")
            return Strip([Segment(" " + self.empty_text, style)]).adjust_cell_length(width, style)
        if index >= len(self.rows):
            return Strip.blank(width, self.rich_style)
        row = self.rows[index]
        cursor = None
        if index == self.cursor:
            cursor = self.get_component_rich_style("runs-table--cursor" if self.has_focus else "runs-table--cursor-blurred")
        if isinstance(row, GroupRow):
            return self._group_line(row, cursor, width)
        texts = cells(row, self.now, web=self.app.is_web)
        texts["mark"] = "◆" if row.id in self.marked else ""
        if row.id in self.serving:  # its model is served (`llmtui serve`): the history's V lists it
            texts["name"] = "⇄ " + texts["name"]
        tags = len(tags_text(row))
        if cursor is not None:
            return self._line(texts, cursor, width, tags=tags)
        base = self.get_component_rich_style("runs-table--marked") if row.id in self.marked else self.rich_style
        shown = row.display_status(self.now)
        status_style = self.get_component_rich_style(f"runs-table--status-{shown}", partial=True) if shown in STATUS_STYLES else None
        extra = {"status": status_style, "spark": self.get_component_rich_style("runs-table--spark", partial=True),
                 "tags": self.get_component_rich_style("runs-table--tags", partial=True)}
        return self._line(texts, base, width, extra, tags=tags)

    def _group_line(self, group: GroupRow, cursor: Style | None, width: int) -> Strip:
        """A sweep: mark and name in the fixed columns; progress in the status column, then its
        best metric and combination flowing over the other columns."""
        name, progress, rest = group_cells(group)
        marked = bool(group.runs) and all(r.id in self.marked for r in group.runs)
        base = cursor or (self.get_component_rich_style("runs-table--marked") if marked else self.rich_style)
        if cursor is None:
            base = base + self.get_component_rich_style("runs-table--group", partial=True)
        mark, name_column = FIXED
        status = COLUMNS[0]
        fixed = [Segment(fit("◆" if marked else "", mark.width), base), Segment(fit(name, name_column.width), base)]
        moving = [Segment(fit(progress, status.width), base),
                  Segment(fit(rest, self._scroll_width - status.width), base)]
        return self._join(fixed, moving, base, width)

    def _header_cells(self) -> dict[str, str]:
        out = {}
        for column in FIXED + COLUMNS:
            label = column.label
            if column.key == self.sort_key:
                label += " ▼" if self.sort_reverse else " ▲"
            out[column.key] = label
        return out

    def _line(self, texts: dict[str, str], base: Style, width: int, extra: dict | None = None, tags: int = 0) -> Strip:
        """One line of cells; the last `tags` characters of the name are its tags (own style)."""
        extra = extra or {}
        fixed = [Segment(fit(texts.get(c.key, ""), c.width, c.right), base + extra[c.key] if extra.get(c.key) else base) for c in FIXED]
        if tags and extra.get("tags"):
            name = fixed[-1]
            split = cell_len(texts["name"]) - tags
            if split < FIXED[-1].width - 1:
                left, right = name.split_cells(split)
                fixed[-1:] = [left, Segment(right.text, base + extra["tags"])]
        moving = [Segment(fit(texts.get(c.key, ""), c.width, c.right), base + extra[c.key] if extra.get(c.key) else base) for c in COLUMNS]
        return self._join(fixed, moving, base, width)

    def _join(self, fixed: list[Segment], moving: list[Segment], base: Style, width: int) -> Strip:
        """The fixed columns, then the moving ones scrolled sideways, in exactly `width` cells."""
        scroll_x = int(self.scroll_offset.x)
        room = max(0, width - self._fixed_width)
        strip = Strip(fixed, self._fixed_width).crop(0, width)
        if room:
            tail = Strip(moving, self._scroll_width).crop(scroll_x, scroll_x + room)
            strip = Strip.join([strip, tail])
        return strip.adjust_cell_length(width, base)

    def _arrows(self, header: Strip, style: Style, width: int) -> Strip:
        """The header with `◂` where columns are scrolled off to the left and `▸` where more lie to
        the right (the table has no horizontal scrollbar: ← / → move by whole columns)."""
        scroll_x, edge = int(self.scroll_offset.x), self._fixed_width - 1
        if width <= self._fixed_width + 2:
            return header
        if scroll_x > 0:
            header = Strip.join([header.crop(0, edge), Strip([Segment("◂", style)]), header.crop(edge + 1, width)])
        if scroll_x < self.max_scroll_x:
            header = Strip.join([header.crop(0, width - 1), Strip([Segment("▸", style)])])
        return header

    # ------------------------------------------------------------ moving

    def column_edges(self) -> list[int]:
        """Where each scrolling column starts (the sideways offsets the arrow keys stop at)."""
        edges, x = [], 0
        for column in COLUMNS:
            edges.append(x)
            x += column.width
        return edges

    def action_scroll_right(self) -> None:
        """One whole column to the right (the last stop shows the last column whole)."""
        x, last = int(self.scroll_offset.x), int(self.max_scroll_x)
        stop = next((edge for edge in self.column_edges() if edge > x), last)
        self.scroll_to(x=min(stop, last), animate=False)
        self.refresh()

    def action_scroll_left(self) -> None:
        """One whole column to the left."""
        x = int(self.scroll_offset.x)
        stops = [edge for edge in self.column_edges() if edge < x]
        self.scroll_to(x=stops[-1] if stops else 0, animate=False)
        self.refresh()

    def _move_to(self, index: int) -> None:
        if not self.rows:
            return
        index = max(0, min(index, len(self.rows) - 1))
        changed = index != self.cursor
        self.cursor = index
        visible = max(1, self.size.height - 1 - (1 if self.show_horizontal_scrollbar else 0))
        top = int(self.scroll_offset.y)
        if index < top:
            self.scroll_to(y=index, animate=False)
        elif index >= top + visible:
            self.scroll_to(y=index - visible + 1, animate=False)
        self.refresh()
        if changed:
            self.post_message(self.Highlighted(self.cursor_run_id))

    def action_cursor(self, delta: int) -> None:
        self._move_to(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self._move_to(self.cursor + direction * max(1, self.size.height - 2))

    def action_jump(self, where: int) -> None:
        self._move_to(0 if where == 0 else len(self.rows) - 1)

    def action_open(self) -> None:
        if self.cursor_run_id:
            self.post_message(self.Opened(self.cursor_run_id))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        if offset.y == 0:
            column = self._column_at(offset.x)
            if column and column in SORTABLE:
                self.post_message(self.HeaderClicked(column))
            return
        index = int(self.scroll_offset.y) + offset.y - 1
        if 0 <= index < len(self.rows):
            self._move_to(index)
            if event.chain >= 2:
                self.action_open()

    def _column_at(self, x: int) -> str | None:
        edge = 0
        for column in FIXED:
            edge += column.width
            if x < edge:
                return column.key
        x = x - self._fixed_width + int(self.scroll_offset.x)
        edge = 0
        for column in COLUMNS:
            edge += column.width
            if x < edge:
                return column.key
        return None

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
