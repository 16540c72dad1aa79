"""The form's dry step (ctrl+g): the same real step on a shrunken copy of the model that launch takes
first, on demand, its verdict on the verdict line and in the checks, cached after (Pilot, real child)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from textual.widgets import Static
from ui_fixtures import test_app, wait_for

from tests.plugins.broken_backward import MESSAGE
from tuiapp.core.config.recipe import Recipe
from tuiapp.core.prelaunch import dry_step
from tuiapp.ui.screens.new_experiment import NewExperimentScreen

ROOT = Path(__file__).resolve().parents[2]


def text_of(screen, selector: str) -> str:
    content = screen.query_one(selector, Static).render()
    return getattr(content, "plain", str(content))


def _recipe() -> Recipe:
    seed = (os.getpid() * 1000 + int(time.time())) % 2**31  # a verdict no earlier test has cached
    return Recipe.model_validate({
        "name": "dry-form", "model": {"name": "tiny"}, "method": {"kind": "lora"},
        "dataset": {"name": "demo:facts", "max_samples": 16},
        "train": {"max_steps": 2, "micro_batch": 2, "max_seq_len": 64, "seed": seed}})


@pytest.mark.slow  # two dry steps, each a child process that imports torch and transformers
def test_ctrl_g_runs_the_dry_step_shows_its_verdict_and_the_cache_answers_after(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMTUI_DRY_STEP", "0")  # off first: ctrl+g says so and starts nothing
    monkeypatch.setenv(dry_step.PLUGINS_ENV, "tests.plugins.broken_backward")  # lora raises in its first backward
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the child runs in the form's folder: where the plugin is

    recipe = _recipe()

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: app.screen.loaded, what="home")
            screen = NewExperimentScreen(recipe, title="dry-form")
            await app.push_screen(screen)
            await wait_for(pilot, lambda: screen.last_check is not None and screen.filled, timeout=90,
                           what="the first check")
            assert "dry step" not in text_of(screen, "#ne-verdict")
            children = dry_step.CHILD_RUNS["count"]
            await pilot.press("ctrl+g")
            await wait_for(pilot, lambda: any("LLMTUI_DRY_STEP=0" in str(n.message) for n in app._notifications),
                           what="the note that the dry step is off")
            assert not screen.dry_running and dry_step.CHILD_RUNS["count"] == children

            monkeypatch.setenv("LLMTUI_DRY_STEP", "1")
            screen.schedule_check(now=True)
            await wait_for(pilot, lambda: "ctrl+g dry step" in text_of(screen, "#ne-verdict"), what="the hint")
            assert "✓ valid" in text_of(screen, "#ne-verdict")
            await pilot.press("ctrl+g")
            await wait_for(pilot, lambda: "dry step running" in text_of(screen, "#ne-verdict"), what="running")
            await wait_for(pilot, lambda: not screen.dry_running and "✗" in text_of(screen, "#ne-verdict"),
                           timeout=300, what="the failed verdict")
            assert dry_step.CHILD_RUNS["count"] == children + 1
            assert "failed its dry step" in text_of(screen, "#ne-verdict")
            checks = text_of(screen, "#ne-checks")
            assert MESSAGE in checks and "lora on" in checks  # the trainer's own message, the method

            # the same recipe again: the cache answers as the form is checked, no child process
            again = NewExperimentScreen(recipe, title="dry-form")
            await app.switch_screen(again)
            await wait_for(pilot, lambda: again.last_check is not None and again.filled, timeout=90, what="recheck")
            assert "failed its dry step" in text_of(again, "#ne-verdict")
            assert dry_step.CHILD_RUNS["count"] == children + 1

            # without the broken plugin the pair is another verdict: not run yet, then passed
            monkeypatch.delenv(dry_step.PLUGINS_ENV)
            again.schedule_check(now=True)
            await wait_for(pilot, lambda: "ctrl+g dry step" in text_of(again, "#ne-verdict"), what="the hint")
            await pilot.press("ctrl+g")
            await wait_for(pilot, lambda: "dry step passed" in text_of(again, "#ne-verdict"), timeout=300,
                           what="the passed verdict")
            assert dry_step.CHILD_RUNS["count"] == children + 2
            assert "failed its dry step" not in text_of(again, "#ne-checks")

    asyncio.run(scenario())
