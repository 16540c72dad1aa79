"""Downsampling and sparklines: pure functions."""

from __future__ import annotations

import math
import random
from array import array

import pytest

from tuiapp.ui import downsample
from tuiapp.ui.widgets.sparkline import BLOCKS, sparkline


def _series(n: int, seed: int = 0):
    rng = random.Random(seed)
    xs = array("d", range(n))
    ys = array("d", (math.sin(i / 50) + rng.random() * 0.1 for i in range(n)))
    return xs, ys


@pytest.mark.parametrize("use_numpy", [True, False])
def test_minmax_keeps_extremes_and_order(use_numpy):
    if use_numpy and downsample.numpy_module() is None:
        pytest.skip("numpy not installed")
    xs, ys = _series(100_000)
    ys[12_345] = 50.0  # a spike must survive
    ys[77_777] = -50.0
    out_x, out_y = downsample.minmax(xs, ys, 200, use_numpy=use_numpy)
    assert len(out_x) <= 402
    assert max(out_y) == 50.0 and min(out_y) == -50.0
    assert out_x == sorted(out_x)  # points stay in x order
    assert out_x[0] == 0.0


def test_minmax_numpy_and_python_agree():
    if downsample.numpy_module() is None:
        pytest.skip("numpy not installed")
    xs, ys = _series(12_345, seed=3)
    assert downsample.minmax(xs, ys, 97, use_numpy=True) == downsample.minmax(xs, ys, 97, use_numpy=False)


def test_minmax_small_series_passes_through():
    assert downsample.minmax([1, 2, 3], [3, 2, 1], 10) == ([1.0, 2.0, 3.0], [3.0, 2.0, 1.0])
    assert downsample.minmax([], [], 10) == ([], [])


def test_minmax_flat_series_has_no_duplicates():
    xs = list(range(1000))
    out_x, out_y = downsample.minmax(xs, [1.0] * 1000, 10, use_numpy=False)
    assert len(set(out_x)) == len(out_x)
    assert set(out_y) == {1.0}


def test_lttb_keeps_ends_and_count():
    xs, ys = _series(5000)
    out_x, out_y = downsample.lttb(xs, ys, 100)
    assert len(out_x) == 100
    assert out_x[0] == 0 and out_x[-1] == 4999
    assert out_x == sorted(out_x)
    assert downsample.lttb([1, 2], [1, 2], 100) == ([1.0, 2.0], [1.0, 2.0])


def test_bucket_means():
    assert downsample.bucket_means([1, 2, 3, 4], 2) == [1.5, 3.5]
    assert downsample.bucket_means([1, 2], 5) == [1.0, 2.0]


def test_sparkline():
    line = sparkline([3, 2, 1, 0.5], 4)
    assert line[0] == BLOCKS[-1] and line[-1] == BLOCKS[0]
    assert len(sparkline(list(range(1000)), 12)) == 12
    assert sparkline([], 12) == ""
    assert sparkline([float("nan"), 1.0, 1.0], 3) == BLOCKS[3] * 2
