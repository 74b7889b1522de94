"""At-least-once delivery over JetStream, handled exactly once, for the agent types that opt in.

``[cluster] durable = ["ledger"]``: a ``send`` by cluster-wide name to an agent of a durable
type is published to the JetStream stream ``<cluster>_durable`` (subject
``<cluster>.dur.<name>``) with a message id (``Nats-Msg-Id``: JetStream drops a re-published
duplicate within its window); ``send`` returns once JetStream has stored it, whether or not the
agent's node is up.

The node holding the name consumes its subject through a durable consumer, in batches of up to
16: the batch's messages are handled (in order), the agent's state is snapshotted (the hot-swap
``snapshot`` export) and stored with the handled message ids in the KV bucket
``<cluster>_state``, and only then are they acknowledged. A node that dies leaves its last
messages unacknowledged; the agent restarts elsewhere (cluster supervisor), restores the stored
state, and the consumer redelivers: a message whose id is among the ids stored with the state
(the last 1024 handled; at most 16 are ever unacknowledged) is acknowledged without handling.
So each accepted message changes the state exactly once. (Redeliveries may come after newer
messages, so a sequence watermark would not do.) A message the agent crashes on counts as
handled (as locally: a crash loses the message being handled); the state before it is restored
(a crash in a batch restores the state before the batch and handles it again one by one).

The imports of a message are journaled in JetStream before the guest sees them
(mighty.cluster._journal): a message re-run after its node died, or after a crash inside a
batch, is answered from its journal up to where it was, so a tool call or HTTP request it had
made is not made again. A message redelivered, or re-run here, goes through the one-by-one path,
which reads its journal first; the batch path only runs messages for the first time.

Not covered: sends from the agent's own node (they are local, in memory), asks
(request/reply has no persistence; an ask is at most once), and sends by address: an address
names one incarnation on one node, while the consumer follows the name; after a restart
elsewhere nobody would consume what was stored for the old address (docs/cluster.md).
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

from mighty._cbor import loads_untrusted
from mighty._errors import MightyError
from mighty.abi import Err
from mighty.agents import AgentCrashed, AgentError, AgentProcess, NoProc
from mighty.cluster._frames import Frame, FrameError, decode, encode
from mighty.cluster._journal import (
    ClusterJournal,
    JournalCorrupt,
    MessageLog,
    Recovered,
    publish_until,
)
from mighty.engine import check_lowering

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
        self.journal = ClusterJournal(node, self.types)
        """The import journals of the messages in flight (mighty.cluster._journal)."""
        self.refused = 0
        """Re-run messages not run because their journal could not answer them."""

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
        await self.journal.setup(js)
        self.journal.install()

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
        why = publish_until(node, self._js, self.subject(name), data, msg_id, timeout)
        if why is not None:
            from mighty.agents import AskTimeout

            raise AskTimeout(f"JetStream did not store the message for {name}: {why}")

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
        self.journal.close()


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
        self._journaled: set[str] = set()
        """Messages run here whose journal is stored and who are not acknowledged yet (a
        re-run after a crash in a batch reads it)."""
        self._snapshot: bytes | None = None
        self._revision = 0
        """The revision of the stored state this consumer last wrote (``_restore_stored``)."""

    def run(self) -> None:
        try:
            self._run()
        except Exception:  # noqa: BLE001 -- a consumer thread must not die silently
            _log.exception("durable consumer of %s failed", self.name_)

    def _process(self, *, starting: bool = False) -> AgentProcess | None:
        """The agent, once it runs (None: gone). ``starting``: the consumer's first look, which
        may come before the agent is started (a name is claimed, and this consumer attached,
        just before ``start``: without a supervisor nothing started it later, and the
        consumer ended at once, leaving the name's messages unconsumed)."""
        deadline = time.monotonic() + 30
        while not self.stopped.is_set() and time.monotonic() < deadline:
            try:
                process = self.node.runtime.process(self.address)
            except NoProc:
                if starting:
                    time.sleep(0.01)
                    continue
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
        process = self._process(starting=True)
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
            if self.stopped.is_set() or not self._batch(messages):
                return

    def _restore_stored(self, process: AgentProcess) -> None:
        """Restore the stored state and take it over: a new revision of the state's key, which
        every later store of this consumer compares with (``_store``). A consumer of the name's
        previous owner (a node cut off, its store and acknowledgements still on the way) then
        fails its store and acknowledges nothing: its batch is redelivered here. (Without it,
        that store and its acknowledgements, landing after this restore, lost the batch.)"""
        state = self.durable._state
        for _ in range(10):
            try:
                entry = self.node._call(state.get(self.name_), 10)
            except nats.js.errors.KeyNotFoundError:
                with process.turn_lock:
                    instance = process.instance
                    if instance is None:
                        return
                    snapshot = bytes(instance.call("snapshot"))
                first = cbor2.dumps({"ids": [], "snapshot": snapshot})
                try:
                    self._revision = int(self.node._call(state.create(self.name_, first), 10))
                except nats.js.errors.KeyWrongLastSequenceError:
                    continue  # stored meanwhile: read it
                self._snapshot = snapshot
                return
            self._restore_entry(process, entry.value)
            try:
                self._revision = int(
                    self.node._call(state.update(self.name_, entry.value, last=entry.revision), 10)
                )
            except nats.js.errors.KeyWrongLastSequenceError:
                continue  # stored meanwhile: restore that
            return
        raise NoProc(f"{self.address}: its stored state keeps changing under it")

    def _store(self, snapshot: bytes) -> bool:
        """Store the state by compare-and-set; False when another consumer took it over."""
        state = cbor2.dumps({"ids": list(self.done), "snapshot": snapshot})
        try:
            self._revision = int(
                self.node._call(
                    self.durable._state.update(self.name_, state, last=self._revision), 10
                )
            )
        except nats.js.errors.KeyWrongLastSequenceError:
            _log.warning(
                "durable %s: its stored state was taken over by another node; this consumer "
                "stops (its last messages are left to the new owner)",
                self.name_,
            )
            return False
        return True

    def _restore_entry(self, process: AgentProcess, value: bytes | None) -> None:
        try:
            state = loads_untrusted(value or b"")
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
            check_lowering(len(snapshot), instance.budget.memory, f"{self.address}: restore")
            outcome = instance.call("restore", snapshot)
        if isinstance(outcome, Err):
            raise NoProc(f"{self.address} refused its stored state: {outcome.value}")

    def _batch(self, messages: list[Any]) -> bool:
        """Handle a fetched batch: every new message delivered at once (in order), then one
        snapshot and one stored state for all, then the acknowledgements. A crash in the batch
        restores the state before it and handles the batch again one by one (``_one``). False
        when the agent is gone (what was not stored is left unacknowledged)."""
        node, durable = self.node, self.durable
        fresh: list[tuple[Any, str, Frame]] = []
        acks: list[Any] = []
        for message in messages:
            try:
                frame = decode(message.data, max_frame=node.config.max_frame)
            except FrameError as exc:
                node._drop(exc.reason, f"a durable message for {self.name_}: {exc.message}")
                acks.append(message)
                continue
            msg_id = frame.id or f"seq-{message.metadata.sequence.stream}"
            if msg_id in self._done or any(msg_id == done for _, done, _ in fresh):
                durable.skipped += 1
                acks.append(message)
                continue
            fresh.append((message, msg_id, frame))
        again = any(self._again(message, msg_id) for message, msg_id, _ in fresh)
        if len(fresh) <= 1 or again or not self._keep_before():
            self._ack(acks)
            return all(self._one(message) for message, _, _ in fresh)
        delivered = self._deliver(fresh)
        if not delivered:
            self._ack(acks)
            return self._process() is not None
        crashed = False
        for _, _, future in delivered:
            try:
                future.result(_HANDLE_TIMEOUT)
            except AgentError as exc:
                if isinstance(exc, AgentCrashed | NoProc) or "crashed" in exc.message:
                    crashed = True
        for _, msg_id, _ in delivered:
            self._ran(msg_id)
        process = self._process()
        if process is None:
            self._ack(acks)
            return False
        if crashed:
            if self._snapshot is not None:
                self._restore(process, self._snapshot)
            self._ack(acks)
            return all(self._one(message) for message, _, _ in delivered)
        with process.turn_lock:
            instance = process.instance
            if instance is None:
                return False
            snapshot = bytes(instance.call("snapshot"))
        for _, msg_id, _ in delivered:
            self._remember(msg_id)
        if not self._store(snapshot):
            return False
        self._snapshot = snapshot
        durable.handled += len(delivered)
        self._ack(acks + [message for message, _, _ in delivered])
        self._finish([msg_id for _, msg_id, _ in delivered])
        return True

    def _again(self, message: Any, msg_id: str) -> bool:
        """The message may have run before (here or on a node that died): read its journal."""
        delivered = getattr(message.metadata, "num_delivered", None)
        return msg_id in self._journaled or not isinstance(delivered, int) or delivered > 1

    def _prepare(self, message: Any, msg_id: str, process: AgentProcess) -> MessageLog | None:
        """Register the message's journal log (with the answers of its journal when it may
        have run before); ``recovered.refusal`` says when it must not run. None: its journal
        could not be read now (NATS did not answer): the message is left unacknowledged, to
        be redelivered and its journal read again."""
        journal = self.durable.journal
        recovered = Recovered()
        if self._again(message, msg_id):
            instance = process.instance
            component = (process.type.component if instance is None else instance.component).sha256
            try:
                recovered = journal.read(self.name_, msg_id, component)
            except JournalCorrupt as exc:
                recovered = Recovered(refusal=exc.message, logs=1)
            except (nats.errors.Error, MightyError) as exc:
                _log.warning(
                    "durable %s: the journal of %s could not be read (left to be redelivered): %s",
                    self.name_,
                    msg_id,
                    exc,
                )
                return None
        log = MessageLog(journal, self.name_, msg_id, recovered)
        journal.register(self.address, log)
        return log

    def _ran(self, msg_id: str) -> None:
        """The message ran: a journal it stored is kept for a re-run until it is acknowledged."""
        log = self.durable.journal.log(self.address, msg_id)
        if log is not None and log.stored:
            self._journaled.add(msg_id)

    def _finish(self, ids: list[str]) -> None:
        """The messages' state is stored and they are acknowledged: their journals go."""
        journal = self.durable.journal
        for msg_id in ids:
            log = journal.unregister(self.address, msg_id)
            stored = msg_id in self._journaled or (log is not None and log.stored)
            self._journaled.discard(msg_id)
            if stored:
                journal.purge(self.name_, msg_id)

    def _keep_before(self) -> bool:
        """Make sure the state before the batch is kept (to restore after a crash in it)."""
        if self._snapshot is not None:
            return True
        process = self._process()
        if process is None:
            return False
        with process.turn_lock:
            instance = process.instance
            if instance is None:
                return False
            self._snapshot = bytes(instance.call("snapshot"))
        return True

    def _deliver(self, fresh: list[tuple[Any, str, Frame]]) -> list[tuple[Any, str, Any]]:
        """Put the batch's messages in the mailbox in order; (message, id, reply future) of
        each delivered (a full mailbox or a gone agent stops the rest: redelivered later)."""
        delivered: list[tuple[Any, str, Any]] = []
        journal = self.durable.journal
        for message, msg_id, frame in fresh:
            journal.register(self.address, MessageLog(journal, self.name_, msg_id, Recovered()))
            future = self._deliver_one(frame, msg_id)
            if future is None:
                break
            delivered.append((message, msg_id, future))
        return delivered

    def _deliver_one(self, frame: Frame, msg_id: str) -> Any:
        """Put one message (its journal log registered) in the agent's mailbox: its reply's
        future; None when it was not delivered (a gone agent, a mailbox full for a minute:
        redelivered later), its log unregistered."""
        try:
            future, _ = self.node.runtime.deliver_ask(
                self.address,
                frame.name,
                frame.body,
                sender=frame.sender,
                timeout=_HANDLE_TIMEOUT,
                key=msg_id,
            )
        except AgentError as exc:
            self.durable.journal.unregister(self.address, msg_id)
            if not isinstance(exc, NoProc):
                _log.warning("durable %s: %s not delivered: %s", self.name_, msg_id, exc.message)
            return None
        return future

    def _ack(self, messages: list[Any]) -> None:
        if not messages:
            return

        async def ack_all() -> None:
            for message in messages:
                await message.ack()

        self.node._call(ack_all(), 10)

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
        process = self._process()
        if process is None:
            return False
        log = self._prepare(message, msg_id, process)
        if log is None:
            return True  # not acknowledged: redelivered after ack_wait
        crashed = self._run_one(frame, msg_id, log)
        if crashed is None:
            return self._process() is not None  # not delivered: left unacknowledged
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
        if not self._store(snapshot):
            return False
        self._snapshot = snapshot
        durable.handled += 1
        node._call(message.ack(), 10)
        self._finish([msg_id])
        return True

    def _run_one(self, frame: Frame, msg_id: str, log: MessageLog) -> bool | None:
        """Run the message (unless its journal refuses it): whether it crashed the agent;
        None when it was not delivered (a gone agent, or a mailbox full for a minute)."""
        if log.recovered.refusal:
            # Not run: its journal cannot answer it, and running it live could repeat what
            # the journal says was done. Counted as handled (as a crash is), state unchanged.
            self.durable.refused += 1
            _log.warning(
                "durable %s: message %s refused: %s", self.name_, msg_id, log.recovered.refusal
            )
            return False
        future = self._deliver_one(frame, msg_id)
        if future is None:
            return None
        crashed = False
        try:
            future.result(_HANDLE_TIMEOUT)
        except AgentError as exc:
            crashed = "crashed" in exc.message
        self._ran(msg_id)
        answers = log.answers
        if answers is not None and answers.divergence is not None:
            _log.warning(
                "durable %s: message %s left its journal: %s",
                self.name_,
                msg_id,
                answers.divergence,
            )
        return crashed
