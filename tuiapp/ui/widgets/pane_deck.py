"""Panes that share a screen: side by side in a grid on a wide terminal, one at a time behind
tabs on a narrow one (80x24 over SSH). The screen's breakpoint classes (-wide, -narrow) pick
the layout in app.tcss."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Container, Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Tab, Tabs


class Pane(Vertical):
    """One pane of a deck, framed with its title."""

    ALLOW_MAXIMIZE = True

    def __init__(self, title: str, *children: Widget, id: str) -> None:
        super().__init__(*children, id=id, classes="pane")
        self.border_title = title
        self.title = title


class PaneDeck(Vertical):
    class Activated(Message):
        """A pane became the active one (a key, a tab click)."""

        def __init__(self, pane_id: str) -> None:
            super().__init__()
            self.pane_id = pane_id

    DEFAULT_CSS = """
    PaneDeck { height: 1fr; }
    PaneDeck > #deck-body { height: 1fr; }
    """

    def __init__(self, *panes: Pane, id: str | None = None) -> None:
        super().__init__(id=id)
        self.panes = list(panes)
        self.active_id = panes[0].id if panes else ""

    def compose(self) -> ComposeResult:
        yield Tabs(*[Tab(f"{i + 1} {p.title}", id=f"tab-{p.id}") for i, p in enumerate(self.panes)], id="deck-tabs")
        with Container(id="deck-body"):
            yield from self.panes

    def on_mount(self) -> None:
        self.activate(self.active_id)

    def activate(self, pane_id: str) -> None:
        changed = pane_id != self.active_id
        self.active_id = pane_id
        if changed:
            self.post_message(self.Activated(pane_id))
        for pane in self.panes:
            pane.set_class(pane.id == pane_id, "-active")
        found = self.query("#deck-tabs")
        if not found:  # not composed yet, or being torn down
            return
        tabs = found.first(Tabs)
        if tabs.active != f"tab-{pane_id}":
            tabs.active = f"tab-{pane_id}"

    def activate_index(self, index: int) -> None:
        if 0 <= index < len(self.panes):
            self.activate(self.panes[index].id)

    def cycle(self, delta: int) -> None:
        ids = [p.id for p in self.panes]
        index = ids.index(self.active_id) if self.active_id in ids else 0
        self.activate(ids[(index + delta) % len(ids)])

    @property
    def active_pane(self) -> Pane | None:
        for pane in self.panes:
            if pane.id == self.active_id:
                return pane
        return None

    def on_tabs_tab_activated(self, event: Tabs.TabActivated) -> None:
        event.stop()
        if event.tab is not None and event.tab.id:
            pane_id = event.tab.id.removeprefix("tab-")
            if pane_id != self.active_id:
                self.activate(pane_id)


class PaneDeckActions:
    """Screen actions over the screen's PaneDeck: pick (1-6), cycle, zoom, back."""

    def action_pane(self, index: int) -> None:
        self.query_one(PaneDeck).activate_index(index)
        self.pane_shown()

    def action_next_pane(self) -> None:
        self.query_one(PaneDeck).cycle(1)
        self.pane_shown()

    def pane_shown(self) -> None:
        """After a pane key: a screen may hand the keys to what the pane shows."""

    def action_zoom(self) -> None:
        if self.maximized is not None:
            self.minimize()
            return
        pane = self.query_one(PaneDeck).active_pane
        if pane is not None:
            self.maximize(pane, container=False)

    def action_back(self) -> None:
        if self.maximized is not None:
            self.minimize()
            return
        self.app.pop_screen()
