"""Live migration: move one running agent, its state and its queued mailbox, to another node.

``node.migrate("counter:1", "b")``, in order:

1. pause the agent's mailbox (it keeps accepting; nothing is taken out) and wait for the
   message being handled, up to the drain deadline;
2. snapshot its state (the hot-swap ``snapshot`` export);
3. ship it: node b, which prepared a fresh instance of the same component before the pause
   (same sha256; shipping a missing component is not done: b must have the type), restores
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

Senders keep the address they had. Order is kept per sender. Supervised agents are refused (their
supervisor holds the old process; moving them is not done yet).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mighty._errors import HostError, MightyError
from mighty.abi import Err
from mighty.agents import AgentError, AskTimeout, BadSpawn, Envelope, NoProc
from mighty.cluster._frames import Frame, decode, encode

if TYPE_CHECKING:
    from nats.aio.msg import Msg

    from mighty.cluster._node import Node

__all__ = ["MigrationFailed", "MigrationReport", "accept_migration", "forward_frame", "migrate"]

_log = logging.getLogger(__name__)
_ROUNDS = 3
_GRACE = 0.005
_FORWARDED_ASK_TIMEOUT = 60.0


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
    node: Node, address: str, target: str, *, drain_timeout: float = 5.0
) -> MigrationReport:
    """Move the local agent at ``address`` to node ``target`` (see the module docstring)."""
    runtime = node.runtime
    local, process = _check(node, address, target)
    # Instantiating on the target takes long for a big component: done before the pause.
    prepared = _prepare(node, process, target)
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
            extra={"from": node.qualify(local)},
        )
        try:
            new_address = node.request(target, frame, 30.0).to
        except AgentError as exc:
            raise MigrationFailed(f"{target} did not take {local}: {exc.message}") from None
        if new_address.count(":") != 2 or not new_address.startswith(f"{target}:"):
            raise MigrationFailed(f"{target} answered with a bad address {new_address!r}")
    except BaseException:
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
    if process.on_exit is not None:
        raise MigrationFailed(f"{local} is supervised; moving supervised agents is not supported")
    return local, process


def _prepare(node: Node, process: Any, target: str) -> str:
    """A fresh, paused instance of the agent's component on ``target``: its address."""
    prepare = Frame(
        "migrate",
        node=node.name,
        type=process.type.name,
        extra={"sha": process.type.component.sha256, "init": process.init},
    )
    try:
        return node.request(target, prepare, 60.0).to
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
    if not frame.to:
        agent_type = runtime.agent_type(frame.type)
        sha, init = frame.extra.get("sha"), frame.extra.get("init", b"")
        if sha != agent_type.component.sha256:
            raise BadSpawn(
                f"node {node.name} runs another component for {frame.type!r} "
                f"({agent_type.component.sha256[:12]}, not {str(sha)[:12]}); "
                "shipping components is not supported"
            )
        if not isinstance(init, bytes):
            raise BadSpawn("migrate: init is not bytes")
        process = runtime.spawn_process(frame.type, init)
        process.mailbox.pause()  # nobody knows the address yet; nothing runs before restore
        return Frame("ok", node=node.name, to=node.qualify(process.address))
    process = runtime.process(node.localize(frame.to))
    try:
        with process.turn_lock:
            instance = process.instance
            if instance is None:
                raise BadSpawn(f"{process.address} stopped as it started")
            try:
                outcome = instance.call("restore", frame.body)
            except MightyError as exc:
                raise BadSpawn(f"restore failed: {exc.message}") from None
            if isinstance(outcome, Err):
                raise BadSpawn(f"restore refused: {outcome.value}")
        if frame.name:
            previous = frame.extra.get("from")
            if isinstance(previous, str):
                node.expect_takeover(frame.name, previous)
            runtime.register_name(frame.name, process.address)
    except BaseException:
        runtime.stop(process.address)
        raise
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
        answer = await nc.request(f"{node.prefix}.node.{target}", encode(onward), timeout=timeout)
        reply = decode(answer.data, max_frame=node.config.max_frame)
    except AgentError as exc:
        reply = Frame(
            "err", node=node.name, code=exc.code, type=type(exc).__name__, msg=exc.message
        )
    except Exception as exc:  # noqa: BLE001 -- NATS and frame errors all end as a timeout
        error = AskTimeout(f"no reply from {new_address} (forwarded): {exc}")
        reply = Frame("err", node=node.name, code=error.code, type="AskTimeout", msg=error.message)
    await node._respond(msg, replace(reply, extra={**reply.extra, "moved": new_address}))
