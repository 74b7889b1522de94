"""Introspection: what a live agent is doing, answered without going through its handler.

``__inspect`` is a system message: ``AgentProcess.deliver`` answers it at once from the host
side, so it is answered while the handler is stuck in a long loop, while the mailbox is full,
and while the agent is paused for a hot swap. It never enters the mailbox and never reaches
the guest. The snapshot is a plain dict (JSON and CBOR both carry it) with ``version`` first.

Privacy. Without the introspect capability (``Runtime(introspect=True)``, off by default) a
snapshot holds names and counters only: addresses, message names, outcomes, durations, fuel,
memory. With it, the bodies of the in-flight and recent messages are included too, bounded to
``BODY_LIMIT`` bytes each.

The ring buffer of recent messages costs one tuple and one ``deque.append`` per handled message
(measured by benchmarks/bench_telemetry.py as part of the "telemetry off" figure).

Rejected: answering ``__inspect`` from a worker like any other message (the very case it must
serve is an agent whose worker is stuck), and a dataclass per snapshot (one more schema to keep
in step with the JSON the control socket sends anyway).
"""

from __future__ import annotations

import base64
import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from mighty._cbor import loads_untrusted

if TYPE_CHECKING:
    from mighty.agents._process import AgentProcess
    from mighty.agents._runtime import Runtime

__all__ = [
    "BODY_LIMIT",
    "HISTORY",
    "INSPECT",
    "SNAPSHOT_VERSION",
    "History",
    "agent_snapshot",
    "jsonable",
    "top_snapshot",
    "tree_snapshot",
    "workers_snapshot",
]

INSPECT = "__inspect"
"""The system message every live agent answers with its snapshot."""
SNAPSHOT_VERSION = 1
HISTORY = 32
"""Messages kept per agent in the ring buffer (a safe default; ``Runtime(history=...)``)."""
BODY_LIMIT = 1024
"""Bytes of a message body shown in a snapshot, with the introspect capability."""

# outcome codes, kept small in the ring buffer
OK, FAILED, REFUSED, CRASHED = "ok", "failed", "refused", "crashed"
CANCELLED = "cancelled"
"""A message cancelled before its handler ran (``Runtime.cancel``, or its asker gave up)."""


Entry = tuple[str, str, str, float, float, int, bytes | None]
"""(name, sender, outcome, started on ``time.monotonic``, duration in seconds, fuel, body)."""


class History:
    """The last ``size`` messages one agent handled (:data:`Entry` tuples).

    ``append`` is the deque's own (no Python frame per message).
    """

    __slots__ = ("_items", "append")

    def __init__(self, size: int = HISTORY) -> None:
        self._items: deque[Entry] = deque(maxlen=max(0, size))
        self.append = self._items.append

    def add(
        self,
        name: str,
        sender: str,
        outcome: str,
        started: float,
        duration: float,
        fuel: int,
        body: bytes | None,
    ) -> None:
        self._items.append((name, sender, outcome, started, duration, fuel, body))

    def items(self) -> list[Entry]:
        # list() of a deque another thread appends to can raise RuntimeError; retry briefly.
        for _ in range(8):
            try:
                return list(self._items)
            except RuntimeError:
                continue
        return []

    def __len__(self) -> int:
        return len(self._items)


def jsonable(value: Any, depth: int = 0) -> Any:
    """A decoded body as plain JSON: bytes as base64, non-string keys as pairs, bounded depth."""
    if depth > 32:
        return "..."
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, list | tuple):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: jsonable(v, depth + 1) for k, v in value.items()}
        return [[jsonable(k, depth + 1), jsonable(v, depth + 1)] for k, v in value.items()]
    return repr(value)[:200]


def body_view(body: bytes) -> Any:
    """A body for a snapshot: decoded when small and CBOR, else its size (bounded)."""
    if len(body) > BODY_LIMIT:
        return {"truncated": True, "size": len(body), "head": base64.b64encode(body[:64]).decode()}
    if not body:
        return None
    try:
        return jsonable(loads_untrusted(body))
    except Exception:  # noqa: BLE001 -- any undecodable body is shown as bytes
        return {"bytes": base64.b64encode(body).decode()}


def _state(process: AgentProcess) -> str:
    return str(process.state)


def agent_snapshot(
    process: AgentProcess, *, bodies: bool, now: float | None = None
) -> dict[str, Any]:
    """What ``process`` is doing now (see the module docstring for the privacy rule)."""
    runtime = process.runtime
    agent_type = process.type
    budget = agent_type.budget
    current = process.current
    started = process.started
    mono = time.monotonic() if now is None else now
    in_flight: dict[str, Any] | None = None
    if current is not None:
        elapsed = max(0.0, mono - started)
        left = budget.timeout - elapsed
        context = current.context
        if context is not None and context.deadline is not None:
            left = min(left, context.deadline - mono)  # the asker's deadline comes first
        in_flight = {
            "id": current.context_id,
            "message": current.name,
            "sender": current.sender,
            "elapsed_ms": round(elapsed * 1000, 3),
            "deadline_left_ms": round(max(0.0, left) * 1000, 3),
        }
        if context is not None and context.parent is not None:
            in_flight["parent"] = context.parent
        if bodies:
            in_flight["body"] = body_view(current.body)
    instance = process.instance
    memory_used, memory_ceiling = instance.memory if instance is not None else (0, budget.memory)
    recent = []
    last_fuel = 0
    # Started times are monotonic (cheap on the message path); shown as wall time.
    to_wall = time.time() - time.monotonic()
    for name, sender, outcome, started_at, duration, fuel, body in process.recent.items():
        item: dict[str, Any] = {
            "name": name,
            "sender": sender,
            "outcome": outcome,
            "at": round(started_at + to_wall, 6),
            "duration_ms": round(duration * 1000, 3),
            "fuel": fuel,
        }
        if bodies and body is not None:
            item["body"] = body_view(body)
        recent.append(item)
        last_fuel = fuel
    mailbox = process.mailbox
    stats = process.stats
    children = [p.address for p in runtime.agents() if p.parent == process.address]
    return {
        "version": SNAPSHOT_VERSION,
        "address": process.address,
        "name": process.name,
        "type": agent_type.name,
        "component": agent_type.component.sha256,
        "state": _state(process),
        "parent": process.parent,
        "children": children,
        "mailbox": {
            "depth": len(mailbox),
            "capacity": mailbox.capacity,
            "high_water": mailbox.high_water,
            "accepted": mailbox.accepted,
            "dropped": mailbox.dropped + stats.dropped,
            "rejected": mailbox.rejected,
        },
        "in_flight": in_flight,
        "budget": {
            "memory_used": memory_used,
            "memory_ceiling": memory_ceiling,
            "fuel_last_message": last_fuel,
            "fuel_per_message": budget.fuel,
            "fuel_lifetime": stats.fuel,
            "fuel_lifetime_limit": agent_type.lifetime_fuel,
            "timeout_s": budget.timeout,
        },
        "handled": stats.handled,
        "failed": stats.failed,
        "crashes": stats.crashes,
        "restarts": stats.restarts,
        "unhandled": stats.unhandled,
        "hibernations": stats.hibernations,
        "wakes": stats.wakes,
        "recent": recent,
        "bodies": bodies,
        "grants": {
            "tools": sorted(agent_type.grants.tools),
            "spawn": sorted(agent_type.grants.spawn),
            "message": sorted(agent_type.grants.message),
            "inspect": sorted(agent_type.grants.inspect),
            "http": [str(g.origin) for g in agent_type.policy.http.grants],
        },
    }


def tree_snapshot(runtime: Runtime, *, bodies: bool) -> dict[str, Any]:
    """Every live agent's snapshot, the supervisors (name -> parent) and the workers."""
    agents = sorted(runtime.agents(), key=_pid)
    return {
        "version": SNAPSHOT_VERSION,
        "supervisors": [
            {"name": name, "parent": parent} for name, parent in runtime.supervisors.items()
        ],
        "agents": [agent_snapshot(p, bodies=bodies) for p in agents],
        "workers": workers_snapshot(runtime),
    }


def workers_snapshot(runtime: Runtime) -> list[dict[str, Any]]:
    return [
        {
            "name": w.name,
            "queued": w.queued,
            "current": w.current,
            "batches": w.batches,
            "messages": w.messages,
            "steals": w.steals,
        }
        for w in runtime.worker_stats()
    ]


def top_snapshot(runtime: Runtime) -> dict[str, Any]:
    """Counters only (no recent messages, no bodies): one frame of ``mty top``."""
    rows = []
    for process in sorted(runtime.agents(), key=_pid):
        instance = process.instance
        memory = instance.memory[0] if instance is not None else 0
        rows.append(
            {
                "address": process.address,
                "name": process.name,
                "type": process.type.name,
                "state": _state(process),
                "mailbox": len(process.mailbox),
                "handled": process.stats.handled,
                "failed": process.stats.failed,
                "fuel": process.stats.fuel,
                "memory": memory,
                "restarts": process.stats.restarts,
            }
        )
    return {
        "version": SNAPSHOT_VERSION,
        "time": time.monotonic(),
        "agents": rows,
        "workers": workers_snapshot(runtime),
    }


def _pid(process: AgentProcess) -> tuple[int, str]:
    tail = process.address.rpartition(":")[2]
    return (int(tail) if tail.isdigit() else 0, process.address)
