"""Unicode block sparklines for table rows (a whole curve in a dozen cells)."""

from __future__ import annotations

import math
from typing import Sequence

from tuiapp.ui.downsample import bucket_means

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 12) -> str:
    """`width` block characters; low values low. Empty when there is nothing to draw."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite or width <= 0:
        return ""
    points = bucket_means(finite, width)
    low, high = min(points), max(points)
    span = high - low
    if span <= 0:
        return BLOCKS[len(BLOCKS) // 2 - 1] * len(points)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[min(top, int((v - low) / span * top + 0.5))] for v in points)
