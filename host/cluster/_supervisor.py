"""A supervisor whose children run on several nodes, restarted elsewhere when a node dies.

The restart logic is the agents' own ``Supervisor`` (strategies one_for_one, rest_for_one and
one_for_all; intensity within a period): each child's ``start`` places it on a live node
(pinned to ``node`` while that node lives, else round-robin or least-loaded over the live
nodes) and spawns it there under its cluster-wide name. When the heartbeats of a node stop for
``dead_after`` seconds, each child it held is reported as crashed ("node b is down"): its name
is released from the names bucket and the strategy restarts it on a surviving node. Messages
queued in the dead node's mailboxes are lost (at-most-once), as in a local crash. A node that
leaves on purpose (its last heartbeat says so) is not a crash: its children are reported
stopped ("node b left") at once, not ``dead_after`` later, and restarted elsewhere all the
same (cluster children are permanent; the intensity counts it as any restart).

A child crashing on its own node is restarted there by the node (a fresh instance, the same
address and mailbox), as in a local tree; the cluster supervisor only sees node deaths. The
supervisor runs on one node; ``SupervisorLease`` (_lease) moves it to another node when that
one dies: the new one ``adopt``s the children still running (by their cluster-wide names) and
starts the others. ``detach`` stops supervising without stopping the children (a lost lease).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mighty.agents import (
    AgentError,
    BadSpawn,
    ChildSpec,
    Supervisor,
    SupervisorEvent,
    encode_body,
)
from mighty.cluster._config import ClusterSupervisorModel
from mighty.cluster._node import Node

__all__ = ["ClusterChild", "ClusterSupervisor", "RemoteChild"]

_log = logging.getLogger(__name__)
Placement = Literal["round_robin", "least_loaded"]


@dataclass(frozen=True)
class ClusterChild:
    """A child of a cluster supervisor: registered cluster-wide under ``name``."""

    name: str
    type: str
    init: Any = None
    node: str | None = None
    """Pinned to this node while it lives."""


class RemoteChild:
    """The supervisor's handle on a child running on some node."""

    def __init__(self, node: Node, address: str, name: str | None = None) -> None:
        self.node = node
        self.address = address
        self.name = name
        """Its cluster-wide name: a child that migrated is found by it where it lives now."""
        self.detached = False
        """Its supervisor let go of it (another node supervises it now): stop leaves it."""

    @property
    def current(self) -> str:
        """The child's address now: where its name was last registered (a live migration
        moves it), else the address it was started at."""
        owner = self.node.last_owner(self.name) if self.name is not None else None
        return owner or self.address

    @property
    def where(self) -> str:
        return self.current.partition(":")[0]

    def stop(self) -> None:
        if self.detached:
            return
        address = self.current
        if address.partition(":")[0] in self.node.live_nodes():
            try:
                self.node.stop_on(address)
            except AgentError as exc:
                _log.info("stopping %s: %s", address, exc.message)


class ClusterSupervisor:
    """Children placed on the cluster's nodes; see the module docstring."""

    def __init__(
        self,
        node: Node,
        children: Sequence[ClusterChild],
        *,
        name: str = "cluster",
        strategy: Literal["one_for_one", "rest_for_one", "one_for_all"] = "one_for_one",
        intensity: int = 3,
        period: float = 30.0,
        placement: Placement = "round_robin",
        local_intensity: int = 3,
        local_period: float = 5.0,
    ) -> None:
        self.node = node
        self.local_intensity = local_intensity
        self.local_period = local_period
        self.children = list(children)
        self.placement = placement
        self.events: list[SupervisorEvent] = []
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._handles: dict[str, RemoteChild] = {}
        self._adopting = False
        self._detached = False
        self.adopted: list[str] = []
        """The children found running by ``adopt`` (not restarted)."""
        self.supervisor = Supervisor(
            name,
            [ChildSpec(c.name, self._starter(c)) for c in self.children],
            strategy,
            intensity,
            period,
            on_event=self.events.append,
        )
        node.on_membership(self._membership)

    @classmethod
    def from_model(cls, node: Node, model: ClusterSupervisorModel) -> ClusterSupervisor:
        return cls(
            node,
            [ClusterChild(c.name, c.type, c.init, c.node) for c in model.children],
            strategy=model.strategy,
            intensity=model.intensity,
            period=model.period,
            placement=model.placement,
        )

    @property
    def state(self) -> str:
        return self.supervisor.state

    def start(self) -> ClusterSupervisor:
        self.supervisor.start()
        return self

    def stop(self) -> None:
        self.supervisor.stop()

    def adopt(self) -> ClusterSupervisor:
        """Start supervising children that may already run (a takeover): a child whose name is
        held by a live node is adopted as it is; the others start (placed) as by ``start``."""
        self._adopting = True
        try:
            self.supervisor.start()
        finally:
            self._adopting = False
        # A node that died while the children were adopted: its membership event may have come
        # before their handles were ours (and so found nothing to report). Look once more, now
        # that every handle is: its children are reported as on a dead node (a report that
        # came twice is about a replaced incarnation the second time, and ignored).
        with self._lock:
            handles = list(self._handles.items())
        live = set(self.node.live_nodes())
        for gone in sorted({self._where(n, h) for n, h in handles} - live):
            self._membership(gone, False)
        return self

    def detach(self) -> None:
        """Stop supervising, leaving every child running (another node supervises them now)."""
        self._detached = True
        with self._lock:
            handles = list(self._handles.values())
        for handle in handles:
            handle.detached = True
        self.supervisor.stop()

    def where(self) -> dict[str, str]:
        """Each running child's address (``node:type:pid``), by child name."""
        with self._lock:
            return {name: h.address for name, h in self._handles.items()}

    def _place(self, child: ClusterChild) -> str:
        peers = self.node.config.peers
        live = [n for n in self.node.live_nodes() if peers[n].spawn]
        if not live:
            raise BadSpawn(f"no live node to place {child.name!r} on")
        if child.node is not None and child.node in live:
            return child.node
        if self.placement == "least_loaded":
            return min(live, key=self.node.load)
        return live[next(self._turn) % len(live)]

    def _starter(self, child: ClusterChild) -> Any:
        def start() -> RemoteChild:
            if self._adopting:
                running = self._running(child)
                if running is not None:
                    return running
            target = self._place(child)
            address = self.node.spawn_on(
                target,
                child.type,
                encode_body(child.init),
                name=child.name,
                supervise=(self.local_intensity, self.local_period),
            )
            handle = RemoteChild(self.node, address, child.name)
            with self._lock:
                self._handles[child.name] = handle
            return handle

        return start

    def _where(self, name: str, handle: RemoteChild) -> str:
        return (self.node.last_owner(name) or handle.address).partition(":")[0]

    def _running(self, child: ClusterChild) -> RemoteChild | None:
        """The handle of ``child`` running on a live node, if it does (its name held there)."""
        owner = self.node.whereis(child.name)
        if owner is None:
            return None
        where, _, rest = owner.partition(":")
        if rest.partition(":")[0] != child.type:
            return None  # not this child (start refuses the name clash, naming the holder)
        if where not in self.node.live_nodes():
            self.node.forget_names_of(where)  # a dead node's claim: the child starts afresh
            return None
        handle = RemoteChild(self.node, owner, child.name)
        with self._lock:
            self._handles[child.name] = handle
            self.adopted.append(child.name)
        return handle

    def _membership(self, node: str, alive: bool) -> None:
        if alive or self._detached:
            return
        with self._lock:
            handles = list(self._handles.items())
        # Where each child is now: a migrated child's cluster-wide name moved with it.
        lost = [n for n, h in handles if self._where(n, h) == node]
        if not lost:
            return
        kept = set(self.node.forget_names_of(node))
        left = self.node.has_left(node)
        reason = f"node {node} left" if left else f"node {node} is down"
        for name in lost:
            if name in kept:  # the node came back with it and claimed it again: it runs there
                continue
            with self._lock:
                handle = self._handles.get(name)
            self.supervisor.child_exited(name, crashed=not left, reason=reason, handle=handle)
