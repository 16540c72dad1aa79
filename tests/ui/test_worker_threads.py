"""Thread workers never wait for a free thread: the run view's watchers stay alive while it is
open, and an action (resume, stop, doctor) started beside them must run at once.

Textual runs thread workers in the event loop's default executor (cpu_count + 4 threads). On a
2-core machine the history and an open run view with its system monitor filled all six, and `r`
on a stopped run did nothing, silently, for as long as the view stayed open."""

from __future__ import annotations

import asyncio
import threading

from ui_fixtures import test_app, wait_for

LONG_LIVED = 40  # more watchers than cpu_count + 4 threads on any machine this runs on


def test_an_action_runs_beside_many_long_lived_watchers(tmp_path):
    (tmp_path / "runs").mkdir()
    release = threading.Event()
    done = threading.Event()

    async def scenario():
        app = test_app(tmp_path / "runs", tmp_path, system_monitor=True)
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(LONG_LIVED):
                app.run_worker(lambda: release.wait(60), thread=True, group="watchers")
            app.run_worker(done.set, thread=True, group="control")
            try:
                await wait_for(pilot, done.is_set, timeout=5, what="the action's worker to run")
            finally:
                release.set()

    asyncio.run(scenario())
