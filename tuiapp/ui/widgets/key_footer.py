"""Textual's footer, rebuilt at most once per frame and only when the keys it shows change.

Textual's Footer rebuilds every key widget on each bindings signal: each focus move, resize and
screen resume sends one, and each queues its own rebuild (five before a form's first frame,
a fifth of the CPU it took to open)."""

from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer


class KeyFooter(Footer):
    def __init__(self, *children, **kwargs) -> None:
        super().__init__(*children, **kwargs)
        self._rebuild_pending = False
        self._shown: tuple | None = None  # the keys of the last rebuild

    def bindings_changed(self, screen: Screen) -> None:
        self._bindings_ready = True
        if not screen.app.app_focus:
            return
        if self.is_attached and screen is self.screen and not self._rebuild_pending:
            self._rebuild_pending = True
            self.call_after_refresh(self._rebuild_if_changed)

    async def _rebuild_if_changed(self) -> None:
        self._rebuild_pending = False
        if not self.is_attached or self._pruning:
            return
        shown = self.shown_keys()
        if shown == self._shown:
            return
        self._shown = shown
        await self.recompose()

    def shown_keys(self) -> tuple:
        """What the footer would draw: each shown binding's key, label, group, tooltip and state."""
        bindings = self.screen.active_bindings
        return tuple(
            (key, binding.action, binding.key_display, binding.description, binding.show, id(binding.group),
             enabled, tooltip)
            for key, (_, binding, enabled, tooltip) in bindings.items()
            if binding.show or key == self.app.COMMAND_PALETTE_BINDING
        ) + (self.show_command_palette, self.app.ENABLE_COMMAND_PALETTE)
