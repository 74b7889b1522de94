"""The journal of durable agents: their accepted messages and the imports of the message in
flight survive a crash of the process, and recovery answers the imports that completed from the
journal instead of making them again.

A durable agent's state is its last snapshot (a checkpoint, written after every handled message)
plus the journal after it:

- the **inbox**: every message accepted into a durable agent's mailbox is a row of the store's
  ``inbox`` table (fsynced) before the send returns; the row is deleted in the same transaction
  that writes the snapshot including the message, so a crash leaves either the message pending
  and the old state, or the new state and no message;
- the **import log** of the message in flight: a trace file per agent
  (``state_dir/journal/ADDRESS.trace``), written by the trace recorder with ``flush="record"``
  (each import's record reaches the operating system before the guest sees its result), begun
  at each ``handle`` call and deleted at the checkpoint. It is an ordinary trace: ``mty trace
  show`` and ``mty replay`` read it.

Recovery: a runtime opened on the same ``state_dir`` finds the agents with pending inbox rows
when their type is registered, brings each back from its snapshot and puts the pending messages
in its mailbox in their order (an ask's asker is gone with the old process: no reply is sent).
The first message runs with a :class:`mighty.trace.TraceAnswers` hook (``policy="resume"``)
over the log: each import that was answered before the crash is answered from the log by key
(interface, function, canonical arguments; the HTTP exchanges by request), and execution goes
live at the first import the log has no answer for, once every logged answer was used. A tool
call, an HTTP request or a send that completed before the crash is not made again; one in
flight at the crash (started, no answer logged) is made again. An import the log cannot answer
while a logged answer is still unused means the guest did not retrace its steps (a log that is
not this message's): the message stops there with the divergence ``mty replay`` reports (a
crash, for the agent's supervisor to decide), and nothing more of it runs live. A log written
by another build is refused before the message runs (``RecoveryRefused``).
docs/durability.md says what is and is not guaranteed.

Rejected:
- A log table in SQLite for the imports: each record would be a write transaction (an fsync in
  WAL mode per import with ``synchronous=FULL``); a trace file appended without fsync survives a
  crash of the process at the cost of a page-cache write, and it is already the format every
  tool reads.
- Keeping the whole history in the journal: the checkpoint after each message makes the log of
  one message the whole suffix, so the log needs no compaction; history is what ``--record``
  traces are for.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mighty._errors import HostError, MightyError
from mighty.trace import Recorder, TraceAnswers, TraceReader, read_instances
from mighty.wasi import HTTP_RESPONDER, IdempotencyKeys

if TYPE_CHECKING:
    from mighty.agents._store import SnapshotStore
    from mighty.engine import Component
    from mighty.gate import Binding, CallHook, GuestContext, Seed
    from mighty.instance import Recording, RecordSink
    from mighty.wasi import Policy

__all__ = ["Journal", "Recovery", "RecoveryRefused"]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _file_name(address: str) -> str:
    return _SAFE.sub("_", address) + ".trace"


class RecoveryRefused(HostError):
    """A journaled message cannot be recovered as its log says: the log was written by another
    build of the agent (the message is not run, live or otherwise; the agent's supervisor
    decides, as for a crash)."""

    kind = "recovery_refused"


class Recovery:
    """The answers of one recovered message: a gate hook answering from the log until the
    message ends (then every import is live, so later messages never meet its records).
    ``refusal``: why the message must not run at all (see :class:`RecoveryRefused`)."""

    def __init__(self, answers: TraceAnswers | None, refusal: str = "") -> None:
        self.refusal = refusal
        self.answers = answers
        self.active = False
        """Set while the recovered message's ``handle`` runs: the imports of ``restore`` and
        of instantiation are not in the log (it begins at ``handle``), so they run live."""
        self.finished = False

    def __call__(
        self, ctx: GuestContext, binding: Binding, args: Sequence[Any], call: Callable[[], Any]
    ) -> Any:
        if self.finished or not self.active or self.answers is None:
            return call()
        return self.answers(ctx, binding, args, call)

    def failure(self, error: MightyError) -> MightyError:
        """What the recovered message failed with: the log's divergence when the guest left
        the log early (``TraceAnswers`` raised it inside a host function, which the call
        reports as a host function failure), else ``error``."""
        divergence = None if self.answers is None else self.answers.divergence
        return error if divergence is None else divergence

    @property
    def seeds(self) -> tuple[Seed, ...]:
        http = None if self.answers is None else self.answers.http
        return () if http is None else (HTTP_RESPONDER.of(http),)


class _LogRecording:
    """One durable instance's recording: a fresh trace file per ``handle`` call, the imports
    of other calls (``init``, ``restore``, ``snapshot``) not logged (they are recomputed)."""

    fuel_limit = 0

    def __init__(
        self,
        path: Path,
        component: Component,
        budget: dict[str, Any],
        policy: Policy,
        agent: str | None,
        name: str | None,
        also: Recording | None,
        keys: IdempotencyKeys,
    ) -> None:
        self._keys = keys
        self._path = path
        self._attach = (component, budget, policy, agent, name)
        self._also = also
        self._recorder: Recorder | None = None
        self._inner: Recording | None = None

    def __call__(
        self, ctx: GuestContext, binding: Binding, args: Sequence[Any], call: Callable[[], Any]
    ) -> Any:
        # Every import of the message, answered from a log or live: a keyed one is its
        # idempotency key's position, the same in a re-run as in the first run.
        self._keys.step(binding.interface, binding.name)
        inner, also = self._inner, self._also
        if also is not None:
            if inner is None:
                return also(ctx, binding, args, call)
            return inner(ctx, binding, args, lambda: also(ctx, binding, args, call))
        if inner is None:
            return call()
        return inner(ctx, binding, args, call)

    def begin_export(self, name: str, args: Sequence[Any], budget: dict[str, Any]) -> None:
        if name == "handle":
            self._open()
        if self._inner is not None:
            self._inner.fuel_limit = int(budget["fuel"])
            self._inner.begin_export(name, args, budget)
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
        if self._inner is not None:
            self._inner.end_export(name, result, error, fuel, memory_peak)
        if self._also is not None:
            self._also.end_export(name, result, error, fuel, memory_peak)

    def close(self, stdout: bytes, stderr: bytes) -> None:
        self.discard()
        if self._also is not None:
            self._also.close(stdout, stderr)

    def _open(self) -> None:
        if self._recorder is not None:
            self.discard()
        elif self._path.exists():
            # A log a crash left (a recovery is answering from it, in memory): kept beside the
            # new one until the message is checkpointed, so a crash during the recovery still
            # finds every answer (Journal.recovery takes the longer of the two).
            previous = _previous(self._path)
            if _imports_in(self._path) >= _imports_in(previous):
                self._path.replace(previous)
            else:
                self._path.unlink()
        component, budget, policy, agent, name = self._attach
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # No source positions: the log's own hook does not keep them (mighty.gate _source.py).
        recorder = Recorder(self._path, flush="record", positions=False)
        self._recorder = recorder
        self._inner = recorder.attach(component, budget, policy, agent=agent, name=name)
        # Which message the log is of: a log a crash left after its message was checkpointed
        # (the state written, the log not yet deleted) must not answer the next message's
        # imports. A record of no instance: replay and the other readers pass it by.
        recorder.append({"k": _JOURNAL_RECORD, "seq": self._keys.message})

    def discard(self) -> None:
        """The message's state is checkpointed: its log is not needed any more."""
        recorder, self._recorder, self._inner = self._recorder, None, None
        if recorder is not None:
            with contextlib.suppress(MightyError, OSError):
                recorder.close(sync=False)  # deleted next: no fsync
        self._path.unlink(missing_ok=True)
        _previous(self._path).unlink(missing_ok=True)


class _LogSink:
    """``Instance(record=...)`` of a durable agent: its log, and the runtime's trace if any."""

    def __init__(self, journal: Journal, address: str, also: RecordSink | None) -> None:
        self.journal = journal
        self.address = address
        self.also = also
        self.keys = IdempotencyKeys(address)
        """The idempotency keys of the agent's side effects (see mighty.wasi)."""
        self.recording: _LogRecording | None = None

    def attach(
        self,
        component: Component,
        budget: dict[str, Any],
        policy: Policy,
        *,
        agent: str | None = None,
        name: str | None = None,
    ) -> Recording:
        also = (
            None
            if self.also is None
            else self.also.attach(component, budget, policy, agent=agent, name=name)
        )
        path = self.journal.log_path(self.address)
        recording = _LogRecording(path, component, budget, policy, agent, name, also, self.keys)
        self.recording = recording
        return recording


class Journal:
    """The inbox rows and import logs of one runtime's durable agents (under ``state_dir``)."""

    def __init__(self, store: SnapshotStore) -> None:
        self.store = store
        self.directory = store.directory / "journal"

    def log_path(self, address: str) -> Path:
        return self.directory / _file_name(address)

    def sink(self, address: str, also: RecordSink | None) -> _LogSink:
        """The record sink of a new instance of durable agent ``address``."""
        return _LogSink(self, address, also)

    def recovery(
        self, address: str, component: Component, seq: int | None = None
    ) -> Recovery | None:
        """Answers from the import log ``address`` left at a crash, if it left one for the
        component it runs now (a log of another build answers nothing: it runs live) and for
        message ``seq``, the first pending one (a log of a message already checkpointed is
        stale and answers nothing; a log too old to say which message it is of is taken)."""
        best: tuple[int, list[dict[str, Any]], int] | None = None
        other: str | None = None
        for path in (self.log_path(address), _previous(self.log_path(address))):
            logged = _message_of(path)
            if seq is not None and logged is not None and logged != seq:
                continue  # stale: its message was checkpointed before the crash
            found = _log_of(path, component)
            if found is not None and (best is None or found[2] > best[2]):
                best = found
            elif found is None:
                other = other or _component_of(path)
        if best is None:
            if other is not None:
                return Recovery(
                    None,
                    f"{address}: its journaled message was begun by component {other[:12]}, "
                    f"this is {component.sha256[:12]}: the log cannot answer another build",
                )
            return None
        instance_id, records, _count = best
        return Recovery(TraceAnswers(records, instance=instance_id, policy="resume", http=True))

    def accept(self, address: str, sender: str, name: str, body: bytes) -> int:
        return self.store.inbox_put(address, sender, name, body)

    def forget(self, address: str, seq: int) -> None:
        self.store.inbox_done(address, seq)

    def pending(self) -> list[str]:
        return self.store.inbox_addresses()

    def messages(self, address: str) -> list[tuple[int, str, str, bytes]]:
        return self.store.inbox(address)


_JOURNAL_RECORD = "journal"
_HEAD_RECORDS = 8
"""How many records of a log are read looking for its message's record (the second one)."""


def _message_of(path: Path) -> int | None:
    """The inbox sequence number of the message a log is of (None: no log, a damaged one, or
    one written before logs said)."""
    if not path.is_file():
        return None
    try:
        with TraceReader(path) as reader:
            for count, record in enumerate(reader.records()):
                if record.get("k") == _JOURNAL_RECORD:
                    seq = record.get("seq")
                    return seq if type(seq) is int else None
                if count >= _HEAD_RECORDS:
                    break
    except Exception:  # noqa: BLE001 - a damaged log says nothing (and answers nothing)
        return None
    return None


def _previous(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


def _log_of(path: Path, component: Component) -> tuple[int, list[dict[str, Any]], int] | None:
    """The instance of ``component`` a log holds: (its id, its records, its import count)."""
    if not path.is_file():
        return None
    try:
        instances, _truncated = read_instances(path)
    except Exception:  # noqa: BLE001 - a damaged log answers nothing; the message runs live
        return None
    for instance_id, records in instances.items():
        head = records[0] if records else {}
        if head.get("k") == "instance" and head.get("component") == component.sha256:
            imports = sum(1 for r in records if r.get("k") == "import")
            return instance_id, records, imports
    return None


def _component_of(path: Path) -> str | None:
    """The component a readable log was written by (None: no log, or a damaged one)."""
    if not path.is_file():
        return None
    try:
        instances, _truncated = read_instances(path)
    except Exception:  # noqa: BLE001 - a damaged log: nothing to refuse from
        return None
    for records in instances.values():
        head = records[0] if records else {}
        if head.get("k") == "instance":
            return str(head.get("component", "?"))
    return None


def _imports_in(path: Path) -> int:
    if not path.is_file():
        return -1
    try:
        instances, _truncated = read_instances(path)
    except Exception:  # noqa: BLE001 - a damaged log counts as none
        return -1
    return sum(1 for rs in instances.values() for r in rs if r.get("k") == "import")


def hooks_of(recovery: Recovery | None) -> tuple[CallHook, ...]:
    """The instance hooks of a recovery (none without one)."""
    return () if recovery is None else (recovery,)
