"""Secret names (tokens, keys, passwords) and hiding their values in recorded commands."""

from __future__ import annotations

import re

SECRET_PATTERN = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_PATTERN.search(name))


def redact(values: list[str]) -> list[str]:
    """Hide secret values in argv-like lists (KEY=value or --token value)."""
    out, hide_next = [], False
    for value in values:
        if hide_next:
            out.append("***")
            hide_next = False
            continue
        name, sep, _ = value.partition("=")
        if sep and is_secret_name(name):
            out.append(f"{name}=***")
        elif value.startswith("--") and is_secret_name(value) and not sep:
            out.append(value)
            hide_next = True
        else:
            out.append(value)
    return out
