"""Line charts on textual-plotext that draw a downsampled copy of each series.

A chart holds references to Series (tuiapp.ui.rundata) and, when it renders, downsamples each
to twice its width (braille has two dots per cell) with min/max per column. The copy is cached
by the series' version and the width, so a redraw without new data costs only plotext's build.
"""

from __future__ import annotations

from textual_plotext import PlotextPlot

from tuiapp.ui.downsample import minmax
from tuiapp.ui.rundata import Series

Y_AXIS_CELLS = 11  # room plotext takes for y tick labels


class MetricChart(PlotextPlot):
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
        self._frame_key: tuple | None = None
        self._frame = None

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

    def render(self):
        key = (
            self.size, self.app.theme, self.theme, self.title_text, self.x_label, self.log_y,
            tuple((label, id(series), series.version) for label, series in self.series),
        )
        if key == self._frame_key:
            return self._frame  # nothing changed: plotext's build is the costly part
        self._frame = self._build()
        self._frame_key = key
        return self._frame

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
        return super().render()
