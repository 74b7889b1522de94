"""Live migration: move one running agent, its state and its queued mailbox, to another node.

``node.migrate("counter:1", "b")``, in order:

1. pause the agent's mailbox (it keeps accepting; nothing is taken out) and wait for the
   message being handled, up to the drain deadline;
2. snapshot its state (the hot-swap ``snapshot`` export);
3. ship it: node b, which prepared a fresh instance of the same component before the pause
   (same sha256: a node without it pulls it from a first, see ``type_for``), restores
   the snapshot into it and answers with the new address. Up to here any failure (a drain past its
   deadline, an unknown node, a refused restore, no answer) resumes the agent where it was,
   with its state and mailbox untouched: the old instance was only read;
4. move the queue: the queued messages are forwarded in order to the new address (sends wait
   for b's acknowledgement, so order holds; a queued ask's reply comes back to its asker), and
   so is what keeps arriving meanwhile (a few rounds);
5. switch: new sends to the old address wait until the rest of the old queue is forwarded
   (so none overtakes what its sender queued before); the cluster-wide name (if any) moves
   to the new address, the old address becomes a forward on this node (local senders are
   redirected; a frame from another node is forwarded and its reply tells the sender's node
   the new address, which it uses from then on), and the old instance is closed.

Senders keep the address they had. Order is kept per sender. A supervised agent moves with its
child spec: it becomes a remote child of its supervisor, and may move on from there (see
_moved). A target without the
agent's component pulls it from this node first (``type_for``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mighty._errors import HostError, MightyError
from mighty.abi import Err
from mighty.agents import AgentError, AgentType, AskTimeout, BadSpawn, NoProc
from mighty.agents.hosting import Envelope
from mighty.cluster._frames import Frame, encode, node_subject
from mighty.cluster._moved import (
    Policy,
    Reporter,
    follow,
    moved_op,
    relocate,
    supervised_extra,
    unfollow,
)
from mighty.engine import Component, ComponentStore, check_lowering
from mighty.trace import migration_link

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from mighty.cluster._node import Node

__all__ = ["MigrationFailed", "MigrationReport", "accept_migration", "forward_frame", "migrate"]

_log = logging.getLogger(__name__)
_SHA = re.compile(r"^[0-9a-f]{64}$")
_SHIPPING = threading.Lock()
_LOADED: dict[str, Component] = {}
"""Components shipped to (or found for) this process, by sha256 (the latest few)."""
_LOADED_MAX = 8
_ROUNDS = 3
_GRACE = 0.005
_FORWARDED_ASK_TIMEOUT = 60.0
_PREPARE_TIMEOUT = 300.0
"""Preparing may ship and compile a component; the agent keeps running meanwhile."""
_CHUNK = 256 << 10
_CHUNK_TIMEOUT = 30.0


class MigrationFailed(HostError):
    """The migration did not happen; the agent runs where it was, state and mailbox intact."""

    kind = "migration_failed"


@dataclass
class MigrationReport:
    address: str
    new_address: str
    pause: float
    """Seconds the agent handled nothing: from the pause to the restore on the target."""
    total: float
    moved: int
    """Queued messages forwarded to the new address."""

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.new_address,
            "old_address": self.address,
            "pause_ms": round(self.pause * 1e3, 3),
            "total_ms": round(self.total * 1e3, 3),
            "moved": self.moved,
        }


def migrate(
    node: Node, address: str, target: str, *, drain_timeout: float = 5.0, handback: bool = False
) -> MigrationReport:
    """Move the local agent at ``address`` to node ``target`` (see the module docstring).

    ``handback``: an adopted child goes back to its home, unsupervised and held there until
    the home's tree takes it (see _moved)."""
    runtime = node.runtime
    local, process = _check(node, address, target)
    supervised = None if handback else supervised_extra(node, process)
    # Instantiating on the target takes long for a big component: done before the pause.
    prepared = _prepare(node, process, target, supervised)
    started = time.monotonic()
    process.mailbox.pause()
    locked = False
    try:
        if not process.turn_lock.acquire(timeout=drain_timeout):
            raise MigrationFailed(
                f"{local} was still handling a message after the {drain_timeout:g} s drain deadline"
            )
        locked = True
        instance = process.instance
        if instance is None or not process.alive:
            raise MigrationFailed(f"{local} stopped before it could move")
        try:
            snapshot = bytes(instance.call("snapshot"))
        except MightyError as exc:
            raise MigrationFailed(f"{local}: snapshot failed: {exc.message}") from None
        frame = Frame(
            "migrate",
            node=node.name,
            type=process.type.name,
            body=snapshot,
            name=process.name or "",
            to=prepared.partition(":")[2],
            extra={"from": node.qualify(local), **({"hold": True} if handback else {})},
        )
        if process.name is not None:
            node.handing_off(process.name, target)  # its claim there is not a takeover
        try:
            new_address = node.request(target, frame, 30.0).to
        except AgentError as exc:
            raise MigrationFailed(f"{target} did not take {local}: {exc.message}") from None
        if new_address.count(":") != 2 or not new_address.startswith(f"{target}:"):
            raise MigrationFailed(f"{target} answered with a bad address {new_address!r}")
    except BaseException:
        if process.name is not None:
            node.handing_off(process.name, None)
        if supervised is not None and locked:
            unfollow(node, supervised, prepared, node.qualify(local))
        if locked:
            process.turn_lock.release()
        process.mailbox.resume()
        process.wake()
        try:
            node.stop_on(prepared)
        except AgentError as exc:
            _log.warning("migration: stopping the prepared %s: %s", prepared, exc.message)
        raise
    # Committed: the agent lives on the target now; the old instance only waits to be closed.
    pause = time.monotonic() - started
    _link(runtime, local, node.name, node.qualify(local), new_address, snapshot)
    if supervised is not None:
        relocate(node, process, supervised, new_address)
    process.turn_lock.release()  # still paused: no worker takes a message from it
    moved = _move_queue(node, process, new_address)
    moved += _switch(node, process, local, new_address)
    runtime.emit("agent.migrated", local, {"to": new_address, "moved": moved})
    return MigrationReport(
        node.qualify(local), new_address, pause, time.monotonic() - started, moved
    )


def _switch(node: Node, process: Any, local: str, new_address: str) -> int:
    """Redirect the old address; forward what is left of the old queue; close the old one."""
    moved = 0
    # The switch: new sends to the old address wait (briefly) until the rest of the old queue
    # is forwarded, so that none overtakes a message its sender queued before.
    ready = node.moving(local, new_address)
    try:
        if process.name is not None:
            node.takeover_done(process.name, new_address)
        node.runtime.detach(local)
        moved += _forward_all(node, process.mailbox.drain(), new_address)
        time.sleep(_GRACE)  # a sender that found the process just before the detach
        process.mailbox.close()
        moved += _forward_all(node, process.mailbox.drain(), new_address)
    finally:
        ready.set()
    process.halt(timeout=1.0)
    return moved


def _check(node: Node, address: str, target: str) -> tuple[str, Any]:
    """(the local address, the process) of a migration that may start, or MigrationFailed."""
    runtime = node.runtime
    local = node.localize(address)
    if local.count(":") == 0:
        local = runtime.whereis(local) or local
    if local.count(":") != 1:
        raise MigrationFailed(f"{address} is not an agent on node {node.name}")
    if target == node.name:
        raise MigrationFailed(f"{address} is already on node {target}")
    if target not in node.config.peers:
        raise MigrationFailed(f"no node {target!r} in this cluster")
    if target not in node.live_nodes():
        raise MigrationFailed(f"node {target} is not live")
    try:
        process = runtime.process(local)
    except NoProc:
        raise MigrationFailed(f"no agent at {address!r} on node {node.name}") from None
    return local, process


def _prepare(node: Node, process: Any, target: str, supervised: dict[str, Any] | None) -> str:
    """A fresh, paused instance of the agent's component on ``target``: its address.

    A target without the component pulls it from this node first (see ``_shipped``).
    """
    component = process.type.component
    prepare = Frame(
        "migrate",
        node=node.name,
        type=process.type.name,
        extra={
            "sha": component.sha256,
            "size": component.size,
            "init": process.init,
            **({} if supervised is None else {"sup": supervised}),
        },
    )
    try:
        return node.request(target, prepare, _PREPARE_TIMEOUT).to
    except AgentError as exc:
        raise MigrationFailed(f"{target} did not take {process.address}: {exc.message}") from None


def _move_queue(node: Node, process: Any, new_address: str) -> int:
    """Forward the queue in order, and what arrives meanwhile, for a few rounds at most (under
    a steady stream the queue never stays empty; the switch forwards the rest)."""
    moved = 0
    for _ in range(_ROUNDS):
        items = process.mailbox.drain()
        if not items:
            break
        moved += _forward_all(node, items, new_address)
    return moved


def _forward_all(node: Node, envelopes: list[Envelope], new_address: str) -> int:
    for envelope in envelopes:
        _forward(node, envelope, new_address)
    return len(envelopes)


def _forward(node: Node, envelope: Envelope, new_address: str) -> None:
    reply = envelope.reply
    try:
        if reply is None:
            node.send(
                new_address, envelope.name, envelope.body, sender=envelope.sender, timeout=10.0
            )
            return
        future = node.ask(
            new_address,
            envelope.name,
            envelope.body,
            sender=envelope.sender,
            timeout=_FORWARDED_ASK_TIMEOUT,
            chain=envelope.asker_chain,
        )
    except AgentError as exc:
        _log.warning("migration: forwarding %r to %s failed: %s", envelope.name, new_address, exc)
        if reply is not None and not reply.done():
            reply.set_exception(exc)
        return

    def settle(done: Future[bytes | None], reply: Future[bytes | None] = reply) -> None:
        if reply.done():
            return
        error = done.exception()
        if error is not None:
            reply.set_exception(error)
        else:
            reply.set_result(done.result())

    future.add_done_callback(settle)


def accept_migration(node: Node, frame: Frame) -> Frame:
    """The target's side. Without ``to``: prepare a fresh instance of the same component (before
    the source pauses). With ``to``: restore that prepared agent from the snapshot, take the name.
    """
    runtime = node.runtime
    op = frame.extra.get("op")
    if op == "component":
        return serve_component(node, frame)
    if op in ("exited", "moved", "restart", "halt", "handback", "release"):
        return moved_op(node, frame, op)
    if op is not None:
        raise BadSpawn(f"migrate: unknown op {str(op)[:32]!r}")
    if not frame.to:
        init = frame.extra.get("init", b"")
        if not isinstance(init, bytes):
            raise BadSpawn("migrate: init is not bytes")
        agent_type = type_for(node, frame)
        process = runtime.spawn_process(
            frame.type, init, agent_type=agent_type, on_exit=_reporter(node, frame)
        )
        process.mailbox.pause()  # nobody knows the address yet; nothing runs before restore
        return Frame("ok", node=node.name, to=node.qualify(process.address))
    process = runtime.process(node.localize(frame.to))
    try:
        with process.turn_lock:
            instance = process.instance
            if instance is None:
                raise BadSpawn(f"{process.address} stopped as it started")
            try:
                check_lowering(len(frame.body), instance.budget.memory, "restore")
                outcome = instance.call("restore", frame.body)
            except MightyError as exc:
                raise BadSpawn(f"restore failed: {exc.message}") from None
            if isinstance(outcome, Err):
                raise BadSpawn(f"restore refused: {outcome.value}")
        previous = frame.extra.get("from")
        reporter = process.on_exit
        if isinstance(reporter, Reporter) and reporter.home != frame.node:
            if not isinstance(previous, str):
                raise BadSpawn("migrate: a remote child moving on needs its old address")
            follow(node, process, previous)  # before it takes a message: see _moved
        if frame.name:
            if isinstance(previous, str):
                node.expect_takeover(frame.name, previous)
            runtime.register_name(frame.name, process.address)
    except BaseException:
        runtime.stop(process.address)
        raise
    if isinstance(previous, str):
        here = node.qualify(process.address)
        _link(runtime, process.address, node.name, previous, here, frame.body)
    if frame.extra.get("hold") is True:
        node.hold(process)  # handed back: runs once its home's tree took it
    else:
        process.mailbox.resume()
        process.wake()
    return Frame("ok", node=node.name, to=node.qualify(process.address))


async def forward_frame(
    node: Node, msg: Msg, frame: Frame, new_address: str, ready: threading.Event | None = None
) -> None:
    """A frame for a moved agent, passed on to its new node; the reply names the new address.

    While the rest of the old queue is being forwarded (``ready`` not set), it waits.
    """
    deadline = time.monotonic() + 30
    while ready is not None and not ready.is_set() and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    nc = node._nc
    target, _, local = new_address.partition(":")
    timeout = frame.ttl / 1000 if frame.ttl else node.config.ask_timeout
    onward = replace(frame, node=node.name, to=local)
    try:
        if nc is None:
            raise NoProc(f"node {node.name} has left the cluster")
        answer = await nc.request(
            node_subject(node.prefix, target, node.name), encode(onward), timeout=timeout
        )
        reply = await node.decoded(answer.data, node.config.max_frame)
    except AgentError as exc:
        reply = Frame(
            "err", node=node.name, code=exc.code, type=type(exc).__name__, msg=exc.message
        )
    except Exception as exc:  # noqa: BLE001 -- NATS and frame errors all end as a timeout
        error = AskTimeout(f"no reply from {new_address} (forwarded): {exc}")
        reply = Frame("err", node=node.name, code=error.code, type="AskTimeout", msg=error.message)
    await node._respond(msg, replace(reply, extra={**reply.extra, "moved": new_address}))


# -- shipping a component -------------------------------------------------------------------


def type_for(node: Node, frame: Frame) -> AgentType:
    """The agent type a migrating agent runs as here: this node's type of that name (or, when
    it has none, the default settings: no grants), with the agent's own component."""
    runtime = node.runtime
    sha = frame.extra.get("sha")
    if not isinstance(sha, str) or not _SHA.match(sha):
        raise BadSpawn("migrate: sha is not a sha256 hex digest")
    try:
        known: AgentType | None = runtime.agent_type(frame.type)
    except BadSpawn:
        known = None
    if known is not None and known.component.sha256 == sha:
        return known
    component = _shipped(node, frame, sha)
    if known is not None:
        return replace(known, component=component)
    try:
        return AgentType(frame.type, component)
    except ValueError as exc:
        raise BadSpawn(f"migrate: {exc}") from None


def _shipped(node: Node, frame: Frame, sha: str) -> Component:
    """The component ``sha``: from this node's component store, else pulled from the node that
    asks for the migration, in chunks (each a request within NATS's max_payload), bounded by
    ``max_component``, its sha256 checked before it is compiled and kept."""
    with _SHIPPING:
        cached = _LOADED.get(sha)
    if cached is not None:
        return cached
    found: Path | bytes | None = ComponentStore().find(sha)
    if found is None:
        found = _pull(node, frame.node, sha, frame.extra.get("size"))
    try:
        component = Component.load(found)
    except MightyError as exc:
        raise BadSpawn(f"the component {sha[:12]} does not load here: {exc.message}") from None
    if component.sha256 != sha:  # the store's file changed under us
        raise BadSpawn(f"the component for {sha[:12]} hashes to {component.sha256[:12]}")
    with _SHIPPING:
        if len(_LOADED) >= _LOADED_MAX:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[sha] = component
    return component


def _pull(node: Node, source: str, sha: str, size: Any) -> Path | bytes:
    config = node.config
    peer = config.peers.get(source)
    if peer is None or not peer.components:
        raise BadSpawn(f"node {node.name} takes no component from node {source}")
    if type(size) is not int or size <= 0:
        raise BadSpawn("migrate: the component's size is not a positive int")
    if size > config.max_component:
        raise BadSpawn(
            f"the component of {size} bytes exceeds node {node.name}'s "
            f"max_component ({config.max_component} bytes)"
        )
    chunk = max(1024, min(_CHUNK, config.max_frame - 4096, node.max_payload() - 4096))
    data = bytearray()
    started = time.monotonic()
    deadline = started + _PREPARE_TIMEOUT
    while len(data) < size:
        if time.monotonic() > deadline:
            raise BadSpawn(f"shipping {sha[:12]} from {source} took over {_PREPARE_TIMEOUT:g} s")
        want = min(chunk, size - len(data))
        ask = Frame(
            "migrate",
            node=node.name,
            extra={"op": "component", "sha": sha, "offset": len(data), "n": want},
        )
        try:
            piece = node.request(source, ask, _CHUNK_TIMEOUT).body
        except AgentError as exc:
            raise BadSpawn(f"shipping {sha[:12]} from {source} failed: {exc.message}") from None
        if not piece or len(piece) > want:
            raise BadSpawn(f"node {source} sent a bad chunk of {sha[:12]} at {len(data)}")
        data += piece
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha:
        raise BadSpawn(
            f"the component shipped from {source} hashes to {digest[:12]}, not {sha[:12]}"
        )
    _log.info(
        "node %s: shipped %s (%d bytes) from %s in %.2f s",
        node.name,
        sha[:12],
        size,
        source,
        time.monotonic() - started,
    )
    kept = ComponentStore().keep(sha, bytes(data))
    return kept if kept is not None else bytes(data)


def serve_component(node: Node, frame: Frame) -> Frame:
    """The source's side: one chunk of a component one of this node's agents runs."""
    sha, offset, n = frame.extra.get("sha"), frame.extra.get("offset"), frame.extra.get("n")
    if not isinstance(sha, str) or type(offset) is not int or type(n) is not int:
        raise BadSpawn("component: takes {sha: str, offset: int, n: int}")
    if offset < 0 or not 0 < n <= _CHUNK:
        raise BadSpawn(f"component: a chunk is 1..{_CHUNK} bytes at an offset >= 0")
    component = _served(node, sha)
    if component is None:
        raise BadSpawn(f"node {node.name} runs no component {sha[:12]}")
    path = _source_file(component)
    if path is None:
        raise BadSpawn(f"node {node.name} no longer has the bytes of {sha[:12]}")
    with path.open("rb") as f:
        f.seek(offset)
        piece = f.read(n)
    return Frame("ok", node=node.name, body=piece)


def _served(node: Node, sha: str) -> Component | None:
    """A component of this node's types or agents (only those are shipped), by sha256."""
    runtime = node.runtime
    for process in runtime.agents():
        if process.type.component.sha256 == sha:
            return process.type.component
    for process in runtime.retired():
        if process.type.component.sha256 == sha:
            return process.type.component
    return None


def _source_file(component: Component) -> Path | None:
    """A file holding exactly the component's bytes: the store's copy, else where it came from."""
    candidates = [ComponentStore().path_for(component.sha256)]
    if not component.origin.startswith("<"):
        candidates.append(Path(component.origin))
    for path in candidates:
        try:
            if path.stat().st_size == component.size:
                return path
        except OSError:
            continue
    return None


def _link(runtime: Any, local: str, node: str, source: str, target: str, state: bytes) -> None:
    """The link record joining the agent's traces on both nodes (mighty.trace.replay_across)."""
    recorder = runtime.recorder
    if recorder is None:
        return
    try:
        recorder.append(
            migration_link(local=local, node=node, source=source, target=target, state=state)
        )
    except MightyError as exc:  # a full disk: the migration itself is done
        _log.warning("migration: recording the link of %s failed: %s", local, exc.message)


def _reporter(node: Node, frame: Frame) -> Reporter | None:
    """A supervised agent moving in reports its crashes to its supervisor's node."""
    sup = frame.extra.get("sup")
    if sup is None:
        return None
    if not isinstance(sup, dict) or not all(
        isinstance(sup.get(k), str) for k in ("home", "sup", "child")
    ):
        raise BadSpawn("migrate: sup takes {home, sup, child: str}")
    if sup["home"] not in node.config.peers:
        raise BadSpawn(f"migrate: its supervisor's node {sup['home'][:64]!r} is no peer")
    return Reporter(node, sup["home"], sup["sup"], sup["child"], Policy.from_wire(sup))
