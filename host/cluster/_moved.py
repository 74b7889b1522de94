"""Supervised agents that migrate: the child becomes a remote child of its supervisor.

An agent under a supervisor of its node (a tree the node was given with ``Node.adopt``, such as
`mty node`'s ``[supervisor]``, or the one-child supervisor a node runs for each child of a
cluster supervisor) may migrate. The supervisor stays where it was (the *home* node) and its
child spec follows the agent:

- at the commit the supervisor's handle on the child becomes a ``Moved`` handle on the new
  address (``Supervisor.relocate``), and the child's ``start`` becomes a start on the target;
- on the target the agent reports its crashes to the home node (a ``migrate`` frame, op
  ``exited``); the home supervisor applies its strategy and intensity as for a local child,
  and its restart revives the agent on the target: the same address and mailbox, a fresh
  instance from ``init`` (op ``restart``), as a local restart does. Stopping it for a group
  restart halts it there (op ``halt``), retiring it stops it for good;
- when the target node dies (heartbeats), the home node reports the child crashed ("node b
  is down") and the restart starts it at home again, as the spec first said; when it leaves on
  purpose, the child is reported stopped ("node b left"), which restarts a permanent child the
  same way (a transient one is not restarted).

Not done: moving such a remote child on again (from the target to a third node, or back):
refused, with a message saying so; and a child whose home node dies keeps running on the
target unsupervised (its next crash buries it), as the children of a dead cluster supervisor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mighty._errors import BadInput, HostError
from mighty.agents import AgentError, BadSpawn, NoProc, Supervisor
from mighty.cluster._frames import Frame

if TYPE_CHECKING:
    from mighty.cluster._node import Node

__all__ = [
    "Moved",
    "Reporter",
    "find_supervisor",
    "moved_op",
    "on_membership",
    "relocate",
    "supervised_extra",
]

_log = logging.getLogger(__name__)
_OP_TIMEOUT = 10.0
_RESTART_TIMEOUT = 300.0
_MAX_DEPTH = 32


@dataclass
class Moved:
    """The home supervisor's handle on a child that migrated to ``address`` (node:type:pid)."""

    node: Node
    address: str

    @property
    def where(self) -> str:
        return self.address.partition(":")[0]

    def stop(self) -> None:
        """Halt it on its node (its mailbox kept for a restart); nothing when that node is down."""
        if self.where in self.node.live_nodes():
            frame = Frame("migrate", node=self.node.name, to=self.address, extra={"op": "halt"})
            try:
                self.node.request(self.where, frame, _OP_TIMEOUT)
            except AgentError as exc:
                _log.info("halting %s: %s", self.address, exc.message)

    def retire(self) -> None:
        """Stopped for good: stopped on its node, its queue settled there."""
        if self.where in self.node.live_nodes():
            try:
                self.node.stop_on(self.address)
            except AgentError as exc:
                _log.info("stopping %s: %s", self.address, exc.message)


@dataclass
class _Relocated:
    supervisor: Supervisor
    child: str
    type: str
    init: bytes
    sha: str
    size: int
    handle: Moved
    home_start: Callable[[], Any]
    target: str | None


class Reporter:
    """The on_exit of a migrated supervised agent: tells its home node's supervisor."""

    def __init__(self, node: Node, home: str, supervisor: str, child: str) -> None:
        self.node = node
        self.home = home
        self.supervisor = supervisor
        self.child = child

    def __call__(self, process: Any, crashed: bool, reason: str) -> None:
        node = self.node
        frame = Frame(
            "migrate",
            node=node.name,
            to=node.qualify(process.address),
            name=self.child,
            extra={
                "op": "exited",
                "sup": self.supervisor,
                "crashed": crashed,
                "reason": reason[:400],
            },
        )

        def report() -> None:
            try:
                node.request(self.home, frame, _OP_TIMEOUT)
            except (AgentError, HostError) as exc:
                # The home node refused it, or could not be reached (NATS gone, this node
                # leaving: ClusterError): nobody will restart it, so settle its queue, as for an
                # unsupervised crash. Nothing may escape this thread.
                _log.warning(
                    "node %s: %s crashed and its supervisor on node %s did not hear it (%s)",
                    node.name,
                    process.address,
                    self.home,
                    exc,
                )
                with suppress(AgentError, HostError):
                    node.runtime.stop(process.address)

        # on_exit runs on a worker thread: the request waits on the node's pool, not there.
        threading.Thread(target=report, name=f"report-{process.address}", daemon=True).start()


def _walk(supervisor: Supervisor, depth: int = 0) -> Iterator[tuple[Supervisor, str, Any]]:
    for info in supervisor.which_children():
        yield supervisor, info.name, info.handle
        if isinstance(info.handle, Supervisor) and depth < _MAX_DEPTH:
            yield from _walk(info.handle, depth + 1)


def find_supervisor(node: Node, process: Any) -> tuple[Supervisor, str] | None:
    """The supervisor of this node holding ``process`` as a running child, and the child's name."""
    for root in node.supervision_trees():
        for supervisor, child, handle in _walk(root):
            if handle is process:
                return supervisor, child
    return None


def supervised_extra(node: Node, process: Any) -> dict[str, str] | None:
    """For the prepare frame: who supervises ``process`` (None: nobody), or MigrationFailed."""
    from mighty.cluster._migrate import MigrationFailed

    if process.on_exit is None:
        return None
    if isinstance(process.on_exit, Reporter):
        raise MigrationFailed(
            f"{process.address} is a remote child of a supervisor on node "
            f"{process.on_exit.home}; moving it on again is not supported"
        )
    found = find_supervisor(node, process)
    if found is None:
        raise MigrationFailed(
            f"{process.address} is supervised by a supervisor node {node.name} was not given "
            "(Node.adopt); it cannot follow the agent"
        )
    supervisor, child = found
    if (supervisor.name, child) in node.relocated:
        raise MigrationFailed(f"supervisor {supervisor.name!r} already has a moved child {child!r}")
    return {"home": node.name, "sup": supervisor.name, "child": child}


def relocate(node: Node, process: Any, extra: dict[str, str], new_address: str) -> None:
    """At the commit: the supervisor's child spec follows the agent to ``new_address``."""
    found = find_supervisor(node, process)
    if found is None:
        _log.warning("migration: %s left its supervisor as it moved", process.address)
        return
    supervisor, child = found
    handle = Moved(node, new_address)
    component = process.type.component
    relocated = _Relocated(
        supervisor,
        child,
        process.type.name,
        process.init,
        component.sha256,
        component.size,
        handle,
        lambda: None,
        new_address.partition(":")[0],
    )
    try:
        relocated.home_start = supervisor.relocate(child, handle, lambda: _start(node, relocated))
    except BadInput as exc:
        _log.warning("migration: %s moved unsupervised: %s", process.address, exc.message)
        return
    with node._lock:
        node.relocated[(supervisor.name, child)] = relocated


def _start(node: Node, relocated: _Relocated) -> Any:
    """The moved child's start: on its node (revived there) while it lives, else at home."""
    target = relocated.target
    if target is not None and target in node.live_nodes():
        frame = Frame(
            "migrate",
            node=node.name,
            type=relocated.type,
            name=relocated.child,
            extra={
                "op": "restart",
                "sha": relocated.sha,
                "size": relocated.size,
                "init": relocated.init,
                "sup": relocated.supervisor.name,
            },
        )
        address = node.request(target, frame, _RESTART_TIMEOUT).to
        if address.count(":") != 2 or not address.startswith(f"{target}:"):
            raise BadSpawn(f"{target} restarted {relocated.child!r} at a bad address {address!r}")
        relocated.handle = Moved(node, address)
        return relocated.handle
    # Its node is gone: the child comes home, under the start its spec had.
    with node._lock:
        node.relocated.pop((relocated.supervisor.name, relocated.child), None)
    relocated.target = None
    return relocated.home_start()


def on_membership(node: Node, dead: str, alive: bool) -> None:
    """A node died: every child moved there is reported crashed to its supervisor; a node that
    left on purpose: stopped (a permanent child is restarted all the same, a transient one is
    not)."""
    if alive:
        return
    left = node.has_left(dead)
    with node._lock:
        lost = [r for r in node.relocated.values() if r.handle.where == dead]
    for relocated in lost:
        relocated.supervisor.child_exited(
            relocated.child,
            crashed=not left,
            reason=f"node {dead} left" if left else f"node {dead} is down",
            handle=relocated.handle,
        )


def moved_op(node: Node, frame: Frame, op: str) -> Frame:
    """The ops of moved supervised agents: exited (at home), restart and halt (on the target)."""
    from mighty.cluster._migrate import type_for

    runtime = node.runtime
    if op == "exited":
        supervisor = frame.extra.get("sup")
        with node._lock:
            relocated = node.relocated.get((str(supervisor), frame.name))
        if relocated is None or relocated.handle.address != frame.to:
            raise NoProc(f"node {node.name} supervises no moved child {frame.name!r} at {frame.to}")
        relocated.supervisor.child_exited(
            frame.name,
            crashed=frame.extra.get("crashed") is not False,
            reason=f"{frame.to}: {frame.extra.get('reason', '')}",
            handle=relocated.handle,
        )
        return Frame("ok", node=node.name)
    if op == "halt":
        runtime.process(node.localize(frame.to)).halt(timeout=_OP_TIMEOUT)
        return Frame("ok", node=node.name)
    # restart
    supervisor = frame.extra.get("sup")
    init = frame.extra.get("init", b"")
    if not frame.name or not isinstance(supervisor, str) or not isinstance(init, bytes):
        raise BadSpawn("restart takes a name, {sup: str, init: bytes}")
    address = runtime.whereis(frame.name)
    if address is not None:
        process = runtime.process(address)
        if not process.alive:
            process.revive()
        return Frame("ok", node=node.name, to=node.qualify(address))
    agent_type = type_for(node, frame)
    process = runtime.spawn_process(
        frame.type,
        init,
        name=frame.name,
        on_exit=Reporter(node, frame.node, supervisor, frame.name),
        agent_type=agent_type,
    )
    return Frame("ok", node=node.name, to=node.qualify(process.address))
