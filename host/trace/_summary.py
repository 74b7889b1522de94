"""`mty trace show`: what a trace holds, without running anything."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from mighty.trace._format import TraceReader

__all__ = ["summarize"]


def summarize(path: str | Path) -> dict[str, Any]:
    """Instances, steps, export calls and imports by interface, as plain data.

    Streams the records (one frame in memory at a time, plus the blobs they name) and checks
    each against the record schema, so a malformed one is a ``TraceInvalid`` at its offset.
    """
    with TraceReader(path) as reader:
        return _summarize(reader, path)


def _summarize(reader: TraceReader, path: str | Path) -> dict[str, Any]:
    instances: dict[int, dict[str, Any]] = {}
    records = 0
    for record in reader.records(schema=True):
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
        "truncated": reader.truncated,
        "readable_bytes": reader.readable_bytes,
        "header": {k: v for k, v in reader.header.items() if _scalar(v)},
        "instances": [{**entry, "imports": dict(entry["imports"])} for entry in instances.values()],
    }


def _scalar(value: Any) -> bool:
    # A header int can be any size the writer took; one past Python's int->str limit would
    # fail the JSON rendering, so only ints that print are shown.
    if type(value) is int:
        return value.bit_length() <= 8 * 1024
    return isinstance(value, str | float)
