"""Unicode block sparklines for table rows (a whole curve in a dozen cells).

In a browser (`llmtui serve-ui`) the block elements come out of the web font as solid blocks, so
the app draws its sparklines with WEB_BLOCKS there: plain ASCII, low to high."""

from __future__ import annotations

import math
from typing import Sequence

from tuiapp.ui.downsample import bucket_means

BLOCKS = "▁▂▃▄▅▆▇█"
WEB_BLOCKS = "_.,-~=*^"  # the same eight levels in glyphs every browser font has


def sparkline(values: Sequence[float], width: int = 12, blocks: str = BLOCKS) -> str:
    """`width` block characters; low values low. Empty when there is nothing to draw."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite or width <= 0:
        return ""
    points = bucket_means(finite, width)
    low, high = min(points), max(points)
    span = high - low
    if span <= 0:
        return blocks[len(blocks) // 2 - 1] * len(points)
    top = len(blocks) - 1
    return "".join(blocks[min(top, int((v - low) / span * top + 0.5))] for v in points)
