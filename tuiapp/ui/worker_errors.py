"""One place where a worker's failure becomes a message instead of the app's exit.

A thread worker that raises ends the app with WorkerFailed. Every worker that calls the run
service (launch, stop, resume, doctor) is wrapped with `reports_errors`: a UserError (RunError,
service.LaunchRefused...) is posted as ActionFailed with its message and fix; anything else as
ActionFailed too, marked unexpected. The screen resets its own state on that message; the app
shows it (LlmtuiApp.on_action_failed).
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

from textual.message_pump import MessagePump

from tuiapp.core.common.errors import UserError
from tuiapp.ui.messages import ActionFailed

F = TypeVar("F", bound=Callable)
TITLES = {"launch": "Not launched", "stop": "Could not stop", "resume": "Could not resume", "doctor": "Doctor",
          "delete": "Not deleted", "tag": "Tags not changed", "note": "Note not saved", "rename": "Not renamed",
          "archive": "Not archived", "queue": "Queue not changed"}


def title_of(action: str) -> str:
    return TITLES.get(action, action.capitalize())


def post_failure(node: MessagePump, message: ActionFailed) -> None:
    """To the node (its screen resets its state, then the app shows it); straight to the app
    when the node is gone (the user left the screen while the worker ran)."""
    if not node.post_message(message):
        node.app.post_message(message)


def reports_errors(action: str) -> Callable[[F], F]:
    """Decorate a worker's body (under @work): what it raises is posted as ActionFailed."""

    def decorate(body: F) -> F:
        @functools.wraps(body)
        def wrapper(node: MessagePump, *args, **kwargs):
            try:
                return body(node, *args, **kwargs)
            except UserError as exc:
                post_failure(node, ActionFailed(action, str(exc)))
            except Exception as exc:  # a bug: say it, keep the app (and the runs) alive
                post_failure(node, ActionFailed(action, f"{action} failed unexpectedly: {exc!r}", expected=False))
            return None

        return wrapper  # type: ignore[return-value]

    return decorate
