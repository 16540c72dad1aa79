"""Form rows generated from FieldSpecs: a label and one compact input per recipe field, the
field's description as the tooltip, its default prefilled."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import Input, Label, Select

from tuiapp.ui.formdata import FieldSpec, choice_text, to_text


def field_widget(spec: FieldSpec, text: str) -> Widget:
    tooltip = f"{spec.key}: {spec.description}\ndefault: {to_text(spec, spec.default) or '(empty)'}"
    if spec.kind in ("choice", "bool"):
        options = [(choice_text(c), choice_text(c)) for c in spec.choices]
        value = text if any(text == o[1] for o in options) else options[0][1]
        widget: Widget = Select(options, value=value, allow_blank=False, compact=True, id=spec.widget_id, classes="field-input")
    else:
        placeholder = {"toml": "TOML value", "int": "integer", "float": "number"}.get(spec.kind, "")
        widget = Input(value=text, placeholder=placeholder, compact=True, id=spec.widget_id, classes="field-input")
    widget.tooltip = tooltip
    return widget


class FieldRow(Horizontal):
    DEFAULT_CSS = """
    FieldRow { height: auto; }
    FieldRow > Label { width: 24; }
    FieldRow > .field-input { width: 1fr; }
    FieldRow > .field-pick { width: 18; }
    """

    def __init__(self, spec: FieldSpec, text: str, extra: Widget | None = None) -> None:
        super().__init__(classes="field-row")
        self.spec = spec
        self.text = text
        self.extra = extra

    def compose(self) -> ComposeResult:
        label = Label(self.spec.name, classes="field-label")
        label.tooltip = self.spec.description
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
    return ""


def set_value(widget: Widget, text: str) -> None:
    if isinstance(widget, Select):
        widget.value = text
    elif isinstance(widget, Input):
        widget.value = text
