"""Hosts of a multi-node run: MPI-style `host slots=N` entries and hostfiles, parsed with errors
that name the entry or the line and the fix."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tuiapp.core.common.errors import RecipeError

HOST_LINE = re.compile(r"^(?P<host>[^\s=#]+)\s+slots\s*=\s*(?P<slots>\d+)\s*(?:#.*)?$")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int
    line: int | None = None  # line in the hostfile, or index + 1 in an inline list


def host_fix() -> str:
    return "write one host per line as 'HOSTNAME slots=N', e.g. 'node1 slots=8'"


def parse_host_entries(entries: list[str]) -> list[Host]:
    """Inline `launch.hosts` entries; raises ValueError naming the entry (pydantic shows it)."""
    hosts: list[Host] = []
    seen: set[str] = set()
    for index, raw in enumerate(entries, start=1):
        match = HOST_LINE.match(str(raw).strip())
        if not match:
            raise ValueError(f"hosts entry {index} '{raw}' is not 'HOST slots=N'; {host_fix()}")
        host, slots = match.group("host"), int(match.group("slots"))
        if slots < 1:
            raise ValueError(f"hosts entry {index} '{raw}' has slots={slots}; slots must be at least 1")
        if host in seen:
            raise ValueError(f"hosts entry {index}: host '{host}' is listed twice; list each host once")
        seen.add(host)
        hosts.append(Host(host, slots, index))
    return hosts


def parse_hostfile_text(text: str, file: str = "<hostfile>") -> list[Host]:
    """An MPI-style hostfile (`host slots=N`, # comments); errors name the file and line."""
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = HOST_LINE.match(line)
        if not match:
            fix = host_fix()
            if re.match(r"^\S+$", line):
                fix = f"add the slot count: '{line} slots=N' (N = GPUs on that host)"
            raise RecipeError(message=f"bad hostfile line '{line}'", file=file, line=number,
                              key="launch.hosts", fix=fix)
        host, slots = match.group("host"), int(match.group("slots"))
        if slots < 1:
            raise RecipeError(message=f"host '{host}' has slots={slots}", file=file, line=number,
                              key="launch.hosts", fix="slots must be at least 1 (the number of GPUs)")
        if host in seen:
            raise RecipeError(message=f"host '{host}' is listed twice (first on line {seen[host]})",
                              file=file, line=number, key="launch.hosts", fix="list each host once")
        seen[host] = number
        hosts.append(Host(host, slots, number))
    if not hosts:
        raise RecipeError(message="the hostfile lists no hosts", file=file, key="launch.hosts",
                          fix=host_fix())
    return hosts


def read_hostfile(path: str | Path) -> list[Host]:
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(message="hostfile not found", file=str(path), key="launch.hosts",
                          fix="check the path (relative paths start at the folder you run llmtui in), "
                          "or list hosts inline: hosts = ['node1 slots=8', 'node2 slots=8']") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(message=f"cannot read the hostfile: {exc}", file=str(path), key="launch.hosts",
                          fix="make it a readable UTF-8 text file") from None
    return parse_hostfile_text(text, str(path))
