"""Compare: a distill run among the compared ones adds the KL-to-teacher chart; without one there is none."""

from __future__ import annotations

import asyncio

from test_compare import open_compare
from ui_fixtures import synthetic_run, test_app


def test_a_distill_run_gets_a_kl_chart(tmp_path):
    root = tmp_path / "runs"
    synthetic_run(root, "student", method="distill", steps=5)
    synthetic_run(root, "plain", index=1, steps=5)

    async def scenario():
        app = test_app(root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            screen = await open_compare(pilot, root, ["student", "plain"])
            assert "KL" in screen.chart_metrics()["kl"][0] and screen.query("#cmp-chart-kl")
            screen.distilled = False  # the same runs' methods without a distill run among them
            assert "kl" not in screen.chart_metrics()

    asyncio.run(scenario())
