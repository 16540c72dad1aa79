"""Line charts on textual-plotext that draw a downsampled copy of each series.

One drawing for the run view and compare: `CompareChart` draws lines on a chosen x range with
round ticks, y limits from percentiles where one spike would flatten the curves, and no legend on
the plot (compare shows a table beside it). `MetricChart` (the run view) is the same chart over
live Series (tuiapp.core.run_folder.rundata): each line downsampled to twice the plot's width (braille has
two dots per cell) with min/max per column, cached by the series' version and the width, eval
series drawn as marked points, and its legend on the title line, beside the plot.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, replace
from typing import Sequence

from textual_plotext import PlotextPlot

from tuiapp.core.run_folder.rundata import Series
from tuiapp.ui.comparing import nice_ticks, robust_limits, tick_label
from tuiapp.ui.downsample import minmax

Y_AXIS_CELLS = 11  # room plotext takes for y tick labels


class CachedPlot(PlotextPlot):
    """A plot that rebuilds its frame only when `frame_key()` changes (plotext's build is the costly part)."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._frame_key: tuple | None = None
        self._frame = None

    def frame_key(self) -> tuple:
        raise NotImplementedError

    def _build(self):
        raise NotImplementedError

    def render(self):
        key = self.frame_key()
        if key != self._frame_key:
            self._frame = self._build()
            self._frame_key = key
        return self._frame


@dataclass
class Line:
    """One run's curve as the compare chart draws it (x already on the chosen axis)."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    marker: str = "braille"
    color: str | None = None
    key: tuple = ()  # what the downsampled copy is cached by (the line's data and smoothing)
    points: bool = False  # marked points (evals), not a curve

    def __len__(self) -> int:
        return len(self.ys)


@dataclass(frozen=True)
class View:
    """What part of the lines a compare chart shows, and how."""

    x_range: tuple[float, float] | None = None
    cursor: float | None = None
    log_y: bool = False
    robust: bool = False  # y limits from percentiles (one spike does not set the axis)
    integer_x: bool = True
    x_label: str = "step"
    note: str = ""  # said after the title (x clipped, smoothing)


class CompareChart(CachedPlot):
    """Several runs' curves: a glyph and colour per run, no legend inside the plot (the compare
    screen shows it beside), round ticks, a zoomed x range, robust y limits, a cursor line."""

    DEFAULT_CSS = """
    CompareChart { height: 1fr; min-height: 6; }
    """
    X_TICK_CELLS = 8  # about one x tick per this many cells
    Y_TICK_ROWS = 3  # and one y tick per this many rows
    MIN_Y_TICKS = 2

    def __init__(self, title: str = "", *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.title_text = title
        self.lines: list[Line] = []
        self.view = View()
        self.points_drawn = 0
        self.y_limits: tuple[float, float] | None = None
        self.x_ticks: list[float] = []
        self._cache: dict[tuple, list] = {}

    @property
    def series(self) -> list[tuple[str, Line]]:
        return [(line.label, line) for line in self.lines]

    @property
    def x_label(self) -> str:
        return self.view.x_label

    def show(self, lines: list[Line], view: View) -> None:
        self.lines = list(lines)
        self.view = view
        self.refresh()

    def visible(self, line: Line, width: int) -> tuple[list[float], list[float]]:
        """The line's points inside the x range, downsampled to the plot's width."""
        x_range = self.view.x_range
        key = (line.key, x_range, width)
        if key in self._cache:
            return self._cache[key]
        start, end = 0, len(line.xs)
        if x_range is not None:
            start = max(0, bisect_left(line.xs, x_range[0]) - 1)  # one point past each edge
            end = min(len(line.xs), bisect_right(line.xs, x_range[1]) + 1)
        result = minmax(line.xs[start:end], line.ys[start:end], max(4, width * 2))
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[key] = result
        return result

    def frame_key(self) -> tuple:
        return (self.size, self.app.theme, self.title_text, self.view, tuple(line.key for line in self.lines))

    def _build(self):
        plt = self.plt
        plt.clear_figure()
        view = self.view
        width = max(4, self.size.width - Y_AXIS_CELLS)
        drawn = 0
        inside: list[float] = []
        for line in self.lines:
            xs, ys = self.visible(line, width)
            if view.log_y:
                pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y > 0]
                xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
            if not xs:
                continue
            if view.x_range is not None:
                inside += [y for x, y in zip(xs, ys, strict=True) if view.x_range[0] <= x <= view.x_range[1]]
            else:
                inside += ys
            if line.points:
                plt.scatter(xs, ys, marker=line.marker, color=line.color)
            else:
                plt.plot(xs, ys, marker=line.marker, color=line.color)
            drawn += len(xs)
        self.points_drawn = drawn
        title = self.title_text if drawn else f"{self.title_text} (no data yet)"
        plt.title(title + (f" · {view.note}" if view.note and drawn else ""))
        if not drawn:
            return PlotextPlot.render(self)
        if view.x_range is not None:
            plt.xlim(*view.x_range)
            low, high = view.x_range
        else:
            low, high = min(min(self.visible(line, width)[0] or [0.0]) for line in self.lines), max(
                max(self.visible(line, width)[0] or [0.0]) for line in self.lines)
        self.x_ticks = nice_ticks(low, high, max(2, width // self.X_TICK_CELLS), integer=view.integer_x)
        spacing = self.x_ticks[1] - self.x_ticks[0] if len(self.x_ticks) > 1 else 0.0
        plt.xticks(self.x_ticks, [tick_label(t, spacing) for t in self.x_ticks])
        if view.log_y:
            plt.yscale("log")
            self.y_limits = None
        else:
            self.y_limits = robust_limits(inside, view.robust)
            if self.y_limits is not None:
                plt.ylim(*self.y_limits)
                ticks = nice_ticks(*self.y_limits, max(self.MIN_Y_TICKS, int((self.size.height - 4) / self.Y_TICK_ROWS)))
                spacing = ticks[1] - ticks[0] if len(ticks) > 1 else 0.0
                plt.yticks(ticks, [tick_label(t, spacing) for t in ticks])
        if view.cursor is not None:
            plt.vline(view.cursor, "gray")
        if view.x_label and self.size.height > 8:
            plt.xlabel(view.x_label)
        return PlotextPlot.render(self)


LINE_MARKERS = ("braille", "•", "x", "+", "o", "*")  # the first line is a braille curve, the others glyphs
LEGEND_GLYPH = {"braille": "⠤"}
LINE_COLORS = ("cyan", "orange", "green", "magenta", "yellow", "red")


class MetricChart(CompareChart):
    """The run view's chart of live series: `set_series([(label, Series)])`, then `data_changed()`
    as rows arrive. Series whose label starts with `eval` are points (one per eval), not a curve.
    Its panes are small (a third of the screen, or a tab at 80x24): ticks sit closer than compare's."""

    X_TICK_CELLS = 6
    Y_TICK_ROWS = 1.5
    MIN_Y_TICKS = 3

    def __init__(self, title: str = "", x_label: str = "step", log_y: bool = False, robust: bool = False, *,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(title, id=id, classes=classes)
        self.base_title = title
        self.metric_series: list[tuple[str, Series]] = []
        self.view = View(log_y=log_y, robust=robust, x_label=x_label)

    @property
    def series(self) -> list[tuple[str, Series]]:
        return self.metric_series

    @property
    def log_y(self) -> bool:
        return self.view.log_y

    def set_series(self, series: list[tuple[str, Series]], x_label: str | None = None) -> None:
        self.metric_series = list(series)
        if x_label is not None:
            self.view = replace(self.view, x_label=x_label)
        self.data_changed()

    def data_changed(self) -> None:
        lines, legend = [], []
        shown = [(label, s) for label, s in self.metric_series if len(s)]
        for index, (label, series) in enumerate(self.metric_series):
            points = label.startswith("eval")
            marker = "•" if points and index else LINE_MARKERS[index % len(LINE_MARKERS)]
            color = LINE_COLORS[index % len(LINE_COLORS)]
            lines.append(Line(label, series.xs, series.ys, marker=marker, color=color, key=(id(series), series.version),
                              points=points))
            if len(series) and len(shown) > 1:
                legend.append(f"{LEGEND_GLYPH.get(marker, marker)} {label}")
        self.title_text = self.base_title + (f"  {'  '.join(legend)}" if legend else "")
        self.lines = lines
        self.refresh()

