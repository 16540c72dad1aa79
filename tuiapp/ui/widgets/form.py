"""Form rows generated from FieldSpecs: a label and one compact input per recipe field, its
default prefilled. List fields take one item per line (a TextArea); the focused field's
description shows in the help line under the form (`field_help`), not only as a tooltip."""

from __future__ import annotations

from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widget import Widget
from textual.widgets import Input, Label, Select, TextArea

from tuiapp.ui.formdata import FieldSpec, choice_text, to_text

PLACEHOLDERS = {"toml": "TOML value", "int": "integer", "float": "number", "lines": "one per line"}


def field_help(spec: FieldSpec) -> str:
    """The help line of a field: its key, description, default, and how to write a list."""
    default = to_text(spec, spec.default).replace("\n", ", ") or "(empty)"
    text = f"{spec.key} — {spec.description} · default: {default}"
    if spec.kind == "lines":
        text += " · one item per line" + (f" ({' | '.join(map(str, spec.choices))})" if spec.choices else "")
    return text


def being_removed(widget: Widget) -> bool:
    """Detached, or it or a node above it (its screen, the app) being pruned or closed: a widget's
    queue still runs what was left for after a frame while its screen is taken down."""
    return not widget.is_attached or any(getattr(node, "_pruning", False) or node._closing
                                         for node in widget.ancestors_with_self)


class FieldSelect(Select):
    """A form's Select that may be mounted while its screen is taken down: the form fills its later
    sections after its first frame, and a Select whose mount meets the app's shutdown, or ctrl+o
    replacing the form, misses its parts (Textual's own handlers then raised NoMatches, failing the app)."""

    def _on_mount(self, event: events.Mount) -> None:
        event.prevent_default()  # the handlers of the classes below are called here
        try:
            Select._on_mount(self, event)
        except NoMatches:
            if self.app.is_running and not self.being_removed:
                raise
            return  # its parts were never mounted: the app is closing or the screen going
        Widget._on_mount(self, event)

    def _watch_value(self, value) -> None:
        try:
            super()._watch_value(value)
        except NoMatches:
            if not self.being_removed:
                raise

    @property
    def being_removed(self) -> bool:
        return being_removed(self)


def field_widget(spec: FieldSpec, text: str) -> Widget:
    if spec.kind in ("choice", "bool"):
        options = [(choice_text(c), choice_text(c)) for c in spec.choices]
        value = text if any(text == o[1] for o in options) else options[0][1]
        widget: Widget = FieldSelect(options, value=value, allow_blank=False, compact=True, id=spec.widget_id, classes="field-input")
    elif spec.kind == "lines":
        widget = TextArea(text, compact=True, soft_wrap=True, tab_behavior="focus", show_line_numbers=False,
                          placeholder=PLACEHOLDERS["lines"], id=spec.widget_id, classes="field-input field-lines")
    else:
        widget = Input(value=text, placeholder=PLACEHOLDERS.get(spec.kind, ""), compact=True, id=spec.widget_id,
                       classes="field-input")
    widget.tooltip = field_help(spec)
    return widget


LABEL_WIDTH = 22


class FieldRow(Horizontal):
    DEFAULT_CSS = f"""
    FieldRow {{ height: auto; }}
    FieldRow > Label {{ width: {LABEL_WIDTH}; }}
    FieldRow > .field-input {{ width: 1fr; }}
    FieldRow > .field-pick {{ width: 14; }}
    """

    def __init__(self, spec: FieldSpec, text: str, extra: Widget | None = None) -> None:
        super().__init__(classes="field-row")
        self.spec = spec
        self.text = text
        self.extra = extra

    def compose(self) -> ComposeResult:
        label = Label(self.spec.name, classes="field-label")
        label.tooltip = self.spec.description
        if len(self.spec.name) > LABEL_WIDTH:  # the whole name (max_position_embeddings was cut), its input narrower
            label.styles.width = len(self.spec.name) + 1
        yield label
        yield field_widget(self.spec, self.text)
        if self.extra is not None:
            yield self.extra


class FormSection(Vertical):
    DEFAULT_CSS = """
    FormSection { height: auto; }
    """

    def __init__(self, title: str, *children: Widget, id: str | None = None) -> None:
        super().__init__(*children, id=id, classes="form-section")
        self.border_title = title


def read_value(widget: Widget) -> str:
    if isinstance(widget, Select):
        value = widget.value
        return "" if value is Select.NULL else str(value)
    if isinstance(widget, Input):
        return widget.value
    if isinstance(widget, TextArea):
        return widget.text
    return ""


def set_value(widget: Widget, text: str) -> None:
    if isinstance(widget, Select):
        widget.value = text
    elif isinstance(widget, Input):
        widget.value = text
    elif isinstance(widget, TextArea):
        widget.text = text
