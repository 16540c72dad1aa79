"""The chat's arena and single-turn mode without a model (the real servers answer in
test_chat.py): two runs marked in the history open one chat of both, titled by their names, and a
run without a final model is refused with the fix. Pilot, on the real-run fixtures."""

from __future__ import annotations

import asyncio

from ui_fixtures import REAL_IDS, screen_text, test_app, wait_for

from tuiapp.core.after.chat import ChatSession
from tuiapp.ui.screens.chat import ChatScreen
from tuiapp.ui.screens.home import HomeScreen
from tuiapp.ui.widgets.runs_table import RunsTable


def test_two_marked_runs_open_an_arena_titled_by_their_names(runs_root, tmp_path):
    first, second = REAL_IDS["sft"], REAL_IDS["baseline"]

    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, 20, what="history")
            home = app.screen
            table = home.query_one(RunsTable)
            for run_id in (first, second):
                table.move_to_id(run_id)
                await pilot.press("space")
            await pilot.press("C")
            screen = app.screen
            assert isinstance(screen, ChatScreen)
            assert (screen.run_id, screen.vs_run) == (first, second)
            assert screen.models == ["tuned", "other"]
            assert screen.sub_title == "chat · sft vs baseline"  # the runs' names, not their ids
            assert screen.column("tuned").border_title == "sft"
            assert screen.column("other").border_title == "baseline" and screen.column("other").display
            # the fixture runs kept no final model: the refusal says what to chat with instead
            await wait_for(pilot, lambda: screen.failed, 20, what="the refusal")
            assert "has no final model" in screen.failed
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is home, what="back home")
            table.move_to_id(first)  # one run under the cursor, marks cleared: a plain chat
            await pilot.press("u", "C")
            assert isinstance(app.screen, ChatScreen) and app.screen.vs_run is None
            assert app.screen.models == ["tuned"] and not app.screen.column("other").display

    asyncio.run(scenario())


def test_single_turn_is_toggled_and_said_in_every_column(runs_root, tmp_path):
    async def scenario():
        app = test_app(runs_root, tmp_path, live=False)
        async with app.run_test(size=(100, 30)) as pilot:
            app.open_chat(REAL_IDS["sft"], vs_run=REAL_IDS["baseline"])
            await pilot.pause(0.1)
            screen = app.screen
            await pilot.press("ctrl+t")
            assert screen.single_turn
            assert screen_text(app).count("(single turn: each message is answered alone)") == 2
            await pilot.press("ctrl+t")
            assert not screen.single_turn and "(the conversation is kept again)" in screen_text(app)

    asyncio.run(scenario())


def test_a_single_turn_session_sends_and_keeps_no_history(tmp_path):
    """What the server is sent: the conversation so far, or in single-turn mode the message alone."""
    sent: list[list[dict]] = []

    class Recording(ChatSession):
        def __init__(self):  # no run, no process: only the history logic
            self.history = {"tuned": [], "base": []}
            self.single_turn = False

        def stream(self, messages, model="tuned", settings=None):
            sent.append(messages)
            yield {"event": "done", "text": f"answer {len(sent)}"}

    session = Recording()
    session.ask("one")
    session.ask("two")
    assert [m["content"] for m in sent[-1]] == ["one", "answer 1", "two"]
    session.single_turn = True
    session.ask("three")
    assert [m["content"] for m in sent[-1]] == ["three"]  # alone
    assert len(session.history["tuned"]) == 4  # and not added to the conversation
