"""Downsampling a series to the width of a plot, so a million points cost what a thousand do.

Pure functions. `minmax` keeps, for each of `buckets` consecutive slices of the series, the
lowest and the highest point (in the order they occur), so spikes survive and the envelope drawn
in each plot column is exact. `lttb` (largest triangle three buckets) keeps the visually most
significant point per bucket. numpy is used when it can be imported; the pure Python path gives
the same answer.
"""

from __future__ import annotations

import math
from array import array
from typing import Sequence

from tuiapp.core.run_folder.rundata import numpy_module


def _as_numpy(values: Sequence[float]):
    np = numpy_module()
    if isinstance(values, array) and values.typecode == "d":
        return np.frombuffer(values, dtype=np.float64) if len(values) else np.zeros(0)
    return np.asarray(values, dtype=np.float64)


def minmax(xs: Sequence[float], ys: Sequence[float], buckets: int, use_numpy: bool | None = None) -> tuple[list[float], list[float]]:
    """At most 2*buckets+2 points: the first and last, and the min and max of each slice, in
    their original order."""
    n = min(len(xs), len(ys))
    buckets = max(1, int(buckets))
    if n <= 2 * buckets:
        return [float(x) for x in xs[:n]], [float(y) for y in ys[:n]]
    if use_numpy is not False and numpy_module() is not None:
        return _minmax_numpy(xs, ys, n, buckets)
    return _minmax_python(xs, ys, n, buckets)


def _minmax_numpy(xs, ys, n: int, buckets: int):
    np = numpy_module()
    x = _as_numpy(xs)[:n]
    y = _as_numpy(ys)[:n]
    size = math.ceil(n / buckets)
    rows = math.ceil(n / size)
    pad = rows * size - n
    y2 = np.concatenate([y, np.full(pad, np.nan)]).reshape(rows, size)
    low = np.where(np.isnan(y2), np.inf, y2).argmin(axis=1)
    high = np.where(np.isnan(y2), -np.inf, y2).argmax(axis=1)
    first = np.minimum(low, high)
    second = np.maximum(low, high)
    base = np.arange(rows) * size
    index = np.empty(rows * 2, dtype=np.int64)
    index[0::2] = base + first
    index[1::2] = base + second
    index = np.concatenate([[0], index[index < n], [n - 1]])  # the ends fix the x range
    keep = np.ones(len(index), dtype=bool)
    keep[1:] = index[1:] != index[:-1]  # a flat slice gives the same point twice
    index = index[keep]
    return x[index].tolist(), y[index].tolist()


def _minmax_python(xs, ys, n: int, buckets: int):
    size = math.ceil(n / buckets)
    picked: list[int] = [0]
    for start in range(0, n, size):
        chunk = ys[start : min(n, start + size)]
        finite = [v for v in chunk if v == v] if any(v != v for v in chunk) else chunk
        if not len(finite):
            continue
        low_value, high_value = min(finite), max(finite)
        low = start + _index(chunk, low_value)
        high = start + _index(chunk, high_value)
        for i in sorted({low, high}):
            if i != picked[-1]:
                picked.append(i)
    if picked[-1] != n - 1:
        picked.append(n - 1)
    return [float(xs[i]) for i in picked], [float(ys[i]) for i in picked]


def _index(chunk, value) -> int:
    try:
        return chunk.index(value)
    except ValueError:  # pragma: no cover - only with exotic sequences
        return 0


def lttb(xs: Sequence[float], ys: Sequence[float], threshold: int) -> tuple[list[float], list[float]]:
    """Largest-triangle-three-buckets: `threshold` points that keep the shape of the line."""
    n = min(len(xs), len(ys))
    if threshold >= n or threshold < 3:
        return [float(x) for x in xs[:n]], [float(y) for y in ys[:n]]
    out_x = [float(xs[0])]
    out_y = [float(ys[0])]
    every = (n - 2) / (threshold - 2)
    a = 0
    for i in range(threshold - 2):
        start = int(math.floor(i * every)) + 1
        end = int(math.floor((i + 1) * every)) + 1
        avg_start = end
        avg_end = min(int(math.floor((i + 2) * every)) + 1, n)
        if avg_start >= avg_end:
            avg_start, avg_end = n - 1, n
        count = avg_end - avg_start
        avg_x = sum(xs[avg_start:avg_end]) / count
        avg_y = sum(ys[avg_start:avg_end]) / count
        ax, ay = xs[a], ys[a]
        best, best_area = start, -1.0
        for j in range(start, end):
            area = abs((ax - avg_x) * (ys[j] - ay) - (ax - xs[j]) * (avg_y - ay))
            if area > best_area:
                best, best_area = j, area
        out_x.append(float(xs[best]))
        out_y.append(float(ys[best]))
        a = best
    out_x.append(float(xs[n - 1]))
    out_y.append(float(ys[n - 1]))
    return out_x, out_y


def bucket_means(values: Sequence[float], buckets: int) -> list[float]:
    """`buckets` means of consecutive slices (for sparklines); the values when there are fewer."""
    n = len(values)
    if n <= buckets:
        return [float(v) for v in values]
    size = n / buckets
    out = []
    for i in range(buckets):
        chunk = values[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)]
        out.append(sum(chunk) / len(chunk))
    return out
