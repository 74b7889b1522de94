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
  same way (a transient one is not restarted). A cluster supervisor's child is the exception:
  its cluster supervisor, which follows it by name, restarts it, and the home's one-child
  supervisor lets go of it (both restarted it before: two restarts for one death, one of them
  refused the name and counted as a failed start).

**Moving on again.** A remote child on b may migrate on to c: the prepare frame carries its
home, supervisor, child name and policy as the first move's did; c, once the state is restored
and before the agent takes a message, tells the home (op ``moved``: from b's address to c's),
whose handle then points at c (crashes on c are reported home, restarts revive it on c, c's
death restarts it at home). Moving it back home makes it a local child of its supervisor
again (``Supervisor.relocate`` with the start it had). A migration that fails after c told the
home is told back (op ``moved``, c's address to b's) by b. Rejected: b telling the home at its
commit (the agent runs on c from the restore on: a crash there before the home heard of the
move was reported from an address the home did not know, and the child was buried).

**The home dies.** A remote child's crashes are reported to a node that may be gone. When its
node declares the home dead, or hears it leave, the child is *adopted*: the node puts it under
a one-child supervisor of its own (``<node>/<child>``, one_for_one) with the policy the home
supervisor had for it (the child's restart type, the supervisor's intensity and period, sent
with the prepare frame), registered as the node's one-child supervisors of cluster children
are (a later migration takes it along; a cluster supervisor's stop stops it for good). A
cluster supervisor's child is thereby in the shape the cluster supervisor gives its children
anyway (a one-child supervisor on the node it runs on, the cluster supervisor following it by
its name), so "adopted by the cluster supervisor" and "by a supervisor of its node" are one
mechanism. One crash is restarted once: the adoption and a crash report race under one lock;
a crash whose report the home never acknowledged waits (bounded: ``dead_after`` and a few
heartbeats) for the home to be declared dead, then the adoption revives it, and a report the
home acknowledged before it died leaves a crashed agent that the adoption's start revives; an
old home's ``restart`` or ``halt`` for an adopted child is refused. A crash that nobody can
take (NATS gone, the home live but not answering) settles the child's queue, as before.

When the home comes back (a new process under the node's name), the child stays where it is,
supervised by its new node, until the home starts a tree that has it (``Node.start_tree``, as
`mty node` starts its ``[supervisor]``): before that tree starts, the home asks for its
children back (op ``handback``), and the node that adopted one moves it home live (state and
mailbox; senders keep their addresses), where it is held (no message taken) until the tree's
start has taken it as its own child; the adoptive supervisor then lets go of it. One name moves
as in any migration, so nothing runs twice. A home back without that tree (a library user's
``Node``) leaves it where it is: a second copy at home is refused, naming the holder.
Rejected: leaving it with the adoptive supervisor for good (the returning home's tree then
fails to start: its child's name is held elsewhere); stopping it so that the home's tree
starts it afresh (OTP's restart of a node's tree, but the state and the queued messages would
go for no failure of the child); moving it back as soon as the home is heard again (that move
and the tree's own start of the child race for the name); supervising it from the cluster
supervisor's node (a child of a local tree is no cluster child, and the node it runs on is the
one that sees its crashes first).

A home that was only cut off (declared dead while it ran) still holds its handle on the child:
when it is heard again, the node that adopted the child asks it (op ``moved``, from the
child's address to the same), and if its supervisor still has the child there, the child
reports to it again and the adoptive supervisor lets go (unless the child is being restarted
at that moment: then it stays adopted).

An adopted child moved on from the node that adopted it (a remote child of the adoptive
supervisor there) carries its first home in its policy (``origin``): asked by that home, the
node it runs on moves it there and has the adoptive supervisor let go (op ``release``).

Not done: while a home is declared dead but running, its ops on the adopted child are refused
(its supervisor counts a refused restart as a failed start); a home that was only cut off does
not get back a child adopted and then moved on (it is the adoptive supervisor's remote child).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from mighty._errors import BadInput, HostError
from mighty.agents import (
    AgentError,
    BadSpawn,
    ChildSpec,
    NoProc,
    Refused,
    Supervisor,
    SupervisorEvent,
    SupervisorStartFailed,
)
from mighty.cluster._frames import Frame

if TYPE_CHECKING:
    from mighty.cluster._node import Node

__all__ = [
    "Moved",
    "Policy",
    "Reporter",
    "adopt",
    "find_supervisor",
    "follow",
    "moved_op",
    "on_membership",
    "reclaim",
    "relocate",
    "supervised_extra",
    "unfollow",
]

_log = logging.getLogger(__name__)
_OP_TIMEOUT = 10.0
_HANDBACK_TIMEOUT = 600.0
"""A hand-back is a migration, which may ship and compile the component."""
_RESTART_TIMEOUT = 300.0
_MAX_DEPTH = 32
_RESTARTS = ("permanent", "transient", "temporary")
_ADOPT = threading.RLock()
"""Held while a remote child is adopted or revived by its home's restart: one crash, one
revive."""

Restart = Literal["permanent", "transient", "temporary"]


@dataclass(frozen=True)
class Policy:
    """What the home supervisor does after a crash of the child: the child's restart type, and
    the supervisor's intensity within period (an adoptive supervisor keeps them)."""

    restart: Restart = "permanent"
    intensity: int = 3
    period: float = 5.0
    cluster: bool = False
    """A cluster supervisor's child: the death of the node it runs on is the cluster
    supervisor's to restart (it follows the child by name), not its home supervisor's."""
    origin: str = ""
    """An adopted child's first home: the node its hand-back goes to (see ``reclaim``)."""

    def to_wire(self) -> dict[str, Any]:
        return {
            "restart": self.restart,
            "intensity": self.intensity,
            "period": self.period,
            "cluster": self.cluster,
            "origin": self.origin,
        }

    @classmethod
    def from_wire(cls, data: Any) -> Policy:
        """From a frame's fields (absent: the defaults), or BadSpawn."""
        if not isinstance(data, dict):
            raise BadSpawn("migrate: a policy is {restart, intensity, period}")
        restart = data.get("restart", "permanent")
        intensity = data.get("intensity", 3)
        period = data.get("period", 5.0)
        cluster = data.get("cluster", False)
        origin = data.get("origin", "")
        if (
            type(cluster) is not bool
            or not isinstance(origin, str)
            or len(origin) > 64
            or restart not in _RESTARTS
            or type(intensity) is not int
            or intensity < 0
            or type(period) not in (int, float)
            or not 0 < period < 1e9
        ):
            raise BadSpawn("migrate: a bad policy (restart, intensity >= 0, period > 0, cluster)")
        return cls(cast("Restart", restart), intensity, float(period), cluster, origin)

    @classmethod
    def of(cls, node: Node, supervisor: Supervisor, child: str) -> Policy:
        restart: Restart = "permanent"
        for info in supervisor.which_children():
            if info.name == child:
                restart = info.restart
        with node._lock:
            origin = next((r.home for r, s in node.orphans.values() if s is supervisor), "")
        return cls(
            restart,
            supervisor.intensity,
            supervisor.period,
            node.is_cluster_child(supervisor),
            origin,
        )


@dataclass
class Moved:
    """The home supervisor's handle on a child that migrated to ``address`` (node:type:pid);
    a later move of the child changes its address in place (op ``moved``)."""

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
    policy: Policy


class Reporter:
    """The on_exit of a migrated supervised agent: tells its home node's supervisor."""

    def __init__(
        self, node: Node, home: str, supervisor: str, child: str, policy: Policy | None = None
    ) -> None:
        self.node = node
        self.home = home
        self.supervisor = supervisor
        self.child = child
        self.policy = policy or Policy()

    def extra(self) -> dict[str, Any]:
        """Who supervises the agent, for the prepare frame of a move on."""
        return {
            "home": self.home,
            "sup": self.supervisor,
            "child": self.child,
            **self.policy.to_wire(),
        }

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
                return
            except (AgentError, HostError) as exc:
                failure = exc
            # The home did not hear it. Gone: the adoption restarts it (see the module
            # docstring). Else (NATS gone, the home refused it, this node leaving) nobody will
            # restart it, so settle its queue, as for an unsupervised crash. Nothing may escape
            # this thread.
            try:
                if self._orphaned(process):
                    return
            except Exception:  # noqa: BLE001 -- as below: stopped, never a thread's error
                _log.exception("node %s: adopting %s failed", node.name, process.address)
            _log.warning(
                "node %s: %s crashed and its supervisor on node %s did not hear it (%s)",
                node.name,
                process.address,
                self.home,
                failure,
            )
            with suppress(AgentError, HostError):
                node.runtime.stop(process.address)

        # on_exit runs on a worker thread: the request waits on the node's pool, not there.
        threading.Thread(target=report, name=f"report-{process.address}", daemon=True).start()

    def _orphaned(self, process: Any) -> bool:
        """Wait (bounded) for the home to be declared dead; True once the crashed ``process``
        was adopted (by this call or by the membership listener)."""
        node = self.node
        config = node.config
        deadline = time.monotonic() + config.dead_after + 4 * config.heartbeat + 1.0
        while not node.closed and time.monotonic() < deadline:
            if process.on_exit is not self:
                return True  # adopted meanwhile: the adoption's start revived it
            if node.is_down(self.home):
                adopt(node, process, self)
                return process.on_exit is not self
            time.sleep(config.heartbeat / 2)
        return False


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


def supervised_extra(node: Node, process: Any) -> dict[str, Any] | None:
    """For the prepare frame: who supervises ``process`` (None: nobody), or MigrationFailed."""
    from mighty.cluster._migrate import MigrationFailed

    reporter = process.on_exit
    if reporter is None:
        return None
    if isinstance(reporter, Reporter):
        if node.is_down(reporter.home):
            raise MigrationFailed(
                f"{process.address}: its supervisor's node {reporter.home} is down and this "
                "node is adopting it; move it once adopted"
            )
        return reporter.extra()  # a remote child moving on: its home stays its home
    found = find_supervisor(node, process)
    if found is None:
        raise MigrationFailed(
            f"{process.address} is supervised by a supervisor node {node.name} was not given "
            "(Node.adopt); it cannot follow the agent"
        )
    supervisor, child = found
    if (supervisor.name, child) in node.relocated:
        raise MigrationFailed(f"supervisor {supervisor.name!r} already has a moved child {child!r}")
    return {
        "home": node.name,
        "sup": supervisor.name,
        "child": child,
        **Policy.of(node, supervisor, child).to_wire(),
    }


def relocate(node: Node, process: Any, extra: dict[str, Any], new_address: str) -> None:
    """At the commit: the supervisor's child spec follows the agent to ``new_address`` (a
    remote child moving on: the target told its home, see ``follow``)."""
    if extra["home"] != node.name:
        return
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
        Policy.of(node, supervisor, child),
    )
    try:
        relocated.home_start = supervisor.relocate(child, handle, lambda: _start(node, relocated))
    except BadInput as exc:
        _log.warning("migration: %s moved unsupervised: %s", process.address, exc.message)
        return
    with node._lock:
        node.relocated[(supervisor.name, child)] = relocated


def follow(node: Node, process: Any, previous: str) -> None:
    """The target of a remote child moving on (its state restored, no message taken yet):
    its home hears of the move; a child moving back home is a local child again. BadSpawn when
    the home does not know it there (the migration then fails, the agent stays)."""
    reporter = process.on_exit
    if not isinstance(reporter, Reporter):
        return
    here = node.qualify(process.address)
    if reporter.home == node.name:
        _come_home(node, process, reporter, previous)
        return
    try:
        _tell_moved(node, reporter.home, reporter.supervisor, reporter.child, previous, here)
    except AgentError as exc:
        raise BadSpawn(
            f"the supervisor of {reporter.child!r} on node {reporter.home} did not take the "
            f"move: {exc.message}"
        ) from None


def unfollow(node: Node, extra: dict[str, Any], prepared: str, address: str) -> None:
    """A remote child's move on failed: if its target told the home, tell it back (best
    effort; the home only takes it while its handle points at ``prepared``)."""
    home = extra.get("home")
    if not isinstance(home, str) or home == node.name:
        return
    with suppress(AgentError, HostError):
        _tell_moved(
            node, home, str(extra.get("sup")), str(extra.get("child", "")), prepared, address
        )


def _tell_moved(node: Node, home: str, supervisor: str, child: str, old: str, new: str) -> None:
    """Op ``moved`` to ``home``: its supervisor's child at ``old`` is at ``new`` now (an
    AgentError, or a HostError when the home cannot be reached, unless it took it)."""
    frame = Frame(
        "migrate",
        node=node.name,
        to=new,
        name=child,
        extra={"op": "moved", "sup": supervisor, "from": old},
    )
    node.request(home, frame, _OP_TIMEOUT)


def _come_home(node: Node, process: Any, reporter: Reporter, previous: str) -> None:
    key = (reporter.supervisor, reporter.child)
    with node._lock:
        relocated = node.relocated.get(key)
    if relocated is None or relocated.handle.address != previous:
        raise BadSpawn(
            f"node {node.name} does not supervise {reporter.child!r} at {previous} any more"
        )
    supervisor, child = relocated.supervisor, relocated.child

    def exited(process: Any, crashed: bool, reason: str) -> None:
        supervisor.child_exited(child, crashed=crashed, reason=reason, handle=process)

    try:
        supervisor.relocate(child, process, relocated.home_start)
    except BadInput as exc:
        raise BadSpawn(f"{child!r} cannot come home: {exc.message}") from None
    process.on_exit = exited
    with node._lock:
        node.relocated.pop(key, None)
    node.hold_supervisor(process.address, supervisor, cluster=relocated.policy.cluster)


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
                "policy": relocated.policy.to_wire(),
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
    not). Every remote child here whose home it was is adopted."""
    if alive:
        _give_back(node, dead)
        return
    left = node.has_left(dead)
    with node._lock:
        lost = [r for r in node.relocated.values() if r.handle.where == dead]
    for relocated in lost:
        if relocated.policy.cluster:
            # Its cluster supervisor restarts it (it follows the child's name to the dead
            # node): a restart here too would be a second one for one death.
            with node._lock:
                node.relocated.pop((relocated.supervisor.name, relocated.child), None)
            relocated.supervisor.stop()
            node.drop_supervisor(relocated.supervisor)
            continue
        relocated.supervisor.child_exited(
            relocated.child,
            crashed=not left,
            reason=f"node {dead} left" if left else f"node {dead} is down",
            handle=relocated.handle,
        )
    for process in node.runtime.agents():
        reporter = process.on_exit
        if isinstance(reporter, Reporter) and reporter.home == dead:
            adopt(node, process, reporter)


def adopt(node: Node, process: Any, reporter: Reporter) -> Supervisor | None:
    """Put the remote child ``process``, whose home is gone, under a one-child supervisor of
    this node with its home's policy; a crashed one is revived (its crash was never
    restarted). None when it was adopted already or could not be."""
    runtime = node.runtime
    name = process.name
    with _ADOPT:
        if process.on_exit is not reporter:
            return None  # adopted already, or moved home
        if name is None:
            _log.warning("node %s: %s has no name to adopt it by", node.name, process.address)
            return None
        policy = reporter.policy
        if not process.alive and policy.restart == "temporary":
            process.on_exit = None
            with suppress(AgentError):
                runtime.stop(process.address)  # a temporary child is never restarted
            return None
        holder: list[Supervisor] = []

        def exited(crashed_process: Any, crashed: bool, reason: str) -> None:
            holder[0].child_exited(
                reporter.child, crashed=crashed, reason=reason, handle=crashed_process
            )

        def start() -> Any:
            address = runtime.whereis(name)
            if address is not None:
                found = runtime.process(address)
                found.on_exit = exited
                if not found.alive:
                    found.revive()
                return found
            return runtime.spawn_process(
                process.type.name,
                process.init,
                name=name,
                on_exit=exited,
                agent_type=process.type,
            )

        def emit(event: SupervisorEvent) -> None:
            runtime.emit(
                f"supervisor.{event.kind}",
                event.supervisor,
                {"child": event.child, "reason": event.reason},
            )

        supervisor = Supervisor(
            f"{node.name}/{reporter.child}",
            [ChildSpec(reporter.child, start, policy.restart)],
            "one_for_one",
            policy.intensity,
            policy.period,
            on_event=emit,
        )
        holder.append(supervisor)
        try:
            supervisor.start()
        except SupervisorStartFailed as exc:
            _log.warning("node %s: adopting %s failed: %s", node.name, process.address, exc)
            process.on_exit = None
            with suppress(AgentError):
                runtime.stop(process.address)
            return None
    node.hold_supervisor(process.address, supervisor, cluster=policy.cluster)
    with node._lock:
        node.orphans[name] = (reporter, supervisor)
    _log.warning(
        "node %s: adopted %s (%r): its supervisor's node %s is gone",
        node.name,
        process.address,
        reporter.child,
        reporter.home,
    )
    runtime.emit("agent.adopted", process.address, {"home": reporter.home, "by": supervisor.name})
    return supervisor


def reclaim(node: Node, names: list[str]) -> list[str]:
    """Ask the nodes holding ``names`` to hand back the children they adopted from this node
    (see ``Node.start_tree``); the addresses here of those handed back."""
    back = []
    for name in names:
        owner = node.whereis(name)
        where = None if owner is None else owner.partition(":")[0]
        if where is None or where == node.name:
            continue
        frame = Frame("migrate", node=node.name, name=name, extra={"op": "handback"})
        try:
            back.append(node.request(where, frame, _HANDBACK_TIMEOUT).to)
        except AgentError as exc:  # not ours to take back: the tree's start names the holder
            _log.warning("node %s: %r not handed back by %s: %s", node.name, name, where, exc)
    return back


def _hand_back(node: Node, frame: Frame) -> Frame:
    """Move the child adopted from ``frame.node`` back to it, live, and let go of it."""
    from mighty.cluster._migrate import MigrationFailed, migrate

    runtime = node.runtime
    with node._lock:
        found = node.orphans.get(frame.name)
    address = runtime.whereis(frame.name) if frame.name else None
    process = None if address is None else runtime.process(address)
    reporter = None if process is None else process.on_exit
    if (
        found is None
        and isinstance(reporter, Reporter)
        and reporter.policy.origin == frame.node
        and reporter.home != frame.node
    ):
        return _hand_back_moved(node, frame, reporter)
    if (
        found is None
        or found[0].home != frame.node
        or process is None
        or find_supervisor(node, process) != (found[1], frame.name)
    ):
        raise NoProc(f"node {node.name} holds no {frame.name!r} adopted from node {frame.node}")
    assert address is not None
    supervisor = found[1]
    if not node.wait_for([frame.node], 2 * node.config.dead_after + 5.0):
        raise NoProc(f"node {frame.node} is not live here yet")
    try:
        report = migrate(node, address, frame.node, handback=True)
    except MigrationFailed as exc:
        raise Refused(f"handing {frame.name!r} back failed: {exc.message}") from None
    with node._lock:
        node.orphans.pop(frame.name, None)
    supervisor.stop()  # its handle is the old process, halted: nothing else stops
    node.drop_supervisor(supervisor)
    _log.warning("node %s: handed %r back to node %s", node.name, frame.name, frame.node)
    return Frame("ok", node=node.name, to=report.new_address)


def _hand_back_moved(node: Node, frame: Frame, reporter: Reporter) -> Frame:
    """An adopted child moved on from the node that adopted it (its home now, which still
    supervises it) goes back to its first home: moved there live, then its supervisor lets go
    (op ``release``)."""
    from mighty.cluster._migrate import MigrationFailed, migrate

    address = node.runtime.whereis(frame.name)
    if address is None or not node.wait_for([frame.node], 2 * node.config.dead_after + 5.0):
        raise NoProc(f"node {frame.node} is not live here yet, or {frame.name!r} is gone")
    old = node.qualify(address)
    try:
        report = migrate(node, address, frame.node, handback=True)
    except MigrationFailed as exc:
        raise Refused(f"handing {frame.name!r} back failed: {exc.message}") from None
    release = Frame(
        "migrate",
        node=node.name,
        to=old,
        name=reporter.child,
        extra={"op": "release", "sup": reporter.supervisor},
    )
    try:
        node.request(reporter.home, release, _OP_TIMEOUT)
    except (AgentError, HostError) as exc:
        # It runs at home all the same; the old supervisor's handle points where nothing runs
        # (a restart it makes is refused the name the home holds).
        _log.warning(
            "node %s: %s did not release %r: %s", node.name, reporter.home, frame.name, exc
        )
    _log.warning("node %s: handed %r back to node %s", node.name, frame.name, frame.node)
    return Frame("ok", node=node.name, to=report.new_address)


def _release(node: Node, frame: Frame) -> Frame:
    """Op ``release``: this node's (adoptive) supervisor lets go of its moved child at
    ``frame.to``, handed back to its first home."""
    key = (str(frame.extra.get("sup")), frame.name)
    with node._lock:
        relocated = node.relocated.get(key)
        if relocated is None or relocated.handle.address != frame.to:
            raise NoProc(f"node {node.name} supervises no moved child {frame.name!r} at {frame.to}")
        del node.relocated[key]
        for name, (_, held) in list(node.orphans.items()):
            if held is relocated.supervisor:
                del node.orphans[name]
    node.drop_supervisor(relocated.supervisor)  # its handle is never reported to again
    return Frame("ok", node=node.name)


def _give_back(node: Node, home: str) -> None:
    """``home`` is heard again: the children adopted from it that its supervisor still holds
    (it was cut off, not dead: op ``moved`` to the address they have) report to it again."""
    runtime = node.runtime
    with node._lock:
        mine = [(n, r, s) for n, (r, s) in node.orphans.items() if r.home == home]
    for name, reporter, adoptive in mine:
        address = runtime.whereis(name)
        if address is None:
            continue
        here = node.qualify(address)
        try:
            _tell_moved(node, home, reporter.supervisor, reporter.child, here, here)
        except (AgentError, HostError):
            continue  # a new process under that name (or none): the child stays adopted
        with _ADOPT:
            try:
                process = runtime.process(address)
            except NoProc:
                continue
            found = find_supervisor(node, process)
            # One being restarted stays adopted: its adoptive supervisor is at it.
            if not process.alive or found is None or found[0] is not adoptive:
                continue
            process.on_exit = reporter
            with node._lock:
                node.orphans.pop(name, None)
        node.drop_supervisor(adoptive)  # its handle is never reported to again
        _log.warning("node %s: %r reports to node %s again", node.name, name, home)


def _adopted(process: Any, home: str) -> None:
    """Refuse an op of ``home`` on ``process``, a child it no longer supervises."""
    reporter = process.on_exit
    if not isinstance(reporter, Reporter) or reporter.home != home:
        raise Refused(f"{process.address} is not supervised by node {home} (adopted here)")


def moved_op(node: Node, frame: Frame, op: str) -> Frame:
    """The ops of moved supervised agents: exited and moved (at home), restart and halt (on
    the node it runs on)."""
    from mighty.cluster._migrate import type_for

    runtime = node.runtime
    if op == "handback":
        return _hand_back(node, frame)
    if op == "release":
        return _release(node, frame)
    if op in ("exited", "moved"):
        supervisor = frame.extra.get("sup")
        with node._lock:
            relocated = node.relocated.get((str(supervisor), frame.name))
        expected = frame.to if op == "exited" else frame.extra.get("from")
        if relocated is None or relocated.handle.address != expected:
            raise NoProc(f"node {node.name} supervises no moved child {frame.name!r} at {expected}")
        if op == "moved":
            where = frame.to.partition(":")[0]
            if frame.to.count(":") != 2 or where not in node.config.peers:
                raise BadSpawn(f"moved: a bad address {frame.to!r}")
            relocated.handle.address = frame.to
            relocated.target = where
            return Frame("ok", node=node.name)
        relocated.supervisor.child_exited(
            frame.name,
            crashed=frame.extra.get("crashed") is not False,
            reason=f"{frame.to}: {frame.extra.get('reason', '')}",
            handle=relocated.handle,
        )
        return Frame("ok", node=node.name)
    if op == "halt":
        process = runtime.process(node.localize(frame.to))
        _adopted(process, frame.node)
        process.halt(timeout=_OP_TIMEOUT)
        return Frame("ok", node=node.name)
    # restart
    supervisor = frame.extra.get("sup")
    init = frame.extra.get("init", b"")
    if not frame.name or not isinstance(supervisor, str) or not isinstance(init, bytes):
        raise BadSpawn("restart takes a name, {sup: str, init: bytes}")
    policy = Policy.from_wire(frame.extra.get("policy", {}))
    address = runtime.whereis(frame.name)
    if address is not None:
        process = runtime.process(address)
        with _ADOPT:
            _adopted(process, frame.node)
            if not process.alive:
                process.revive()
        return Frame("ok", node=node.name, to=node.qualify(address))
    agent_type = type_for(node, frame)
    process = runtime.spawn_process(
        frame.type,
        init,
        name=frame.name,
        on_exit=Reporter(node, frame.node, supervisor, frame.name, policy),
        agent_type=agent_type,
    )
    return Frame("ok", node=node.name, to=node.qualify(process.address))
