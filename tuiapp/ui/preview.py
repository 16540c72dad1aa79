"""Text of the dataset preview pane (pure)."""

from __future__ import annotations

import json

MAX_FIELD = 300


def _short(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_FIELD else text[: MAX_FIELD - 1] + "…"


def dataset_preview(name: str, info, error: str | None) -> str:
    if error:
        return f"{name}\n\n{error}"
    if info is None:
        return name
    count = getattr(info, "count", getattr(info, "num_records", None))
    lines = [
        f"source   {info.source}",
        f"format   {info.format}" + (" (detected)" if not getattr(info, "is_hub", False) else ""),
        f"records  {count if count is not None else 'loaded by the trainer'}",
    ]
    if getattr(info, "columns", None):
        lines.append(f"columns  {', '.join(info.columns)}")
    if getattr(info, "skipped", 0):
        lines.append(f"skipped  {info.skipped} empty records")
    if getattr(info, "is_hub", False):
        lines.append("\nhub datasets are downloaded and previewed by the trainer (`llmtui data RECIPE`)")
    for index, example in enumerate(info.examples or [], start=1):
        lines.append(f"\n— example {index}")
        if isinstance(example, dict):
            for key, value in example.items():
                if key == "messages" and isinstance(value, list):
                    for turn in value:
                        if isinstance(turn, dict):
                            lines.append(f"  {turn.get('role', '?')}: {_short(turn.get('content', ''))}")
                else:
                    lines.append(f"  {key}: {_short(value)}")
        else:
            lines.append(f"  {_short(example)}")
    return "\n".join(lines)
