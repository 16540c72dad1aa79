"""The new-experiment form as data, generated from the recipe's pydantic schema.

Each field becomes a FieldSpec (dotted key, kind of input, choices, default, description). The
form's text values are turned back into a recipe dict, written as TOML, and parsed with
`parse_recipe`: the same path `llmtui validate` takes, so the form shows the same messages.
"""

from __future__ import annotations

import json
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import tomli_w
import tomllib
from pydantic import BaseModel

from tuiapp.core.common.errors import RecipeError, RecipeErrors
from tuiapp.core.config.recipe import METHOD_MODELS, Recipe, parse_recipe

SECTIONS = ("model", "dataset", "method", "train", "launch")  # the form's own sections, in order
OMIT = object()  # an empty optional table (e.g. method.adapter): left out of the recipe


def _is_table(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def sections() -> tuple[str, ...]:
    """Every table of the recipe: the form's own, then any other the schema has (each gets its
    own part of the form, so a new section never turns into one bad text field)."""
    extra = [name for name, info in Recipe.model_fields.items() if name not in SECTIONS and _is_table(info.annotation)]
    return SECTIONS + tuple(extra)
BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass
class FieldSpec:
    key: str  # dotted path, e.g. "train.learning_rate"
    name: str
    kind: str  # "choice" | "bool" | "int" | "float" | "text" | "lines" (a list, one item per line) | "toml"
    default: Any
    description: str = ""
    choices: list[Any] = field(default_factory=list)

    @property
    def section(self) -> str:
        return self.key.split(".", 1)[0] if "." in self.key else ""

    @property
    def widget_id(self) -> str:
        return "f-" + self.key.replace(".", "--").replace("_", "-")


def _scalar_list(annotation: Any) -> list[Any] | None:
    """The choices of a list of strings (empty: any string), or None when it is not one."""
    if typing.get_origin(annotation) is not list:
        return None
    (item,) = typing.get_args(annotation) or (None,)
    if item is str:
        return []
    if typing.get_origin(item) is Literal:
        return list(typing.get_args(item))
    return None


def _kind(annotation: Any) -> tuple[str, list[Any]]:
    """The input kind of an annotation, and its choices. A list of strings (or a list, or one
    word such as 'all-linear') is "lines": one item per line; its choices are the item choices,
    or the one words it may be instead."""
    origin = typing.get_origin(annotation)
    items = _scalar_list(annotation)
    if items is not None:
        return "lines", items
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        lists = [_scalar_list(a) for a in args]
        words = [v for a in args if typing.get_origin(a) is Literal for v in typing.get_args(a)]
        if any(choices == [] for choices in lists) and all(
                lists[i] is not None or typing.get_origin(a) is Literal for i, a in enumerate(args)):
            return "lines", words
    if _is_table(annotation) and getattr(annotation, "BY_KIND", False):  # train.optimizer: its kind's words
        return "choice", list(typing.get_args(annotation.model_fields["kind"].annotation))
    if origin is Literal:
        return "choice", list(typing.get_args(annotation))
    if annotation is bool:
        return "bool", [True, False]
    if annotation is int:
        return "int", []
    if annotation is float:
        return "float", []
    if annotation is str:
        return "text", []
    if origin in (typing.Union, types.UnionType):
        return "toml", []
    return "toml", []  # lists, dicts


def _default(info) -> Any:
    if info.default_factory is not None:
        return info.default_factory()
    return info.default


def model_fields(model: type[BaseModel], prefix: str, skip: tuple[str, ...] = ()) -> list[FieldSpec]:
    specs = []
    for name, info in model.model_fields.items():
        if name in skip:
            continue
        kind, choices = _kind(info.annotation)
        key = f"{prefix}.{name}" if prefix else name
        specs.append(FieldSpec(key, name, kind, _default(info), info.description or "", choices))
    return specs


def top_fields() -> list[FieldSpec]:
    return model_fields(Recipe, "", skip=sections())


def section_fields(section: str, method_kind: str = "lora") -> list[FieldSpec]:
    """The fields of one section; for 'method', those of the given kind (kind itself excluded)."""
    if section == "method":
        return model_fields(METHOD_MODELS[method_kind], "method", skip=("kind",))
    annotation = Recipe.model_fields[section].annotation
    return model_fields(annotation, section)


def all_fields(method_kind: str) -> list[FieldSpec]:
    specs = top_fields()
    for section in sections():
        specs += section_fields(section, method_kind)
    return specs


# ------------------------------------------------------------------ text <-> values


def toml_value(value: Any) -> str:
    """A value as inline TOML (what a user would type)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            key = k if BARE_KEY.match(str(k)) else json.dumps(str(k))
            items.append(f"{key} = {toml_value(v)}")
        return "{" + ", ".join(items) + "}"
    return str(value)


def to_text(spec: FieldSpec, value: Any) -> str:
    if spec.kind in ("choice", "bool"):
        return choice_text(value)
    if spec.kind == "lines":
        if isinstance(value, (list, tuple)):
            return "\n".join(str(v) for v in value)
        return "" if value is None else str(value)
    if spec.kind == "toml":
        if value is None:
            return ""
        return value if isinstance(value, str) else toml_value(value)
    if spec.kind == "float" and isinstance(value, float):
        return format(value, "g") if 0 < abs(value) < 1e-3 else repr(value)
    return "" if value is None else str(value)


def choice_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def from_text(spec: FieldSpec, text: str) -> Any:
    """The value a text stands for; text that does not parse is passed on as a string, so
    validation reports it exactly as it would from a TOML file."""
    if spec.kind in ("choice", "bool"):
        for choice in spec.choices:
            if choice_text(choice) == text:
                return choice
        return text
    stripped = text.strip()
    if spec.kind == "int":
        try:
            return int(stripped.replace("_", ""))
        except ValueError:
            return text
    if spec.kind == "float":
        try:
            return float(stripped)
        except ValueError:
            return text
    if spec.kind == "text":
        return text
    if spec.kind == "lines":
        return _lines(spec, stripped)
    if not stripped:
        if isinstance(spec.default, (dict, list)):
            return type(spec.default)()
        return OMIT if spec.default is None else ""
    try:
        return tomllib.loads(f"v = {stripped}")["v"]
    except tomllib.TOMLDecodeError:
        return stripped


def _lines(spec: FieldSpec, text: str) -> Any:
    """One item per line; a TOML array ([...]) is read as one; a single line that is one of the
    words the field may be instead of a list ('all-linear') is that word."""
    if text.startswith("["):
        try:
            return tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            pass
    items = [line.strip() for line in text.splitlines() if line.strip()]
    if len(items) == 1 and isinstance(spec.default, str) and items[0] in spec.choices:
        return items[0]
    if not items and isinstance(spec.default, str):
        return OMIT  # the schema's default word
    return items


def values_from_recipe(recipe: Recipe) -> dict[str, str]:
    """Form texts of a recipe (to clone one)."""
    data = recipe.model_dump(mode="python")
    out = {}
    for spec in all_fields(recipe.method.kind):
        node: Any = data
        for part in spec.key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        out[spec.key] = to_text(spec, node)
    return out


def default_values(method_kind: str = "lora") -> dict[str, str]:
    return {spec.key: to_text(spec, spec.default) for spec in all_fields(method_kind)}


def build_data(values: dict[str, str], method_kind: str) -> dict:
    """The recipe dict of the form's texts (only the current method kind's fields)."""
    tables = sections()
    data: dict[str, Any] = {section: {} for section in tables}
    data["method"]["kind"] = method_kind
    for spec in all_fields(method_kind):
        if spec.key not in values:
            continue
        value = from_text(spec, values[spec.key])
        if value is OMIT:
            continue
        if spec.section:
            data[spec.section][spec.name] = value
        else:
            data[spec.name] = value
    top = {k: data.pop(k) for k in list(data) if k not in tables}
    return {**top, **data}


@dataclass
class FormCheck:
    """The outcome of checking the form: the TOML, the recipe (when valid) and the errors."""

    toml: str
    recipe: Recipe | None
    errors: list[RecipeError]

    @property
    def error_keys(self) -> set[str]:
        return {e.key for e in self.errors if e.key}


def form_error(error) -> str:
    """A recipe error as the form shows it: the key, the message and the fix, no file or line
    (the recipe is not saved yet: its TOML pane is what would be written)."""
    return (f"{error.key}: " if error.key else "") + error.message + (f"\n  fix: {error.fix}" if error.fix else "")


def check_values(values: dict[str, str], method_kind: str, file: str = "<form>") -> FormCheck:
    data = build_data(values, method_kind)
    try:
        text = tomli_w.dumps(data)
    except (TypeError, ValueError) as exc:  # pragma: no cover - the form only makes plain values
        return FormCheck("", None, [RecipeError(message=str(exc), file=file)])
    try:
        recipe = parse_recipe(text, file)
    except RecipeErrors as exc:
        return FormCheck(text, None, list(exc.errors))
    except RecipeError as exc:
        return FormCheck(text, None, [exc])
    try:
        text = recipe.to_toml()
    except (TypeError, ValueError):  # a value TOML cannot hold (None of an unset table): show the form's own
        pass
    return FormCheck(text, recipe, [])
