"""The import journal of a cluster durable agent's message, kept in JetStream.

A message of a ``durable`` type (see mighty.cluster._durable) is handled, its state stored and
only then acknowledged; a node that dies in the middle leaves it unacknowledged, and the new
owner of the agent's name runs it again. Without a journal every tool call, HTTP request and
send the message had made before the crash was made again. So each import of such a message is
appended to the stream ``<cluster>_journal``, subject ``<cluster>.jrn.<name>.<hash of the
message id>``, and acknowledged by JetStream before the guest sees its result; a re-run of the
message (a redelivery, or the one-by-one re-run after a crash inside a batch) is answered from
that journal by :class:`mighty.trace.TraceAnswers` with the ``resume`` policy, the mechanism a
local recovery uses (mighty.agents' journal): each import answered before the crash is answered
again by key, and the message goes live at the first import with no logged answer, once every
logged answer was used. Its imports carry the idempotency keys of (the agent's cluster-wide
name, the message id, the import's position), so the call in flight at the crash is made again
with the key the first node sent. An import the journal cannot answer while a logged answer is
unused is a divergence (``NondeterminismError``): the message stops there as a crash, for the
agent's supervisor to decide; nothing after it runs live. The journal of a message is purged
once its state is stored and the message acknowledged.

The records are the trace format's (mighty.trace): the message's imports are recorded by a
:class:`mighty.trace.Recorder` into a scratch file, as the local journal records them, and
the bytes each import adds to it (whole checksummed frames) are published as one entry (cut in
pieces of at most 256 KiB). An entry is a CBOR map: version, the log's id (one per run of the
message: a re-run logs the answers it is given again, under its own id, and the longest log
wins, as the local ``.prev`` log does), its number in the log, the message id and the bytes,
with a checksum over all of them. Read back, entries are bounded (count, bytes, each entry's
size), checked (checksum, message id, numbers without a gap) and the log parsed by the trace
reader (its frames' checksums): anything else is :class:`JournalCorrupt`, and the message is
refused (not run), never run live over a journal that could not be read. (A journal NATS does
not return now is no answer at all: the message is left to be redelivered.) The scratch trace
is made at a message's first import, so a message with none costs nothing here; it is deleted
when the ``handle`` call ends. A second run of one message on one node (a ``RetryPolicy``
retry after the agent crashed on it) runs live under a log of its own, as a local retry does.

The hook: the node sets the runtime's ``import_journal``, which wraps the record sink of each
new instance of a durable type (the node's ``--record`` trace goes on underneath); the
consumer registers a :class:`MessageLog` under the message id before delivering it, with that
id as the envelope's ``key``, and the instance's recording finds it at ``handle``.

Rejected:
- The journal on the node's disk (as the local one is): it dies with the node, which is the
  crash this journal is for.
- A KV key per message rewritten with the whole log at each import: quadratic in the
  message's imports, and a key's value is bounded by the server's payload limit.
- An entry format of our own per import (interface, function, arguments, result): a second
  encoding of an import record beside the trace's, and the answering code (keys, HTTP
  exchanges, resource stand-ins) would need a second reader. The scratch file costs a page-cache
  write and a read per import.
- One subject per agent for all its messages: a message's entries could then only be found or
  purged by scanning the agent's subject.
- Replacing the runtime's ``recorder`` with a wrapping sink: the migration's link record and
  the hot swap's record append to that recorder, which a wrapper would have had to imitate.
- Waiting for the acknowledgement of the records of imports with no outside effect (clocks,
  random) only at the next import that has one: fewer round trips, but which imports have
  effects is not a property the gate knows; not done (benchmarks/README.md has the cost).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import cbor2
import nats.errors
import nats.js.errors
from nats.js.api import StorageType, StreamConfig

from mighty._cbor import loads_untrusted
from mighty._errors import BadInput, HostError, MightyError
from mighty.agents import AgentProcess, NoProc
from mighty.trace import Recorder, TraceAnswers, TraceError, read_instances
from mighty.wasi import HTTP_RESPONDER, IDEMPOTENCY_KEYS, IdempotencyKeys

if TYPE_CHECKING:
    from mighty.cluster._node import Node
    from mighty.engine import Component
    from mighty.gate import Binding, GuestContext
    from mighty.instance import Recording, RecordSink
    from mighty.wasi import Policy

__all__ = [
    "ENTRY_DATA",
    "MAX_ENTRIES",
    "MAX_LOG_BYTES",
    "ClusterJournal",
    "JournalCorrupt",
    "JournalEntry",
    "MessageLog",
    "Recovered",
    "assemble",
    "decode_entry",
    "encode_entry",
    "publish_until",
]

_log = logging.getLogger(__name__)
_VERSION = 1
ENTRY_DATA = 256 * 1024
"""The most log bytes one entry carries (a longer import record is cut in pieces)."""
_ENTRY_MAX = ENTRY_DATA + 4096
"""The most bytes an entry may have on the wire (its data and its fields)."""
MAX_ENTRIES = 16384
"""The most entries read back for one message (all its logs together)."""
MAX_LOG_BYTES = 64 * 1024 * 1024
"""The most log bytes read back for one message."""
_MAX_ID = 256
_KEEP = 7 * 24 * 3600.0
"""How long an entry is kept at most (a message acknowledged by a node that died before it
purged its journal leaves entries nobody reads)."""


class JournalCorrupt(HostError):
    """A message's journal read back from JetStream is damaged, hostile or too large: the
    message is refused, not run (neither answered from it nor live)."""

    kind = "cluster_journal_corrupt"


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One piece of a message's import log: ``data``, the bytes number ``n`` of log ``log``."""

    log: str
    n: int
    message: str
    data: bytes


def _checksum(log: str, n: int, message: str, data: bytes) -> bytes:
    head = f"{_VERSION}\0{log}\0{n}\0{message}\0".encode()
    return hashlib.sha256(head + data).digest()[:16]


def encode_entry(entry: JournalEntry) -> bytes:
    """The wire form of ``entry`` (a CBOR map with a checksum over every field)."""
    if len(entry.data) > ENTRY_DATA:
        raise BadInput(f"an entry carries at most {ENTRY_DATA} bytes, not {len(entry.data)}")
    return cbor2.dumps(
        {
            "v": _VERSION,
            "log": entry.log,
            "n": entry.n,
            "msg": entry.message,
            "data": entry.data,
            "sum": _checksum(entry.log, entry.n, entry.message, entry.data),
        }
    )


def decode_entry(raw: bytes) -> JournalEntry:
    """The entry ``raw`` encodes; :class:`JournalCorrupt` for anything else."""
    if len(raw) > _ENTRY_MAX:
        raise JournalCorrupt(f"a journal entry of {len(raw)} bytes (at most {_ENTRY_MAX})")
    try:
        value = loads_untrusted(raw, max_depth=4, max_items=64)
    except Exception as exc:  # noqa: BLE001 - cbor2 raises many kinds on garbage
        raise JournalCorrupt(f"a journal entry that is not CBOR: {exc}") from None
    if type(value) is not dict or set(value) != {"v", "log", "n", "msg", "data", "sum"}:
        raise JournalCorrupt("a journal entry that is not a map of its six fields")
    if value["v"] != _VERSION or type(value["v"]) is not int:
        raise JournalCorrupt(f"a journal entry of version {value['v']!r} (this reads {_VERSION})")
    log, n, message, data, checksum = (value[k] for k in ("log", "n", "msg", "data", "sum"))
    if type(log) is not str or type(message) is not str or not 0 < len(log) <= _MAX_ID:
        raise JournalCorrupt("a journal entry whose log or message id is not a short string")
    if not 0 < len(message) <= _MAX_ID:
        raise JournalCorrupt("a journal entry whose message id is not a short string")
    if type(n) is not int or not 0 <= n < MAX_ENTRIES:
        raise JournalCorrupt(f"a journal entry numbered {n!r}")
    if type(data) is not bytes or len(data) > ENTRY_DATA:
        raise JournalCorrupt("a journal entry whose data are not bytes within the limit")
    if type(checksum) is not bytes or checksum != _checksum(log, n, message, data):
        raise JournalCorrupt("a journal entry whose checksum does not match")
    return JournalEntry(log, n, message, data)


@dataclass(frozen=True, slots=True)
class Recovered:
    """What a message's journal answers: ``answers`` (None: nothing logged for this build),
    or ``refusal``, why the message must not run (a log of another build)."""

    answers: TraceAnswers | None = None
    refusal: str = ""
    imports: int = 0
    logs: int = 0


def assemble(
    entries: Iterable[JournalEntry], message: str, component: str, scratch: Path
) -> Recovered:
    """The answers of ``message``'s longest log of ``component`` (a sha256) among
    ``entries``; :class:`JournalCorrupt` when an entry is of another message, a log has a
    gap or a conflicting duplicate, or its bytes are not a readable trace. ``scratch``: a
    directory for the parse (a file is written there and deleted)."""
    logs: dict[str, dict[int, bytes]] = {}
    for entry in entries:
        if entry.message != message:
            raise JournalCorrupt(f"an entry of message {entry.message!r} in {message!r}'s journal")
        pieces = logs.setdefault(entry.log, {})
        if pieces.get(entry.n, entry.data) != entry.data:
            raise JournalCorrupt(f"log {entry.log!r} holds two different entries {entry.n}")
        pieces[entry.n] = entry.data
    best: tuple[int, list[dict[str, Any]], int] | None = None
    other = ""
    for log, pieces in logs.items():
        if sorted(pieces) != list(range(len(pieces))):
            raise JournalCorrupt(f"log {log!r} of {message!r} has a gap")
        path = scratch / f"read-{hashlib.sha256(log.encode()).hexdigest()[:16]}.trace"
        try:
            path.write_bytes(b"".join(pieces[n] for n in range(len(pieces))))
            instances, _torn = read_instances(path)  # a torn tail: its whole records
        except (TraceError, OSError) as exc:
            raise JournalCorrupt(
                f"log {log!r} of {message!r} is not a readable trace: {exc}"
            ) from None
        finally:
            path.unlink(missing_ok=True)
        for instance_id, records in instances.items():
            head = records[0] if records else {}
            if head.get("k") != "instance":
                continue
            if head.get("component") != component:
                other = other or str(head.get("component"))
                continue
            imports = sum(1 for r in records if r.get("k") == "import")
            if best is None or imports > best[2]:
                best = (instance_id, records, imports)
    if best is None:
        if other:
            return Recovered(
                refusal=f"its journal was begun by component {other[:12]}, this is "
                f"{component[:12]}: the log cannot answer another build",
                logs=len(logs),
            )
        return Recovered(logs=len(logs))
    instance_id, records, imports = best
    answers = TraceAnswers(records, instance=instance_id, policy="resume", http=True)
    return Recovered(answers, imports=imports, logs=len(logs))


class MessageLog:
    """The journal of one run of one message: appends (blocking until JetStream stored them),
    and the answers recovered for it, if any."""

    def __init__(
        self, journal: ClusterJournal, name: str, message: str, recovered: Recovered
    ) -> None:
        self.journal = journal
        self.name = name
        self.message = message
        self.recovered = recovered
        self.log = ""
        self.entries = 0
        """Entries published so far by this run."""
        self.runs = 0
        """``handle`` calls begun for it here (more than one: a retry, ``RetryPolicy``)."""
        self._earlier = False
        self._new_log()

    def _new_log(self) -> None:
        node = self.journal.node
        self.log = f"{node.name}-{node.started_at:.6f}-{next(self.journal._logs_made)}"

    def begin(self) -> None:
        """A ``handle`` of the message begins. A second one here (a retry after the agent
        crashed on it) runs live, as a local retry does, logged under a log of its own (two
        runs' records in one log would not be one trace)."""
        self.runs += 1
        if self.runs > 1:
            self._earlier = self._earlier or self.stored
            self.recovered = Recovered(logs=self.recovered.logs)
            self.entries = 0
            self._new_log()

    @property
    def answers(self) -> TraceAnswers | None:
        return self.recovered.answers

    @property
    def stored(self) -> bool:
        """Something of this message is in JetStream (its journal is to be purged)."""
        return self.entries > 0 or self.recovered.logs > 0 or self._earlier

    def append(self, data: bytes) -> None:
        """Publish ``data`` (the log's new bytes) and wait for JetStream to store it."""
        for start in range(0, len(data), ENTRY_DATA):
            entry = JournalEntry(
                self.log, self.entries, self.message, data[start : start + ENTRY_DATA]
            )
            if entry.n >= MAX_ENTRIES:
                raise HostError(
                    f"durable {self.name}: message {self.message!r} made more imports than its "
                    f"journal keeps ({MAX_ENTRIES} entries)"
                )
            self.journal.publish(
                self.name, self.message, encode_entry(entry), f"{self.log}-{entry.n}"
            )
            self.entries += 1


class ClusterJournal:
    """The journal stream of one node, and the logs of the messages its consumers run.

    ``install`` makes it the runtime's ``import_journal``: every instance of a durable type
    gets a :class:`_JournalRecording` (over the runtime's recorder), which logs the imports of a
    ``handle`` whose envelope's ``key`` (the durable message id) has a :class:`MessageLog`
    registered by the consumer (``register``)."""

    def __init__(self, node: Node, types: frozenset[str]) -> None:
        self.node = node
        self.types = types
        self.stream = f"{node.prefix}_journal"
        self._js: Any = None
        self._logs: dict[tuple[str, str], MessageLog] = {}
        self._logs_made = itertools.count(1)
        self._lock = threading.Lock()
        self._scratch: Path | None = None
        self.published = 0
        """Entries published by this node."""
        self.answered = 0
        """Messages that ran with answers from a journal."""

    async def setup(self, js: Any) -> None:
        config = StreamConfig(
            name=self.stream,
            subjects=[f"{self.node.prefix}.jrn.>"],
            storage=StorageType.FILE,
            duplicate_window=120.0,
            max_age=_KEEP,
            max_msg_size=_ENTRY_MAX,
        )
        try:
            await js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await js.update_stream(config)
        self._js = js

    @property
    def scratch(self) -> Path:
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix=f"mighty-journal-{self.node.name}-"))
        return self._scratch

    def install(self) -> None:
        """Journal the instances of durable types made from now on (the runtime's
        ``import_journal``)."""
        self.node.runtime.import_journal = self.sink

    def uninstall(self) -> None:
        runtime = self.node.runtime
        if runtime.import_journal == self.sink:
            runtime.import_journal = None

    def sink(self, process: AgentProcess, record: RecordSink | None) -> RecordSink | None:
        """The record sink of a new instance of ``process``: a journal for a durable type."""
        if process.type.name not in self.types:
            return record
        return _JournalSink(self, record)

    def close(self) -> None:
        self.uninstall()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def subject(self, name: str, message: str) -> str:
        digest = hashlib.sha256(message.encode()).hexdigest()[:32]
        return f"{self.node.prefix}.jrn.{name}.{digest}"

    # -- the consumer's side ------------------------------------------------------------------

    def register(self, address: str, log: MessageLog) -> None:
        with self._lock:
            self._logs[(address, log.message)] = log

    def log(self, address: str, message: str) -> MessageLog | None:
        with self._lock:
            return self._logs.get((address, message))

    def unregister(self, address: str, message: str) -> MessageLog | None:
        with self._lock:
            return self._logs.pop((address, message), None)

    def log_for(self, address: str) -> MessageLog | None:
        """The log of the message ``address`` is handling now, if its consumer registered one."""
        try:
            envelope = self.node.runtime.process(address).current
        except NoProc:
            return None
        key = None if envelope is None else envelope.key
        if key is None:
            return None
        with self._lock:
            return self._logs.get((address, key))

    def read(self, name: str, message: str, component: str) -> Recovered:
        """What ``message``'s journal answers for ``component`` (see :func:`assemble`)."""
        subject = self.subject(name, message)
        entries: list[JournalEntry] = []
        total = 0

        async def fetch(seq: int) -> Any:
            return await self._js.get_msg(self.stream, seq=seq, subject=subject, next=True)

        seq = 1
        while True:
            try:
                raw = self.node._call(fetch(seq), 10)
            except nats.js.errors.NotFoundError:
                break
            data = bytes(raw.data or b"")
            total += len(data)
            if len(entries) >= MAX_ENTRIES or total > MAX_LOG_BYTES:
                raise JournalCorrupt(
                    f"{message!r}'s journal holds more than {MAX_ENTRIES} entries or "
                    f"{MAX_LOG_BYTES} bytes"
                )
            entries.append(decode_entry(data))
            seq = int(raw.seq) + 1
        if not entries:
            return Recovered()
        return assemble(entries, message, component, self.scratch)

    def publish(self, name: str, message: str, data: bytes, entry_id: str) -> None:
        """Store one entry (retried for 10 s; see :func:`publish_until`)."""
        subject = self.subject(name, message)
        why = publish_until(self.node, self._js, subject, data, entry_id, 10.0)
        if why is not None:
            raise HostError(
                f"durable {name}: JetStream did not store the journal of {message!r}: {why}"
            )
        self.published += 1

    def purge(self, name: str, message: str) -> None:
        """Delete ``message``'s journal (its state is stored and it is acknowledged). Not
        waited for: nobody reads a handled message's journal (one that stays, its purge lost
        with the node, goes with the stream's ``max_age``)."""
        subject = self.subject(name, message)

        async def purge() -> None:
            try:
                await self._js.purge_stream(self.stream, subject=subject)
            except (nats.errors.Error, TimeoutError) as exc:
                _log.warning("durable %s: the journal of %r was not purged: %s", name, message, exc)

        with contextlib.suppress(RuntimeError):  # the node is closing: left to max_age
            asyncio.run_coroutine_threadsafe(purge(), self.node._loop)


def publish_until(
    node: Node, js: Any, subject: str, data: bytes, msg_id: str, timeout: float
) -> str | None:
    """Publish ``data`` on ``subject`` with the message id ``msg_id`` until JetStream has
    stored it or ``timeout`` seconds passed: None when stored, else why not. A store whose
    acknowledgement was lost is dropped by JetStream as a duplicate of the id, so a retry never
    stores it twice."""
    headers = {"Nats-Msg-Id": msg_id}
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            node._call(
                js.publish(subject, data, timeout=max(0.05, left), headers=headers),
                max(0.05, left) + 1,
            )
            return None
        except (nats.errors.Error, TimeoutError, MightyError) as exc:
            if node._closed or deadline - time.monotonic() <= 0.05:
                return str(exc)
            time.sleep(0.05)


class _JournalSink:
    """The record sink of a new instance of a durable agent: its journal recording, over the
    sink it would have recorded into (the node's ``--record`` trace, if any)."""

    def __init__(self, journal: ClusterJournal, inner: RecordSink | None) -> None:
        self.journal = journal
        self.inner = inner

    def attach(
        self,
        component: Component,
        budget: dict[str, Any],
        policy: Policy,
        *,
        agent: str | None = None,
        name: str | None = None,
    ) -> Recording:
        inner = self.inner
        also = (
            None
            if inner is None
            else inner.attach(component, budget, policy, agent=agent, name=name)
        )
        address = agent or ""
        return _JournalRecording(self.journal, address, (component, budget, policy, name), also)


class _JournalRecording:
    """One durable instance's recording: each journaled ``handle`` is recorded into a fresh
    scratch trace whose new bytes are published after every import, before the guest sees
    its result; a recovered message's imports are answered from its journal first."""

    fuel_limit = 0

    def __init__(
        self,
        journal: ClusterJournal,
        address: str,
        attach: tuple[Component, dict[str, Any], Policy, str | None],
        also: Recording | None,
    ) -> None:
        self.journal = journal
        self.address = address
        self._attach = attach
        self._also = also
        self.keys = IdempotencyKeys(address)
        self._log: MessageLog | None = None
        self._recorder: Recorder | None = None
        self._inner: Recording | None = None
        self._reader: IO[bytes] | None = None
        self._path: Path | None = None
        self._first = False
        self._slots = False
        self._handle: tuple[Sequence[Any], dict[str, Any]] = ((), {})

    def __call__(
        self, ctx: GuestContext, binding: Binding, args: Sequence[Any], call: Callable[[], Any]
    ) -> Any:
        log, also = self._log, self._also
        if log is None:
            if self._slots:  # a message with no journal: no keys, live HTTP
                self._slots = False
                ctx.take(IDEMPOTENCY_KEYS)
                ctx.take(HTTP_RESPONDER)
            return call() if also is None else also(ctx, binding, args, call)
        if self._first:
            self._first = False
            self._slots = True
            self._open(log)
            ctx.put(IDEMPOTENCY_KEYS, self.keys)
            answers = log.answers
            if answers is not None and answers.http is not None:
                ctx.put(HTTP_RESPONDER, cast("Any", answers.http))
            else:
                ctx.take(HTTP_RESPONDER)
        inner = self._inner
        assert inner is not None
        # A keyed import (an HTTP request, a tool call) is its key's next position: the same
        # in a re-run answered from the journal (whose polls may differ) as in the first run.
        self.keys.step(binding.interface, binding.name)
        answers = log.answers
        live = call if answers is None else (lambda: answers(ctx, binding, args, call))
        target = live if also is None else (lambda: also(ctx, binding, args, live))
        try:
            result = inner(ctx, binding, args, target)
        except BaseException:
            with contextlib.suppress(MightyError, OSError):
                self._publish(log)
            raise
        self._publish(log)
        return result

    def _publish(self, log: MessageLog) -> None:
        reader = self._reader
        if reader is None:
            return
        data = reader.read()
        if data:
            log.append(data)

    def begin_export(self, name: str, args: Sequence[Any], budget: dict[str, Any]) -> None:
        if name == "handle":
            self._begin(args, budget)
        if self._also is not None:
            self._also.fuel_limit = int(budget["fuel"])
            self._also.begin_export(name, args, budget)

    def end_export(
        self,
        name: str,
        result: Any,
        error: BaseException | None,
        fuel: int | None,
        memory_peak: int | None,
    ) -> None:
        for recording in (self._inner, self._also):
            if recording is not None:
                recording.end_export(name, result, error, fuel, memory_peak)
        if name == "handle":
            self._end()

    def close(self, stdout: bytes, stderr: bytes) -> None:
        self._end()
        if self._also is not None:
            self._also.close(stdout, stderr)

    def _begin(self, args: Sequence[Any], budget: dict[str, Any]) -> None:
        self._end()
        log = self.journal.log_for(self.address)
        if log is None:
            return
        log.begin()
        self._log, self._handle = log, (args, budget)
        self.keys.agent = log.name
        self.keys.begin(log.message)
        self._first = True
        if log.answers is not None:
            self.journal.answered += 1

    def _open(self, log: MessageLog) -> None:
        """The message's first import: its scratch trace (a message with no import costs
        none), with the ``handle`` call the import is in."""
        component, budget, policy, name = self._attach
        path = self.journal.scratch / f"{log.log}.trace"
        # No source positions: the journal's hook does not keep them (as the local journal).
        recorder = Recorder(path, flush="record", positions=False)
        self._recorder, self._path = recorder, path
        self._reader = path.open("rb")
        inner = recorder.attach(component, budget, policy, agent=self.address, name=name)
        args, call_budget = self._handle
        inner.fuel_limit = int(call_budget["fuel"])
        inner.begin_export("handle", args, call_budget)
        self._inner = inner

    def _end(self) -> None:
        recorder, reader, path = self._recorder, self._reader, self._path
        self._recorder = self._reader = self._path = self._inner = self._log = None
        if recorder is not None:
            with contextlib.suppress(MightyError, OSError):
                recorder.close(sync=False)  # deleted next: no fsync
        if reader is not None:
            reader.close()
        if path is not None:
            path.unlink(missing_ok=True)
