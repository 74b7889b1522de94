"""`mty trace show`: what a trace holds, without running anything."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from mighty.trace._format import read_trace

__all__ = ["summarize"]


def summarize(path: str | Path) -> dict[str, Any]:
    """Instances, steps, export calls and imports by interface, as plain data."""
    trace = read_trace(path)
    instances: dict[int, dict[str, Any]] = {}
    records = 0
    for record in trace.records():
        records += 1
        instance = record.get("i")
        if not isinstance(instance, int):
            continue
        kind = record["k"]
        if kind == "instance":
            instances[instance] = {
                "instance": instance,
                "component": str(record.get("component", "")),
                "path": str(record.get("path", "")),
                "steps": 0,
                "exports": 0,
                "imports": Counter(),
            }
            continue
        entry = instances.get(instance)
        if entry is None:
            continue
        if kind in ("import", "call", "export"):
            entry["steps"] += 1
        if kind == "import":
            entry["imports"][f"{record['if']}#{record['fn']}"] += 1
        elif kind == "call":
            entry["exports"] += 1
    return {
        "path": str(path),
        "bytes": Path(path).stat().st_size,
        "records": records,
        "truncated": trace.truncated,
        "readable_bytes": trace.readable_bytes,
        "header": {k: v for k, v in trace.header.items() if isinstance(v, str | int | float)},
        "instances": [{**entry, "imports": dict(entry["imports"])} for entry in instances.values()],
    }
