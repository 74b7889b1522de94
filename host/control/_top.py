"""``mty top``'s model, apart from any terminal: rates from two frames, and sorting.

A frame is what the ``top`` op returns (``Runtime.top``): counters per agent and per worker,
stamped with the runtime's monotonic clock. Rates are the change of a counter between two
frames over the runtime's own elapsed time, so a slow terminal or a slow socket does not skew
them. An agent new in the second frame has rate 0 (nothing to compare with).
"""

from __future__ import annotations

from typing import Any

from mighty._errors import BadInput

__all__ = ["SORT_KEYS", "sort_rows", "top_rows"]

SORT_KEYS = ("address", "type", "state", "mailbox", "msgs_per_s", "fuel_per_s", "memory")
"""What ``mty top`` can sort its agents by (``--sort`` and the ``s`` key)."""


def top_rows(previous: dict[str, Any] | None, current: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per agent of ``current``, with messages/s and fuel/s since ``previous``."""
    before: dict[str, dict[str, Any]] = {}
    elapsed = 0.0
    if previous is not None:
        before = {a["address"]: a for a in previous.get("agents", [])}
        elapsed = float(current.get("time", 0.0)) - float(previous.get("time", 0.0))
    rows = []
    for agent in current.get("agents", []):
        old = before.get(agent["address"])
        messages = fuel = 0.0
        if old is not None and elapsed > 0:
            done = agent["handled"] + agent["failed"] - old["handled"] - old["failed"]
            messages = max(0.0, done / elapsed)
            fuel = max(0.0, (agent["fuel"] - old["fuel"]) / elapsed)
        rows.append(
            {
                "address": agent["address"],
                "name": agent.get("name"),
                "type": agent["type"],
                "state": agent["state"],
                "mailbox": agent["mailbox"],
                "msgs_per_s": round(messages, 2),
                "fuel_per_s": round(fuel),
                "memory": agent["memory"],
                "handled": agent["handled"],
                "restarts": agent["restarts"],
            }
        )
    return rows


def sort_rows(rows: list[dict[str, Any]], key: str, *, reverse: bool | None = None) -> list[Any]:
    """``rows`` sorted by ``key`` (numbers largest first, text A to Z, unless ``reverse``)."""
    if key not in SORT_KEYS:
        raise BadInput(f"cannot sort by {key!r}; choose one of {', '.join(SORT_KEYS)}")
    numeric = key in ("mailbox", "msgs_per_s", "fuel_per_s", "memory")
    descending = numeric if reverse is None else reverse
    if key == "address":
        return sorted(rows, key=_address_key, reverse=descending)
    return sorted(rows, key=lambda r: (r[key], _address_key(r)), reverse=descending)


def _address_key(row: dict[str, Any]) -> tuple[str, int, str]:
    kind, _, pid = str(row["address"]).rpartition(":")
    return (kind, int(pid) if pid.isdigit() else 0, str(row["address"]))
