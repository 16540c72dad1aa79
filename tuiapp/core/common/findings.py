"""A pre-flight finding (error, warning or info about a recipe key) and how findings print."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    level: Level
    key: str | None  # recipe key path it concerns, e.g. "launch.zero_stage"
    message: str
    fix: str | None = None


def has_errors(findings: list[Finding]) -> bool:
    return any(f.level == "error" for f in findings)


def format_findings(findings: list[Finding]) -> str:
    """One block per finding, errors first, then a count."""
    order = {"error": 0, "warning": 1, "info": 2}
    lines = []
    for f in sorted(findings, key=lambda f: order[f.level]):
        lines.append(f"{f.level:<8} {f.key + ': ' if f.key else ''}{f.message}")
        if f.fix:
            lines.append(f"{'':<8} fix: {f.fix}")
    counts = [f"{n} {level}{'s' if n != 1 else ''}"
              for level in ("error", "warning") if (n := sum(f.level == level for f in findings))]
    lines.append("preflight: " + (", ".join(counts) if counts else "ok"))
    return "\n".join(lines)
