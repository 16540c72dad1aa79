"""A run's provenance.json, read: what made the run (llmtui's version and git revision, Python, the
OS, the machine, every package that matters, the seed, the data's fingerprint, the recipe after
every --set). Written at launch by tuiapp.core.store.environment; read here for `llmtui show`,
compare's config diff and `llmtui reproduce`.

    {"format": 1, "time": 1763769600.0,
     "llmtui": {"version": "0.1.0", "revision": "33cd7f2...", "dirty": false},
     "python": "3.11.9 (CPython)", "os": "Linux-6.8.0-x86_64-with-glibc2.39",
     "machine": {"cpu": "AMD EPYC 9654", "cores": 2, "memory_bytes": ..., "driver": "550.54.15",
                 "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_bytes": ...}]},
     "packages": {"torch": "2.13.0+cpu", "transformers": "5.23.0", ...}, "torch_cuda": "cpu",
     "seed": 42, "data": [{"source": "demo:facts", "demo_version": "1"},
                          {"source": "data/train.jsonl", "files": [{"path": ..., "bytes": ..., "sha256": ...}]}],
     "overrides": ["train.max_steps=60"], "recipe": {...}}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuiapp.core.run_folder.rundir import RunDir

# what describes the environment (compared between runs and by `llmtui reproduce`); the recipe and
# the time are not: compare shows the recipe's keys already, and two runs are never made at once
ENVIRONMENT = ("llmtui", "python", "os", "machine", "packages", "torch_cuda", "data")


def path_of(run_dir: Path) -> Path:
    return RunDir(run_dir).provenance


def read(run_dir: Path) -> dict | None:
    """The run's provenance, or None (a run made before it was recorded, or a damaged file)."""
    try:
        data = json.loads(path_of(run_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def environment(record: dict | None) -> dict:
    """The parts of a record that describe where and with what the run was made (compare's rows)."""
    record = record or {}
    return {key: record[key] for key in ENVIRONMENT if key in record}


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(data, list) and data and all(isinstance(item, dict) for item in data):
        for index, item in enumerate(data):
            out.update(_flat(item, f"{prefix}.{index}"))
    else:
        out[prefix] = data
    return out


def flat(record: dict | None) -> dict[str, Any]:
    """The environment as dotted keys: packages.torch, machine.gpus.0.name, data.0.files.0.sha256."""
    return _flat(environment(record))


def mismatches(recorded: dict | None, current: dict) -> list[str]:
    """Each difference between the environment a run was made in and this one, in words:
    'packages.torch: the run had 2.13.0, here 2.14.0'."""
    if not recorded:
        return ["the run has no provenance.json (made before llmtui recorded it): nothing to compare"]
    then, now = flat(recorded), flat(current)
    out = []
    for key in list(then) + [k for k in now if k not in then]:
        a, b = then.get(key), now.get(key)
        if a != b:
            out.append(f"{key}: the run had {_show(a)}, here {_show(b)}")
    return out


def _show(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _gb(value: Any) -> str:
    return f"{value / 1e9:.1f} GB" if isinstance(value, (int, float)) and not isinstance(value, bool) else "?"


def lines(record: dict | None) -> list[str]:
    """`llmtui show`'s provenance section."""
    if not record:
        return ["  provenance  none recorded (a run made before llmtui recorded it)"]
    tool = record.get("llmtui") or {}
    revision = tool.get("revision")
    code = f"llmtui {tool.get('version', '?')}" + (
        f" @ {str(revision)[:12]}{' (uncommitted changes)' if tool.get('dirty') else ''}" if revision else "")
    machine = record.get("machine") or {}
    gpus = machine.get("gpus") or []
    hardware = ", ".join(f"{g.get('name')} {_gb(g.get('memory_bytes'))}" for g in gpus if isinstance(g, dict))
    hardware = (f"{hardware} (driver {machine.get('driver')})" if hardware else
                f"{machine.get('cpu') or 'CPU'} ({machine.get('cores', '?')} cores, {_gb(machine.get('memory_bytes'))})")
    packages = record.get("packages") or {}
    out = [f"  provenance  {code}; Python {record.get('python', '?')}; {record.get('os', '?')}",
           f"  machine     {hardware}",
           "  packages    " + ", ".join(f"{name} {version}" for name, version in packages.items())
           + (f" (torch CUDA: {record['torch_cuda']})" if record.get("torch_cuda") else "")]
    out.append(f"  seed        {record.get('seed', '?')}")
    for source in record.get("data") or []:
        if not isinstance(source, dict):
            continue
        files = source.get("files") or []
        what = (f"demo version {source.get('demo_version')}" if "demo_version" in source else
                "hub dataset (not hashed)" if source.get("hub") else
                ", ".join(f"{Path(str(f.get('path'))).name} sha256 {str(f.get('sha256'))[:12]}" for f in files
                          if isinstance(f, dict)) or "no files")
        out.append(f"  data        {source.get('source')}: {what}")
    if record.get("overrides"):
        out.append("  --set       " + " ".join(str(item) for item in record["overrides"]))
    return out
