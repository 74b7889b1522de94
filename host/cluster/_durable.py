"""At-least-once delivery over JetStream, handled exactly once, for the agent types that opt in.

``[cluster] durable = ["ledger"]``: a ``send`` by cluster-wide name to an agent of a durable
type is published to the JetStream stream ``<cluster>_durable`` (subject
``<cluster>.dur.<name>``) with a message id (``Nats-Msg-Id``: JetStream drops a re-published
duplicate within its window); ``send`` returns once JetStream has stored it, whether or not the
agent's node is up.

The node holding the name consumes its subject through a durable consumer, one message at a
time: the message is handled, the agent's state is snapshotted (the hot-swap ``snapshot``
export) and stored with the stream sequence in the KV bucket ``<cluster>_state``, and only then
is the message acknowledged. A node that dies leaves its last messages unacknowledged; the agent
restarts elsewhere (cluster supervisor), restores the stored state, and the consumer redelivers:
a message whose id is among the ids stored with the state (the last 1024 handled; at most 16
are ever unacknowledged) is acknowledged without handling. So each accepted message changes the
state exactly once. (Redeliveries may come after newer messages, so a sequence watermark would
not do.) A message the agent crashes on counts as handled (as locally: a crash loses the
message being handled); the state before it is restored.

Not covered: sends from the agent's own node (they are local, in memory), sends by address,
and asks (request/reply has no persistence; an ask is at most once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import cbor2
import nats.errors
import nats.js.errors
from nats.js.api import ConsumerConfig, StorageType, StreamConfig

from mighty._errors import MightyError
from mighty.abi import Err
from mighty.agents import AgentError, AgentProcess, NoProc
from mighty.cluster._frames import Frame, FrameError, decode, encode

if TYPE_CHECKING:
    from mighty.cluster._node import Node

__all__ = ["Durable"]

_log = logging.getLogger(__name__)
_FETCH = 16
_IDS_KEPT = 1024
_HANDLE_TIMEOUT = 60.0


class Durable:
    """The durable streams of one node: publishing, and one consumer per durable agent here."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.types = frozenset(node.config.durable)
        self.stream = f"{node.prefix}_durable"
        self.handled = 0
        self.skipped = 0
        """Redelivered messages already reflected in the stored state (not handled again)."""
        self._js: Any = None
        self._state: Any = None
        self._consumers: dict[str, _Consumer] = {}
        self._lock = threading.Lock()

    async def setup(self, nc: Any) -> None:
        js = nc.jetstream()
        config = StreamConfig(
            name=self.stream,
            subjects=[f"{self.node.prefix}.dur.>"],
            storage=StorageType.FILE,
            duplicate_window=120.0,
        )
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await js.update_stream(config)
        self._js = js
        self._state = await self.node._bucket(js, f"{self.node.prefix}_state", None)

    def subject(self, name: str) -> str:
        return f"{self.node.prefix}.dur.{name}"

    def publish(self, name: str, message: str, body: bytes, *, sender: str, timeout: float) -> None:
        """Store one message for ``name`` in JetStream; returns when it is stored."""
        node = self.node
        msg_id = f"{node.name}-{node.started_at:.6f}-{next(node._ids)}"
        data = encode(
            Frame(
                "send", node=node.name, to=name, sender=sender, name=message, body=body, id=msg_id
            )
        )
        if len(data) > node.config.max_frame:
            from mighty.agents import Refused

            raise Refused(f"{name}: a message of {len(data)} bytes exceeds the frame limit")
        headers = {"Nats-Msg-Id": msg_id}
        try:
            node._call(
                self._js.publish(self.subject(name), data, timeout=timeout, headers=headers),
                timeout + 1,
            )
        except (nats.errors.Error, TimeoutError) as exc:
            from mighty.agents import AskTimeout

            raise AskTimeout(f"JetStream did not store the message for {name}: {exc}") from None

    def attach(self, name: str, address: str) -> None:
        """Start consuming ``name``'s durable messages for the local agent at ``address``."""
        with self._lock:
            if name in self._consumers:
                return
            consumer = _Consumer(self, name, address)
            self._consumers[name] = consumer
        consumer.start()

    def detach(self, name: str) -> None:
        with self._lock:
            consumer = self._consumers.pop(name, None)
        if consumer is not None:
            consumer.stopped.set()

    def close(self) -> None:
        with self._lock:
            consumers = list(self._consumers.values())
            self._consumers.clear()
        for consumer in consumers:
            consumer.stopped.set()
        for consumer in consumers:
            consumer.join(5)


class _Consumer(threading.Thread):
    """Handles ``name``'s durable messages one by one: handle, snapshot, store, acknowledge."""

    def __init__(self, durable: Durable, name: str, address: str) -> None:
        super().__init__(name=f"durable-{name}", daemon=True)
        self.durable = durable
        self.node = durable.node
        self.name_ = name
        self.address = address
        self.stopped = threading.Event()
        self.done: deque[str] = deque(maxlen=_IDS_KEPT)
        self._done: set[str] = set()
        self._snapshot: bytes | None = None

    def run(self) -> None:
        try:
            self._run()
        except Exception:  # noqa: BLE001 -- a consumer thread must not die silently
            _log.exception("durable consumer of %s failed", self.name_)

    def _process(self) -> AgentProcess | None:
        deadline = time.monotonic() + 30
        while not self.stopped.is_set() and time.monotonic() < deadline:
            try:
                process = self.node.runtime.process(self.address)
            except NoProc:
                return None
            if process.alive and process.instance is not None:
                return process
            time.sleep(0.01)
        return None

    def _run(self) -> None:
        node, durable = self.node, self.durable
        config = ConsumerConfig(ack_wait=node.config.dead_after + 1.0, max_ack_pending=_FETCH)
        sub = node._call(
            durable._js.pull_subscribe(
                durable.subject(self.name_),
                durable=f"dur_{self.name_}",
                stream=durable.stream,
                config=config,
            ),
            10,
        )
        process = self._process()
        if process is None:
            return
        self._restore_stored(process)
        while not self.stopped.is_set():
            try:
                messages = node._call(sub.fetch(_FETCH, timeout=0.5), 5)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            except (nats.errors.Error, MightyError) as exc:
                _log.warning("durable %s: fetch failed: %s", self.name_, exc)
                time.sleep(0.2)
                continue
            for message in messages:
                if self.stopped.is_set():
                    return
                if not self._one(message):
                    return

    def _restore_stored(self, process: AgentProcess) -> None:
        try:
            entry = self.node._call(self.durable._state.get(self.name_), 10)
        except nats.js.errors.KeyNotFoundError:
            return
        try:
            state = cbor2.loads(entry.value)
        except Exception:  # noqa: BLE001 -- cbor2 raises many kinds on garbage
            state = None
        ids = state.get("ids") if isinstance(state, dict) else None
        snapshot = state.get("snapshot") if isinstance(state, dict) else None
        if not isinstance(snapshot, bytes) or not isinstance(ids, list):
            _log.warning("durable %s: unreadable stored state; starting from init", self.name_)
            return
        self._restore(process, snapshot)
        for done in ids[-_IDS_KEPT:]:
            if isinstance(done, str):
                self._remember(done)
        self._snapshot = snapshot

    def _remember(self, done: str) -> None:
        if len(self.done) == self.done.maxlen:
            self._done.discard(self.done[0])
        self.done.append(done)
        self._done.add(done)

    def _restore(self, process: AgentProcess, snapshot: bytes) -> None:
        with process.turn_lock:
            instance = process.instance
            if instance is None:
                raise NoProc(f"{self.address} stopped")
            outcome = instance.call("restore", snapshot)
        if isinstance(outcome, Err):
            raise NoProc(f"{self.address} refused its stored state: {outcome.value}")

    def _one(self, message: Any) -> bool:
        """Handle one delivery; False when the agent is gone (left unacknowledged)."""
        node, durable = self.node, self.durable
        try:
            frame = decode(message.data, max_frame=node.config.max_frame)
        except FrameError as exc:
            node._drop(exc.reason, f"a durable message for {self.name_}: {exc.message}")
            node._call(message.ack(), 10)
            return True
        msg_id = frame.id or f"seq-{message.metadata.sequence.stream}"
        if msg_id in self._done:
            durable.skipped += 1
            node._call(message.ack(), 10)
            return True
        runtime = node.runtime
        try:
            future, _ = runtime.deliver_ask(
                self.address, frame.name, frame.body, sender=frame.sender, timeout=_HANDLE_TIMEOUT
            )
        except NoProc:
            return False
        except AgentError as exc:
            _log.warning("durable %s: %s not delivered: %s", self.name_, frame.id, exc.message)
            return True  # mailbox full for a minute: left unacknowledged, redelivered later
        crashed = False
        try:
            future.result(_HANDLE_TIMEOUT)
        except AgentError as exc:
            crashed = "crashed" in exc.message
        process = self._process()
        if process is None:
            return False
        if crashed and self._snapshot is not None:
            self._restore(process, self._snapshot)  # the state before the message it crashed on
        with process.turn_lock:
            instance = process.instance
            if instance is None:
                return False
            snapshot = bytes(instance.call("snapshot"))
        self._remember(msg_id)
        state = cbor2.dumps({"ids": list(self.done), "snapshot": snapshot})
        node._call(durable._state.put(self.name_, state), 10)
        self._snapshot = snapshot
        durable.handled += 1
        node._call(message.ack(), 10)
        return True
