"""The command palette's provider, and the one list of actions behind the footer, the palette
and the help screen: each screen's BINDINGS (with the app's), so a new binding shows up in all
three at once."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.dom import DOMNode
from textual.screen import Screen


@dataclass
class Action:
    title: str
    key: str
    help: str
    node: DOMNode
    action: str
    enabled: bool


def _bindings(node: DOMNode) -> list[Binding]:
    return [b for b in Binding.make_bindings(type(node).BINDINGS) if b.description and not b.system]


def screen_actions(screen: Screen, include_hidden: bool = False) -> list[Action]:
    """Actions of a screen, then those of the app, as (title, key, help), in binding order."""
    app = screen.app
    out: list[Action] = []
    seen: set[str] = set()
    for node in (screen, app):
        for binding in _bindings(node):
            if binding.action in seen or (not binding.show and not include_hidden):
                continue
            seen.add(binding.action)
            name = binding.action.split("(", 1)[0]
            target = app if name.startswith("app.") else node
            state = target.check_action(name.removeprefix("app."), ())
            if state is False:
                continue
            key = app.get_key_display(binding)
            out.append(Action(binding.description, key, binding.tooltip or binding.description, target, binding.action.removeprefix("app."), bool(state)))
    return out


def _run(action: Action) -> None:
    action.node.call_later(action.node.run_action, action.action)


class ActionsProvider(Provider):
    """Every action of the current screen and the app, by name."""

    def _actions(self) -> list[Action]:
        return [a for a in screen_actions(self.screen, include_hidden=False) if a.enabled]

    async def discover(self) -> Hits:
        for action in self._actions():
            yield DiscoveryHit(f"{action.title} ({action.key})", partial(_run, action), help=action.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for action in self._actions():
            text = f"{action.title} ({action.key})"
            score = max(matcher.match(text), matcher.match(action.help) * 0.8)
            if score > 0:
                yield Hit(score, matcher.highlight(text), partial(_run, action), text=text, help=action.help)
