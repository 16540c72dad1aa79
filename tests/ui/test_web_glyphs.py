"""Under `llmtui serve-ui` (a browser's terminal) the app draws what a web font has: ASCII
sparklines instead of block elements (solid blocks there) and an ASCII header icon instead of
Textual's `⭘` (an empty box there). In a terminal nothing changes."""

from __future__ import annotations

import asyncio

from ui_fixtures import fixed_clock, screen_text, wait_for

from tuiapp.ui.app import LlmtuiApp
from tuiapp.ui.config import UiConfig
from tuiapp.ui.widgets.header import WEB_ICON
from tuiapp.ui.widgets.sparkline import BLOCKS, WEB_BLOCKS, sparkline


class BrowserApp(LlmtuiApp):
    """The app as textual-serve's web driver runs it (the driver says is_web)."""

    @property
    def is_web(self) -> bool:
        return True


def make(cls, root, base):
    return cls(UiConfig(runs_root=root, clock=fixed_clock, base_dir=base, system_monitor=False, hf_cache_dirs=[],
                        poll_s=0.1, history_poll_s=0.3, live=False))


def history_text(app_class, root, base) -> str:
    async def scenario():
        app = make(app_class, root, base)
        async with app.run_test(size=(120, 30)) as pilot:
            await wait_for(pilot, lambda: app.screen.summarized, what="summaries")
            return screen_text(app)

    return asyncio.run(scenario())


def test_serve_ui_draws_sparklines_and_the_icon_in_glyphs_a_browser_font_has(runs_root, tmp_path):
    web = history_text(BrowserApp, runs_root, tmp_path)
    assert web.splitlines()[0].startswith(f" {WEB_ICON} ") and "⭘" not in web
    assert not set(BLOCKS) & set(web)  # no block elements anywhere on the history
    curves = [line[58:71] for line in web.splitlines()[4:11]]  # the loss curve column of the seven runs
    assert all(curve.strip() and set(curve.strip()) <= set(WEB_BLOCKS) for curve in curves), curves
    terminal = history_text(LlmtuiApp, runs_root, tmp_path)
    assert "⭘" in terminal.splitlines()[0] and set(BLOCKS) & set(terminal)


def test_web_sparkline_keeps_the_levels():
    values = [8, 7, 6, 5, 4, 3, 2, 1]
    assert sparkline(values, 8) == BLOCKS[::-1]
    assert sparkline(values, 8, WEB_BLOCKS) == WEB_BLOCKS[::-1]
