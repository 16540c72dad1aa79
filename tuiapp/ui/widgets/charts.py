"""Line charts on textual-plotext that draw a downsampled copy of each series.

`MetricChart` (the run view) holds references to Series (tuiapp.core.rundata) and, when it renders, downsamples each
to twice its width (braille has two dots per cell) with min/max per column. The copy is cached
by the series' version and the width, so a redraw without new data costs only plotext's build.
`CompareChart` draws the compare screen's lines on a chosen x range with round ticks.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Sequence

from textual_plotext import PlotextPlot

from tuiapp.core.rundata import Series
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


class MetricChart(CachedPlot):
    DEFAULT_CSS = """
    MetricChart { height: 1fr; min-height: 6; }
    """

    def __init__(self, title: str = "", x_label: str = "step", log_y: bool = False, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.title_text = title
        self.x_label = x_label
        self.log_y = log_y
        self.series: list[tuple[str, Series]] = []
        self._cache: dict[int, tuple[int, int, tuple[list[float], list[float]]]] = {}
        self.points_drawn = 0

    def set_series(self, series: list[tuple[str, Series]], x_label: str | None = None) -> None:
        self.series = list(series)
        if x_label is not None:
            self.x_label = x_label
        self._cache = {k: v for k, v in self._cache.items() if any(id(s) == k for _, s in self.series)}
        self.refresh()

    def data_changed(self) -> None:
        self.refresh()

    def downsampled(self, series: Series, width: int) -> tuple[list[float], list[float]]:
        buckets = max(4, width * 2)
        cached = self._cache.get(id(series))
        if cached and cached[0] == series.version and cached[1] == buckets:
            return cached[2]
        result = minmax(series.xs, series.ys, buckets)
        self._cache[id(series)] = (series.version, buckets, result)
        return result

    def frame_key(self) -> tuple:
        return (
            self.size, self.app.theme, self.theme, self.title_text, self.x_label, self.log_y,
            tuple((label, id(series), series.version) for label, series in self.series),
        )

    def _build(self):
        plt = self.plt
        plt.clear_figure()
        width = max(4, self.size.width - Y_AXIS_CELLS)
        drawn = 0
        labelled = len(self.series) > 1
        for label, series in self.series:
            if not len(series):
                continue
            xs, ys = self.downsampled(series, width)
            if labelled:
                plt.plot(xs, ys, marker="braille", label=label)
            else:
                plt.plot(xs, ys, marker="braille")
            drawn += len(xs)
        self.points_drawn = drawn
        if self.log_y and drawn:
            plt.yscale("log")
        plt.title(self.title_text if drawn else f"{self.title_text} (no data yet)")
        if self.x_label and self.size.height > 8:
            plt.xlabel(self.x_label)
        return PlotextPlot.render(self)


@dataclass
class Line:
    """One run's curve as the compare chart draws it (x already on the chosen axis)."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    marker: str = "braille"
    color: str | None = None
    key: tuple = ()  # what the downsampled copy is cached by (the line's data and smoothing)

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
        self.x_ticks = nice_ticks(low, high, max(2, width // 8), integer=view.integer_x)
        spacing = self.x_ticks[1] - self.x_ticks[0] if len(self.x_ticks) > 1 else 0.0
        plt.xticks(self.x_ticks, [tick_label(t, spacing) for t in self.x_ticks])
        if view.log_y:
            plt.yscale("log")
            self.y_limits = None
        else:
            self.y_limits = robust_limits(inside, view.robust)
            if self.y_limits is not None:
                plt.ylim(*self.y_limits)
                ticks = nice_ticks(*self.y_limits, max(2, (self.size.height - 4) // 3))
                spacing = ticks[1] - ticks[0] if len(ticks) > 1 else 0.0
                plt.yticks(ticks, [tick_label(t, spacing) for t in ticks])
        if view.cursor is not None:
            plt.vline(view.cursor, "gray")
        if view.x_label and self.size.height > 8:
            plt.xlabel(view.x_label)
        return PlotextPlot.render(self)
