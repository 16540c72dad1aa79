"""The chat screen with a real run's model: opened from the history with C, the answer streams in
token by token from the real inference server, the conversation is kept, ctrl+b asks the base
beside, an arena of two runs answers each prompt side by side, leaving the screen ends the servers; and the UI process never imports torch while it
chats (checked in a fresh interpreter). The run comes from tests/after_runs.py."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from textual.widgets import Input
from ui_fixtures import screen_text, test_app, wait_for

from tests.after_runs import lora_run, sft_run, verdict_judge_run
from tuiapp.ui.screens.chat import ChatColumn, ChatScreen
from tuiapp.ui.screens.home import HomeScreen

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
START_S = 180.0  # torch + transformers import and the model load, on a busy 2-core box
QUESTION = "What is the capital of Japan?"


@pytest.fixture
def runs_root(tmp_path_factory, tmp_path) -> tuple[Path, str]:
    run = sft_run(tmp_path_factory)
    root = tmp_path / "runs"
    shutil.copytree(run, root / run.name)
    return root, run.name


def _answers(column: ChatColumn) -> list[str]:
    return [str(child.render()) for child in column.query(".chat-answer")]


def test_chat_streams_keeps_the_conversation_and_puts_the_base_beside(runs_root, tmp_path):
    root, run_id = runs_root
    app = test_app(root, tmp_path, live=False)
    procs = []
    asyncio.run(_chat_flow(app, run_id, procs))
    procs[0].wait(timeout=30)  # the server ended with the screen


async def _chat_flow(app, run_id: str, procs: list) -> None:
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen) and app.screen.loaded, what="history")
        await pilot.press("C")
        screen = app.screen
        assert isinstance(screen, ChatScreen) and screen.run_id == run_id
        await wait_for(pilot, lambda: screen.ready or screen.failed, timeout=START_S, what="the model server")
        assert screen.failed is None
        title = str(screen.query_one("#chat-title").render())
        assert "final (step 60)" in title
        name = json.loads((app.config.runs_root / run_id / "run.json").read_text(encoding="utf-8"))["name"]
        assert title.startswith(f"{name} · ") and run_id not in title  # the run's name, not its id
        assert screen.sub_title == f"chat · {name}"

        screen.query_one("#chat-input").value = QUESTION
        await pilot.press("enter")
        await wait_for(pilot, lambda: not screen.busy, timeout=60, what="the answer")
        tuned = screen.column("tuned")
        assert screen.tokens["tuned"] >= 2  # it came in pieces
        first = _answers(tuned)[-1]
        assert first and first != "…"
        assert QUESTION in screen_text(app)

        await pilot.press("ctrl+b")  # the base answers beside from now on
        screen.query_one("#chat-input").value = QUESTION
        await pilot.press("enter")
        await wait_for(pilot, lambda: not screen.busy, timeout=120, what="both answers")
        assert screen.tokens["base"] >= 1 and _answers(screen.column("base"))
        assert len(_answers(tuned)) == 2  # the conversation goes on
        assert [m["role"] for m in screen.session.history["tuned"]] == ["user", "assistant"] * 2
        assert [m["role"] for m in screen.session.history["base"]] == ["user", "assistant"]
        text = screen_text(app)
        assert "(loading the base model…)" not in text  # gone once the base is loaded
        assert "tokens/s" in text and "in 0.0s" not in text  # a real rate, not `8 tokens in 0.0s`

        await pilot.press("ctrl+g")  # the generation settings, changed live
        await wait_for(pilot, lambda: app.screen is not screen, what="the settings prompt")
        assert "max_new_tokens=" in app.screen.query_one(Input).value
        app.screen.query_one(Input).value = "temperature=0 max_new_tokens=2"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is screen, what="back in the chat")
        assert "up to 2 tokens (ctrl+g: changed)" in str(screen.query_one("#chat-title").render())
        screen.query_one("#chat-input").value = QUESTION
        await pilot.press("enter")
        await wait_for(pilot, lambda: not screen.busy, timeout=120, what="the short answers")
        assert 1 <= screen.answered["tuned"] <= 2 and 1 <= screen.answered["base"] <= 2

        await pilot.press("ctrl+l")
        await pilot.pause(0.1)
        assert not _answers(tuned) and screen.session.history["tuned"] == []

        procs.append(screen.session._proc)
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, HomeScreen), what="back home")


def test_an_arena_of_two_runs_answers_each_prompt_side_by_side(tmp_path_factory, tmp_path):
    """The full fine-tune and a LoRA run, each in its own real server, answer the same prompts with
    the same settings; ctrl+r sends the pair to a judge served by `llmtui serve` (a tiny judge trained
    to prefer answer A: the first run wins), whose verdict shows and is saved; single-turn mode sends
    each message alone."""
    import socket

    from tuiapp.core.store import served

    root = tmp_path / "runs"
    full, lora, judge = sft_run(tmp_path_factory), lora_run(tmp_path_factory), verdict_judge_run(tmp_path_factory)
    for run in (full, lora, judge):
        shutil.copytree(run, root / run.name)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = subprocess.run([sys.executable, "-m", "tuiapp.cli", "--runs-dir", str(root), "serve", judge.name,
                              "--port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    app = test_app(root, tmp_path, live=False)
    procs: list = []
    try:
        asyncio.run(_arena_flow(app, full.name, lora.name, procs, judge.name))
    finally:
        served.stop(root / judge.name, grace_s=5)
    for proc in procs:
        proc.wait(timeout=30)  # both servers ended with the screen


async def _arena_flow(app, first: str, second: str, procs: list, judge: str) -> None:
    async with app.run_test(size=(140, 36)) as pilot:
        app.open_chat(first, vs_run=second)
        await pilot.pause(0.1)
        screen = app.screen
        await wait_for(pilot, lambda: screen.ready or screen.failed, timeout=START_S, what="both servers")
        assert screen.failed is None
        title = str(screen.query_one("#chat-title").render())
        assert "final (step 60) · full sft vs " in title and "· peft lora" in title
        assert screen.column("other").border_title.endswith(" · final")

        screen.query_one("#chat-input").value = QUESTION
        await pilot.press("enter")
        await wait_for(pilot, lambda: not screen.busy, timeout=120, what="both answers")
        # each server answered (the 6-step LoRA may end at once: one token, an empty answer)
        assert screen.answered["tuned"] >= 1 and screen.answered["other"] >= 1, screen_text(app)
        assert _answers(screen.column("tuned")) and _answers(screen.column("other"))
        assert screen.session.alive and screen.other.alive and screen.session._proc.pid != screen.other._proc.pid
        assert screen_text(app).count("tokens/s") >= 2  # each side its own rate

        await pilot.press("ctrl+r")  # the pair to the judge: the first run's answer is A
        await wait_for(pilot, lambda: app.screen is not screen, what="the judge prompt")
        app.screen.query_one(Input).value = judge
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.judged is not None, timeout=120, what="the verdict")
        item = screen.judged["items"][0]
        assert (item["verdict"], item["outcome"], screen.judged["against"]) == ("A", "win", second)
        assert item["prompt"] == QUESTION and item["answer"] == screen.last_answers["tuned"]
        assert Path(screen.judged["path"]).parent == app.config.runs_root / first / "judge"
        for model in ("tuned", "other"):  # the verdict in both columns
            notes = [str(n.render()) for n in screen.column(model).query(".chat-note")]
            assert notes[-1].startswith(f"judge ({judge}") and notes[-1].endswith("(A) is better"), notes

        await pilot.press("ctrl+g")  # one change of settings, both runs answer with it
        await wait_for(pilot, lambda: app.screen is not screen, what="the settings prompt")
        app.screen.query_one(Input).value = "temperature=0 max_new_tokens=3"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is screen, what="back in the chat")
        assert screen.other.overrides["max_new_tokens"] == 3

        await pilot.press("ctrl+t")  # single turn: the conversation so far is not sent
        screen.query_one("#chat-input").value = "And of France?"
        await pilot.press("enter")
        await wait_for(pilot, lambda: not screen.busy, timeout=120, what="the single-turn answers")
        assert 1 <= screen.answered["tuned"] <= 3 and 1 <= screen.answered["other"] <= 3
        assert len(screen.session.history["tuned"]) == 2 and len(screen.other.history["tuned"]) == 2
        assert "single turn (ctrl+t)" in str(screen.query_one("#chat-title").render())

        procs += [screen.session._proc, screen.other._proc]
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatScreen), what="the chat closed")


def test_chat_of_a_run_without_a_final_model_says_so(runs_root, tmp_path):
    root, run_id = runs_root
    shutil.rmtree(root / run_id / "final")
    asyncio.run(_refusal(test_app(root, tmp_path, live=False), run_id))


async def _refusal(app, run_id: str) -> None:
    async with app.run_test(size=(100, 30)) as pilot:
        app.open_chat(run_id)
        await pilot.pause(0.1)
        screen = app.screen
        await wait_for(pilot, lambda: screen.failed, timeout=20, what="the refusal")
        assert "has no final model" in screen.failed and "--checkpoint 60" in screen.failed
        assert screen.session is None or not screen.session.alive
        # the error and its fix stay in the chat's body (a toast went after 15 s, over the input)
        await wait_for(pilot, lambda: "--checkpoint 60" in screen_text(app), what="the fix on screen")
        assert not list(app._notifications)


SCRIPT = textwrap.dedent("""
    import asyncio, json, sys, time
    sys.path.insert(0, sys.argv[3])
    from pathlib import Path
    from ui_fixtures import test_app, wait_for

    async def main():
        app = test_app(Path(sys.argv[1]), Path(sys.argv[1]), live=False)
        async with app.run_test(size=(100, 30)) as pilot:
            app.open_chat(sys.argv[2])
            await pilot.pause(0.1)
            screen = app.screen
            await wait_for(pilot, lambda: screen.ready or screen.failed, timeout=180, what="ready")
            screen.query_one("#chat-input").value = "What is the capital of Japan?"
            await pilot.press("enter")
            await wait_for(pilot, lambda: not screen.busy, timeout=60, what="answer")
            answered = screen.tokens["tuned"]
        heavy = sorted(m for m in ("torch", "transformers", "deepspeed", "peft") if m in sys.modules)
        print(json.dumps({"tokens": answered, "failed": screen.failed, "imported": heavy}))

    asyncio.run(main())
""")


def test_the_ui_process_never_imports_torch_while_chatting(runs_root):
    root, run_id = runs_root
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(root), run_id, str(Path(__file__).parent)], cwd=ROOT,
                          capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["failed"] is None and outcome["tokens"] >= 1
    assert outcome["imported"] == []
