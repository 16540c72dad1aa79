"""Panes that share a screen: side by side in a grid on a wide terminal, one at a time behind
tabs on a narrow one (80x24 over SSH). The screen's breakpoint classes (-wide, -narrow) pick
the layout in app.tcss."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Tab, Tabs

TAB_PADDING = 2  # Textual's Tab: one column each side of its label


def pane_key(index: int) -> str:
    """The digit that shows a deck's pane (1-9); a tenth has none (`p` reaches it)."""
    return str(index + 1) if index < 9 else ""


def pane_bindings(count: int) -> list[Binding]:
    """The digit keys of a deck of `count` panes."""
    return [Binding(pane_key(i), f"pane({i})", f"Pane {pane_key(i)}", show=False) for i in range(min(count, 9))]


def tab_labels(titles: list[str], active: int, width: int) -> list[str]:
    """Each tab's label in `width` columns: 'N Title' where all fit; else the active tab and the first
    ones keep their titles while they fit and the rest show only their key ('…' for one without)."""
    full = [f"{pane_key(i)} {title}".strip() for i, title in enumerate(titles)]
    shown = [label if i == active else (pane_key(i) or "…") for i, label in enumerate(full)]
    room = width - sum(len(label) + TAB_PADDING for label in shown)
    for index, label in enumerate(full):  # titles back in order while they fit
        grows = len(label) - len(shown[index])
        if grows > room:
            break
        shown[index], room = label, room - grows
    return shown


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
        yield Tabs(*[Tab(f"{pane_key(i)} {p.title}".strip(), id=f"tab-{p.id}") for i, p in enumerate(self.panes)],
                   id="deck-tabs")
        with Container(id="deck-body"):
            yield from self.panes

    def on_mount(self) -> None:
        self.activate(self.active_id)

    def on_resize(self) -> None:
        self.fit_tabs()

    def fit_tabs(self) -> None:
        """Every tab stays on screen (tab_labels): a tab scrolled out of sight gave no sign of itself."""
        found = self.query("#deck-tabs")
        if not found or not self.size.width:
            return
        ids = [p.id for p in self.panes]
        active = ids.index(self.active_id) if self.active_id in ids else 0
        shown = tab_labels([p.title for p in self.panes], active, self.size.width)
        tabs = found.first(Tabs)
        for label, pane in zip(shown, self.panes, strict=True):
            tab = tabs.query_one(f"#tab-{pane.id}", Tab)
            if str(tab.label) != label:
                tab.label = label

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
        self.fit_tabs()

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
