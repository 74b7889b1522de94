"""Replaying one agent across several trace files: a migrated agent's whole history.

An agent that migrates (``mighty.cluster``) lives first on one node and then on another, and
each node records into its own trace. Each node's recorder carries ``node`` in its header, and
the migration writes a link record (kind ``migrated``) into both traces: ``from`` and ``to``
(``node:type:pid``), ``a`` (the agent's address on the node that wrote it) and ``snapshot``
(the sha256 of the state that moved). ``replay_across`` follows the links from the agent's
first address: it replays the agent's instances in the first node's trace (``replay_trace``
with ``agent=``: every export result, import and output byte-identical to the recording),
checks that the state its ``snapshot`` export returned is the state the next node's instance
was given to ``restore`` (both hashed to the link's ``snapshot``), and goes on in the next
node's trace, until the agent's last node.

Trace files are hostile input: at most ``MAX_TRACES`` files and ``MAX_HOPS`` links are read,
link records are checked field by field (a bad one is ``TraceInvalid``), and a chain that
loops or names a node with no trace is a ``HostError`` naming what is missing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mighty._errors import HostError
from mighty.engine import ComponentStore
from mighty.trace._errors import TraceInvalid
from mighty.trace._format import FILE_MAGIC, TraceReader
from mighty.trace._replay import DEFAULT_REPLAY_LIMITS, ReplayLimits, ReplayReport, replay_trace

__all__ = ["MAX_HOPS", "MAX_TRACES", "AcrossReport", "Segment", "migration_link", "replay_across"]

MAX_TRACES = 64
"""The most trace files one cross-node replay reads (a directory holding more is refused)."""
MAX_HOPS = 64
"""The most migrations one agent's history may follow."""
LINK = "migrated"
_ADDRESS = re.compile(r"^[A-Za-z0-9_-]{1,64}:[^:\s]{1,128}:[0-9]{1,19}$")
_SHA = re.compile(r"^[0-9a-f]{64}$")


def migration_link(
    *, local: str, node: str, source: str, target: str, state: bytes
) -> dict[str, Any]:
    """The link record a migration writes into both nodes' traces (see the module docstring)."""
    return {
        "k": LINK,
        "a": local,
        "node": node,
        "from": source,
        "to": target,
        "snapshot": hashlib.sha256(state).hexdigest(),
    }


@dataclass
class Segment:
    """One stretch of the agent's life: on ``node``, at ``address``, recorded in ``path``."""

    node: str
    address: str
    path: Path
    report: ReplayReport
    snapshot: str | None = None
    """The sha256 of the state it handed on (None for the last segment)."""


@dataclass
class AcrossReport:
    """The agent's history replayed end to end: one segment per node it lived on."""

    agent: str
    segments: list[Segment] = field(default_factory=list)

    @property
    def digest(self) -> str:
        """A digest of every segment's replay digest, in order."""
        total = hashlib.sha256()
        for segment in self.segments:
            total.update(segment.report.digest.encode())
        return total.hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "agent": self.agent,
            "digest": self.digest,
            "segments": [
                {
                    "node": s.node,
                    "address": s.address,
                    "trace": str(s.path),
                    "snapshot": s.snapshot,
                    **s.report.to_json(),
                }
                for s in self.segments
            ],
        }


@dataclass
class _Trace:
    path: Path
    node: str | None
    links: list[dict[str, Any]]
    snapshots: dict[str, list[str]]
    """agent address -> sha256 of each state its ``snapshot`` export returned, in order."""
    restores: dict[str, list[str]]
    """agent address -> sha256 of each state given to its ``restore`` export, in order."""


def _traces(paths: Sequence[str | Path]) -> list[Path]:
    found: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            for candidate in sorted(path.iterdir()):
                if candidate.is_file() and _is_trace(candidate):
                    found.append(candidate)
                if len(found) > MAX_TRACES:
                    break
        else:
            found.append(path)
        if len(found) > MAX_TRACES:
            raise HostError(f"more than {MAX_TRACES} trace files to read")
    if not found:
        raise HostError(f"no trace file in {', '.join(str(p) for p in paths)}")
    return found


def _is_trace(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return f.read(len(FILE_MAGIC)) == FILE_MAGIC
    except OSError:
        return False


def _state_sha(value: Any) -> str | None:
    if isinstance(value, bytes):
        return hashlib.sha256(value).hexdigest()
    if isinstance(value, list) and all(type(v) is int and 0 <= v < 256 for v in value):
        return hashlib.sha256(bytes(value)).hexdigest()
    return None


def _check_link(record: dict[str, Any], offset: int) -> dict[str, Any]:
    for key, pattern in (("from", _ADDRESS), ("to", _ADDRESS), ("snapshot", _SHA)):
        value = record.get(key)
        if type(value) is not str or not pattern.match(value):
            raise TraceInvalid(
                f'{LINK} record at byte {offset}: field "{key}" is missing or malformed',
                offset=offset,
            )
    for key in ("a", "node"):
        if type(record.get(key)) is not str:
            raise TraceInvalid(
                f'{LINK} record at byte {offset}: field "{key}" is not a string', offset=offset
            )
    return record


def _scan(path: Path) -> _Trace:
    links: list[dict[str, Any]] = []
    snapshots: dict[str, list[str]] = {}
    restores: dict[str, list[str]] = {}
    with TraceReader(path) as reader:
        header = reader.header
        for record in reader.records(schema=True):
            kind = record.get("k")
            agent = record.get("a")
            if kind == LINK:
                if len(links) >= MAX_HOPS * 4:
                    raise TraceInvalid(f"{path}: too many {LINK} records", offset=-1)
                links.append(_check_link(record, reader.record_offset))
            elif type(agent) is not str:
                continue
            elif kind == "export" and record["fn"] == "snapshot" and record["ok"]:
                sha = _state_sha(record["res"])
                if sha is not None:
                    snapshots.setdefault(agent, []).append(sha)
            elif kind == "call" and record["fn"] == "restore" and record["args"]:
                sha = _state_sha(record["args"][0])
                if sha is not None:
                    restores.setdefault(agent, []).append(sha)
    node = header.get("node")
    if type(node) is not str:
        nodes = {link["node"] for link in links}
        node = nodes.pop() if len(nodes) == 1 else None
    return _Trace(path, node, links, snapshots, restores)


def replay_across(
    paths: Sequence[str | Path],
    agent: str,
    *,
    limits: ReplayLimits = DEFAULT_REPLAY_LIMITS,
    component_dirs: Sequence[Path] = (),
    store: ComponentStore | None = None,
) -> AcrossReport:
    """Replay agent ``agent`` (``node:type:pid``, its address before its first migration)
    across the trace files in ``paths`` (files, or directories holding them), following its
    migrations; see the module docstring. Raises what ``replay_trace`` raises (a divergence is
    a ``NondeterminismError``), or HostError when the history does not join up."""
    if not _ADDRESS.match(agent):
        raise HostError(f"{agent!r} is not an agent address node:type:pid")
    traces = [_scan(p) for p in _traces(paths)]
    by_node: dict[str, _Trace] = {}
    for trace in traces:
        if trace.node is None:
            continue
        if trace.node in by_node:
            raise HostError(
                f"two traces of node {trace.node}: {by_node[trace.node].path} and {trace.path}"
            )
        by_node[trace.node] = trace
    report = AcrossReport(agent)
    current = agent
    seen: set[str] = set()
    for _ in range(MAX_HOPS + 1):
        if current in seen:
            raise HostError(f"the migrations of {agent} loop back to {current}")
        seen.add(current)
        node, _, local = current.partition(":")
        found = by_node.get(node)
        if found is None:
            known = ", ".join(sorted(by_node)) or "none"
            raise HostError(f"no trace of node {node} (for {current}); traces of: {known}")
        trace = found
        replayed = replay_trace(
            trace.path,
            agent=local,
            limits=limits,
            component_dirs=component_dirs,
            store=store,
        )
        segment = Segment(node, current, trace.path, replayed)
        report.segments.append(segment)
        out = [k for k in trace.links if k["from"] == current and k["node"] == node]
        if not out:
            return report
        link = out[-1]
        segment.snapshot = link["snapshot"]
        if link["snapshot"] not in trace.snapshots.get(local, []):
            raise HostError(
                f"{trace.path}: {current} moved to {link['to']} with state "
                f"{link['snapshot'][:12]}, but no snapshot of it recorded here returned that"
            )
        nxt = link["to"]
        following = by_node.get(nxt.partition(":")[0])
        if following is None:
            raise HostError(
                f"{current} moved to {nxt}, and no trace of node {nxt.partition(':')[0]} was given"
            )
        arrived = [k for k in following.links if k["to"] == nxt and k["from"] == current]
        if not arrived or arrived[-1]["snapshot"] != link["snapshot"]:
            raise HostError(f"{following.path} has no record of {nxt} arriving from {current}")
        if link["snapshot"] not in following.restores.get(nxt.partition(":")[2], []):
            raise HostError(
                f"{following.path}: {nxt} was not restored from the state {current} handed on"
            )
        current = nxt
    raise HostError(f"{agent} migrated more than {MAX_HOPS} times")
