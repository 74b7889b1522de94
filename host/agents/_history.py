"""History as data: what a durable agent's stored state says happened, and forks of it.

A durable agent's stored state (docs/durability.md) is its checkpoint (the snapshot row of the
store, written after every handled message), its journaled messages (inbox rows accepted and
not yet checkpointed, oldest first) and the import log of the first of them
(``state_dir/journal/ADDRESS.trace``, a trace file). :func:`read_history` lists that as
numbered entries: position 0 is the checkpoint, then each pending message, the first one
followed by the imports its log holds, in the order they were answered. The ``wasi:http`` and
``wasi:io`` imports of one outgoing HTTP request (its fields, method, URL, body writes,
``handle``, the polls, the response's status, headers and body reads: two dozen calls) are one
entry, ``http POST URL -> 200``, that covers them all: a position is where a fork may begin, and
a fork in the middle of a request's calls would hand recovery half an exchange. A healthy agent
between messages has only its checkpoint: the runtime deletes a message's log and inbox row when it
checkpoints the message, so there is no older history to read (``--record`` traces keep that).

:func:`fork_agent` starts a new durable agent from position N: the checkpoint copied under a
new address and name, the messages up to N copied into the fork's inbox, and the log copied
up to N (a position inside the in-flight message keeps the imports up to it). Nothing runs
here: the next runtime on the ``state_dir`` that registers the agent's type recovers the fork
as it recovers a crash, re-running its messages from the checkpoint with the copied log's
answers (a :class:`mighty.trace.TraceAnswers` replay) and going live after them, as Golem's
fork continues a worker from an oplog index.

:func:`export_trace` (``mty history --trace``) writes the message in flight as a trace that
``mty replay`` and ``mty debug`` run: the log alone is not replayable (it begins at ``handle``
of an instance restored from a snapshot it does not hold, and that call never ended), so a new
instance is restored from the checkpoint here, its instantiation and ``restore`` recorded live,
and the log's call and imports follow it, ended as interrupted where the log ends.

Bounds on a hostile or huge store or log: at most ``limit`` entries are kept, inbox bodies are
read as their first bytes only (their size is asked of SQL), and the log is decoded only up to
``READ_BYTES``; past either bound the rest of the log is counted by its frame prefixes (12
bytes each), never decoded, and reported as "N more". Damage is a typed one-line error:
:class:`JournalCorrupt` for the log, the store's own errors for the store.

Rejected: keeping every message's log and every snapshot forever so any past position could
be listed and forked (the runtime's checkpoint-per-message design deletes them, and changing
what it keeps is a decision of the runtime, not of a reader); forking by running the agent here
(a fork would then need the agent's capabilities and component in this process; the runtime's
recovery already replays a log exactly, with its divergence checks); teaching ``mty replay``
to start from a checkpoint it is handed (a new input to every replay path, for what one
written trace gives).
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mighty._errors import BadInput, HostError
from mighty.abi import Err, Ok, Variant
from mighty.agents._journal import _file_name
from mighty.agents._store import StoreView
from mighty.trace import (
    MAX_FRAME,
    HandleRef,
    Recorder,
    TraceError,
    TraceReader,
    TraceTruncated,
)

__all__ = [
    "HISTORY_LIMIT",
    "READ_BYTES",
    "AgentHistory",
    "ForkRefused",
    "ForkResult",
    "HistoryEntry",
    "JournalCorrupt",
    "UnknownAgent",
    "export_trace",
    "fork_agent",
    "read_history",
]

HISTORY_LIMIT = 1000
"""Entries :func:`read_history` lists by default; the rest are counted."""
READ_BYTES = 64 << 20
"""Bytes of an import log decoded at most (with the one frame that crosses the bound)."""
_SUMMARY = 100
_PREFIX = struct.Struct(">III")
_BLOB_HEAD = b"\xa3\x61k\x64blob"  # a frame {"k": "blob", ...}: the trace writer's own frames


class JournalCorrupt(HostError):
    """A durable agent's import log is damaged (not a torn tail: that is what a crash
    leaves, and the records before it are read)."""

    kind = "journal_corrupt"


class UnknownAgent(BadInput):
    """No durable agent by that name or address in the ``state_dir``."""

    kind = "unknown_agent"


class ForkRefused(BadInput):
    """``mty fork`` cannot start a new agent from that position (or under that name)."""

    kind = "fork_refused"


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One entry of an agent's history: ``kind`` is ``checkpoint``, ``message`` or
    ``import`` (or ``end``: the message's handler returned, not yet checkpointed)."""

    position: int
    kind: str
    summary: str
    time: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "kind": self.kind,
            "summary": self.summary,
            "time": self.time,
            **self.detail,
        }


@dataclass(slots=True)
class AgentHistory:
    """What :func:`read_history` found for one agent."""

    address: str
    name: str | None
    type: str
    state_dir: Path
    log: Path | None
    entries: list[HistoryEntry]
    more: int = 0
    """Entries past the limit (or past ``READ_BYTES`` of the log), counted, not listed."""
    torn: bool = False
    """The log ends inside a record (a crash mid-write): the records before it are whole."""
    stale: bool = False
    """The log's message was already checkpointed (a crash between the two): no recovery
    reads it."""

    def to_json(self) -> dict[str, Any]:
        return {
            "agent": self.address,
            "name": self.name,
            "type": self.type,
            "state_dir": str(self.state_dir),
            "log": None if self.log is None else str(self.log),
            "entries": [e.to_json() for e in self.entries],
            "more": self.more,
            "torn": self.torn,
            "stale": self.stale,
        }


@dataclass(frozen=True, slots=True)
class ForkResult:
    """What :func:`fork_agent` stored: the fork's address and name, and what it holds."""

    address: str
    name: str
    source: str
    at: int
    messages: int
    imports: int
    log: Path | None

    def to_json(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "name": self.name,
            "from": self.source,
            "at": self.at,
            "messages": self.messages,
            "imports": self.imports,
            "log": None if self.log is None else str(self.log),
        }


def _log_path(state_dir: Path, address: str) -> Path:
    """Where the runtime keeps ``address``'s import log (mighty.agents._journal)."""
    return state_dir / "journal" / _file_name(address)


def _short(value: Any, limit: int = 40) -> str:
    if isinstance(value, HandleRef):
        text = f"{value.name}#{value.rep}"
    elif isinstance(value, Ok | Err):
        inner = "" if value.value is None else _short(value.value, limit)
        text = f"{'ok' if isinstance(value, Ok) else 'err'}({inner})"
    elif isinstance(value, Variant):
        text = value.case if value.value is None else f"{value.case}({_short(value.value, limit)})"
    elif _is_message(value):
        text = f"{value['name']} {_body_text(len(value['body']), bytes(value['body']))}"
    elif isinstance(value, bytes | bytearray):
        data = bytes(value[: limit * 4])
        try:
            text = data.decode()
        except UnicodeDecodeError:
            text = f"<{len(value)} bytes>"
        else:
            text = text if len(value) <= len(data) else text + "…"
    elif isinstance(value, str):
        text = repr(value)
    elif isinstance(value, list | tuple):
        text = (
            "["
            + ", ".join(_short(v, limit) for v in value[:4])
            + (", …]" if len(value) > 4 else "]")
        )
    elif isinstance(value, dict):
        items = list(value.items())[:4]
        text = "{" + ", ".join(f"{_short(k, 12)}: {_short(v, limit)}" for k, v in items)
        text += ", …}" if len(value) > 4 else "}"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _is_message(value: Any) -> bool:
    """A message as the agent interface passes it (an ask's, a send's, a reply's)."""
    return (
        isinstance(value, dict)
        and value.keys() == {"name", "body"}
        and isinstance(value["name"], str)
        and isinstance(value["body"], bytes | bytearray)
    )


def _body_text(size: int, head: bytes) -> str:
    from mighty.agents._process import decode_body

    if size == 0:
        return "null"
    if size == len(head):
        with contextlib.suppress(Exception):  # a body is the sender's bytes; else its size
            return _short(decode_body(head), 60)
    return f"<{size} bytes>"


def _import_entry(position: int, record: dict[str, Any], count: int) -> HistoryEntry:
    interface = str(record.get("if", "?"))
    function = str(record.get("fn", "?"))
    args = record.get("args")
    short_if = interface.partition("@")[0].rpartition("/")[2] or interface
    if function == "call" and isinstance(args, list) and len(args) == 2:
        call = f"{short_if}.call {_short(args[0], 30)} {_short(args[1], 50)}"
    elif function in ("ask", "send") and isinstance(args, list) and len(args) >= 2:
        call = f"{short_if}.{function} {_short(args[0], 30)} {_short(args[1], 60)}"
    else:
        call = f"{short_if}.{function}({_short(args, 50)[1:-1] if isinstance(args, list) else ''})"
    outcome = str(record.get("out", "ok"))
    summary = f"{call} -> {_short(record.get('res'), 60)}"
    if outcome != "ok":
        summary += f" ({outcome})"
    return HistoryEntry(
        position,
        "import",
        summary[: 2 * _SUMMARY],
        None,
        {"import": count, "interface": interface, "function": function, "outcome": outcome},
    )


_HTTP_TYPES = "wasi:http/types"
_HTTP_HANDLER = "wasi:http/outgoing-handler"
_EXCHANGE_INTERFACES = frozenset({_HTTP_TYPES, _HTTP_HANDLER, "wasi:io/streams", "wasi:io/poll"})
_REQUEST_STARTS = frozenset(
    {"[constructor]fields", "[static]fields.from-list", "[constructor]outgoing-request"}
)


def _interface(record: dict[str, Any]) -> str:
    return str(record.get("if", "?")).partition("@")[0]


class _Exchange:
    """The imports of one outgoing HTTP request, from its first ``wasi:http`` call to the last
    read of its response: one history entry (see the module doc)."""

    def __init__(self, position: int, first: int) -> None:
        self.position = position
        self.first = first
        self.last = first
        self.method, self.scheme, self.authority, self.path = "GET", "https", "", "/"
        self.sent = 0
        self.handled = False
        self.error = ""
        self.status: int | None = None
        self.received = 0
        self.outcome = "ok"

    @staticmethod
    def opens(record: dict[str, Any]) -> bool:
        return _interface(record) in (_HTTP_TYPES, _HTTP_HANDLER)

    def takes(self, record: dict[str, Any]) -> bool:
        """Whether ``record`` is a call of this request (not of the guest's next one)."""
        if _interface(record) not in _EXCHANGE_INTERFACES:
            return False
        return not (self.handled and str(record.get("fn")) in _REQUEST_STARTS)

    def add(self, record: dict[str, Any], count: int) -> None:
        self.last = count
        function, res = str(record.get("fn", "")), record.get("res")
        args = record.get("args")
        value = args[1] if isinstance(args, list) and len(args) > 1 else None
        if str(record.get("out", "ok")) != "ok":
            self.outcome = str(record.get("out"))
        if function.endswith("outgoing-request.set-method") and isinstance(value, Variant):
            self.method = str(value.value) if value.case == "other" else value.case.upper()
        elif function.endswith("outgoing-request.set-scheme") and isinstance(value, Variant):
            self.scheme = (str(value.value) if value.case == "other" else value.case).lower()
        elif function.endswith("outgoing-request.set-authority") and isinstance(value, str):
            self.authority = value
        elif function.endswith("outgoing-request.set-path-with-query") and isinstance(value, str):
            self.path = value
        elif function.startswith("[method]output-stream.") and "write" in function:
            if isinstance(value, bytes | bytearray) and isinstance(res, Ok):
                self.sent += len(value)
        elif function == "handle" and _interface(record) == _HTTP_HANDLER:
            self.handled = True
            if isinstance(res, Err):
                self.error = _short(res.value, 40)
        elif function == "[method]future-incoming-response.get":
            if isinstance(res, Ok) and isinstance(res.value, Err):
                self.error = _short(res.value.value, 40)
        elif function == "[method]incoming-response.status" and isinstance(res, int):
            self.status = res
        elif (
            function.startswith("[method]input-stream.")
            and "read" in function
            and isinstance(res, Ok)
            and isinstance(res.value, bytes | bytearray)
        ):
            self.received += len(res.value)

    def entry(self) -> HistoryEntry:
        url = f"{self.scheme}://{self.authority}{self.path}"
        request = f"http {self.method} {_short(url, 80)[1:-1]}, {self.sent}-byte body"
        if self.error:
            answer = f"error {self.error}"
        elif self.status is None:
            answer = "no response logged"
        else:
            answer = f"{self.status}, {self.received}-byte body read"
        calls = self.last - self.first + 1
        summary = f"{request} -> {answer} ({calls} imports)"
        if self.outcome != "ok":
            summary += f" ({self.outcome})"
        detail = {
            "import": self.last,
            "first_import": self.first,
            "imports": calls,
            "interface": _HTTP_HANDLER,
            "function": "handle",
            "outcome": self.outcome,
            "http": {
                "method": self.method,
                "url": url,
                "status": self.status,
                "error": self.error or None,
                "request_bytes": self.sent,
                "response_bytes": self.received,
            },
        }
        return HistoryEntry(self.position, "import", summary[: 2 * _SUMMARY], None, detail)


class _Entries:
    """The history entries of a log's records, fed one by one from ``position``: one per
    import or ``end``, except the calls of one HTTP request, one entry for them all."""

    def __init__(self, position: int) -> None:
        self.position = position
        self.count = 0
        self.exchange: _Exchange | None = None

    def feed(self, record: dict[str, Any]) -> list[HistoryEntry]:
        """The entries ``record`` completes (none while an HTTP request's calls go on)."""
        kind = record.get("k")
        exchange = self.exchange
        if kind == "import" and exchange is not None and exchange.takes(record):
            self.count += 1
            exchange.add(record, self.count)
            return []
        if kind != "import" and not (kind == "export" and record.get("fn") == "handle"):
            return []
        done = self.flush()
        if kind == "import":
            self.count += 1
            if _Exchange.opens(record):
                self.exchange = _Exchange(self.position, self.count)
                self.exchange.add(record, self.count)
            else:
                done.append(_import_entry(self.position, record, self.count))
        else:
            ok = bool(record.get("ok"))
            said = "handle returned" if ok else f"handle failed: {_short(record.get('error'))}"
            done.append(HistoryEntry(self.position, "end", said, None, {"ok": ok}))
        self.position += 1
        return done

    def flush(self) -> list[HistoryEntry]:
        """The HTTP request under way as an entry (its calls so far), if there is one."""
        exchange, self.exchange = self.exchange, None
        return [] if exchange is None else [exchange.entry()]


class _Log:
    """The records of one import log, read lazily; ``JournalCorrupt`` for damage."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reader: TraceReader | None = None
        self.empty = False
        """The log ends inside its header (a crash as it was created): no records."""
        try:
            self.reader = TraceReader(path)
        except TraceTruncated:
            self.empty = True
        except TraceError as exc:
            raise JournalCorrupt(f"{path}: {exc}") from None
        except OSError as exc:
            raise JournalCorrupt(f"{path}: cannot read it: {exc.strerror or exc}") from None
        self.created = None if self.reader is None else self.reader.header.get("created")

    @property
    def truncated(self) -> bool:
        return self.empty or (self.reader is not None and self.reader.truncated)

    @property
    def readable_bytes(self) -> int:
        return 0 if self.reader is None else self.reader.readable_bytes

    @property
    def header(self) -> dict[str, Any]:
        return {} if self.reader is None else self.reader.header

    def records(self) -> Iterator[dict[str, Any]]:
        if self.reader is None:
            return
        try:
            yield from self.reader.records(schema=True)
        except TraceError as exc:
            raise JournalCorrupt(f"{self.path}: {exc}") from None
        except OSError as exc:
            raise JournalCorrupt(f"{self.path}: cannot read it: {exc.strerror or exc}") from None

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def _count_frames(path: Path, start: int) -> int:
    """Records (frames that are not blobs) of ``path`` from byte ``start``, by their prefixes
    alone: 12 bytes and the payload's first 8 read per frame, so a log of any size is counted
    in constant memory. A damaged prefix is JournalCorrupt; a torn or zeroed tail ends it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise JournalCorrupt(f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        size = os.fstat(fd).st_size
        pos, count = start, 0
        while pos + _PREFIX.size <= size:
            prefix = os.pread(fd, _PREFIX.size, pos)
            if prefix.count(0) == len(prefix):
                break  # a zeroed tail (the reader stops there too)
            length, _crc, prefix_crc = _PREFIX.unpack(prefix)
            if zlib.crc32(prefix[:8]) != prefix_crc or length > MAX_FRAME:
                raise JournalCorrupt(f"{path}: frame at byte {pos}: its prefix is damaged")
            if pos + _PREFIX.size + length > size:
                break  # torn
            if os.pread(fd, len(_BLOB_HEAD), pos + _PREFIX.size) != _BLOB_HEAD:
                count += 1
            pos += _PREFIX.size + length
        return count
    finally:
        os.close(fd)


def _chosen_log(state_dir: Path, address: str) -> Path | None:
    """The log recovery would answer from: the current one, or the one a crash during a
    recovery left beside it (``.prev``) when that holds more imports (mighty.agents._journal)."""
    current = _log_path(state_dir, address)
    previous = current.with_name(current.name + ".prev")
    if not previous.is_file():
        return current if current.is_file() else None
    if not current.is_file():
        return previous

    def imports(path: Path) -> int:
        try:
            log = _Log(path)
        except JournalCorrupt:
            return -1
        count = 0
        try:
            for record in log.records():
                count += record.get("k") == "import"
                if log.readable_bytes >= READ_BYTES:
                    break  # a log this long wins; its length past here is not needed
        except JournalCorrupt:
            return -1
        finally:
            log.close()
        return count

    return current if imports(current) >= imports(previous) else previous


def _open_agent(view: StoreView, agent: str) -> tuple[str, Any]:
    address = view.find(agent)
    row = None if address is None else view.get(address)
    if address is None or row is None:
        known = view.durable(11)
        names = ", ".join(a + (f" ({n})" if n else "") for a, n in known[:10]) or "none"
        if len(known) > 10:
            names += ", …"
        raise UnknownAgent(
            f"no durable agent {agent!r} in state_dir {view.directory} (stored: {names})"
        )
    return address, row


def read_history(
    state_dir: str | os.PathLike[str], agent: str, *, limit: int = HISTORY_LIMIT
) -> AgentHistory:
    """The history of durable agent ``agent`` (a name or an address) under ``state_dir``:
    at most ``limit`` entries, the rest counted in ``more``. Reads only (a live runtime may
    hold the store)."""
    directory = Path(state_dir)
    with StoreView(directory) as view:
        address, row = _open_agent(view, agent)
        pending = view.inbox_count(address)
        heads = view.inbox_heads(address, max(limit, 1))
    history = AgentHistory(address, row.name, row.type, directory, None, [])
    entries = history.entries

    def add(entry: HistoryEntry) -> bool:
        if len(entries) < limit:
            entries.append(entry)
            return True
        history.more += 1
        return False

    add(
        HistoryEntry(
            0,
            "checkpoint",
            f"snapshot of {len(row.state)} bytes (component {row.component[:12]})",
            None,
            {"component": row.component, "schema": row.schema, "bytes": len(row.state)},
        )
    )
    log = _chosen_log(directory, address)
    history.log = log
    position = 1
    rest = list(heads)
    if log is not None:
        before = history.more
        position = _read_log(history, log, rest.pop(0) if rest else None, add, position)
        if history.more > before:
            # The log was cut short: later messages are counted, not numbered (their
            # positions would depend on the bound).
            history.more += len(rest)
            rest = []
    for seq, sender, name, size, head in rest:
        add(_message(position, seq, sender, name, size, head, None, in_flight=False))
        position += 1
    history.more += max(0, pending - len(heads))
    return history


def _read_log(
    history: AgentHistory,
    log: Path,
    first: tuple[int, str, str, int, bytes] | None,
    add: Callable[[HistoryEntry], bool],
    position: int,
) -> int:
    """The in-flight message ``first`` and the entries of its log, from ``position``; the
    next position."""
    stopped_at = -1
    reader = _Log(log)
    try:
        created = reader.created if isinstance(reader.created, str) else None
        if first is None:
            history.stale = True
        else:
            seq, sender, name, size, head = first
            add(_message(position, seq, sender, name, size, head, created, in_flight=True))
            position += 1
        entries = _Entries(position)
        for record in reader.records():
            batch = entries.feed(record)
            if not batch and (entries.exchange is None or reader.readable_bytes < READ_BYTES):
                continue
            added = [add(entry) for entry in batch]
            if not all(added) or reader.readable_bytes >= READ_BYTES:
                for entry in entries.flush():
                    add(entry)  # listed, or counted past the limit
                stopped_at = reader.readable_bytes
                break
        else:
            for entry in entries.flush():
                add(entry)
        position = entries.position
        history.torn = reader.truncated
    finally:
        reader.close()
    if stopped_at >= 0:
        # The rest of the log, counted by its frames, never decoded (see the module doc).
        history.more += _count_frames(log, stopped_at)
    return position


def _message(
    position: int,
    seq: int,
    sender: str,
    name: str,
    size: int,
    head: bytes,
    time: str | None,
    *,
    in_flight: bool,
) -> HistoryEntry:
    state = "in flight" if in_flight else "pending"
    who = f"{_short(name, 40)[1:-1]} from {_short(sender, 40)[1:-1]}"
    summary = f"{who}: {_body_text(size, head)} ({state})"
    return HistoryEntry(
        position,
        "message",
        summary,
        time,
        {"seq": seq, "message": name, "sender": sender, "bytes": size, "in_flight": in_flight},
    )


def fork_agent(state_dir: str | os.PathLike[str], agent: str, at: int, new_name: str) -> ForkResult:
    """Store a new durable agent ``new_name`` whose state is ``agent``'s at position ``at``
    (see the module doc). Takes the store's lock: not while a runtime holds the ``state_dir``
    (BadStateDir). ForkRefused for a position past the history or inside a stale log, or a
    name already stored."""
    from mighty.agents._store import SnapshotStore, StoredSnapshot

    directory = Path(state_dir)
    if not new_name or len(new_name) > 200 or ":" in new_name:
        raise ForkRefused(f"fork name {new_name!r}: give a name without ':' (at most 200 chars)")
    history = read_history(directory, agent, limit=max(at + 1, 1))
    last = len(history.entries) - 1 + history.more
    if at > last:
        raise ForkRefused(
            f"{history.address} has no position {at}: its history runs from 0 (its "
            f"checkpoint) to {last}"
        )
    if at >= len(history.entries):
        raise ForkRefused(
            f"{history.address}: position {at} is past the {READ_BYTES >> 20} MiB of its log "
            f"that is read; fork at {len(history.entries) - 1} or before"
        )
    entry = history.entries[at]
    if history.stale and entry.kind != "checkpoint":
        raise ForkRefused(
            f"{history.address}: position {at} is in a log whose message was already "
            "checkpointed; fork at 0 (the checkpoint)"
        )
    messages = [e for e in history.entries[: at + 1] if e.kind == "message"]
    # The log's imports up to ``at``: an HTTP request's entry stands for all its calls.
    imports = max(
        (int(e.detail["import"]) for e in history.entries[: at + 1] if e.kind == "import"),
        default=0,
    )
    upto = int(messages[-1].detail["seq"]) if messages else 0
    store = SnapshotStore(directory)
    try:
        if store.address_of(new_name) is not None:
            raise ForkRefused(f"the name {new_name!r} is already a durable agent's in {directory}")
        with StoreView(directory) as view:
            row = view.get(history.address)
            rows = view.inbox_rows(history.address, upto) if messages else []
        if row is None:
            raise UnknownAgent(f"{history.address} left state_dir {directory} meanwhile")
        address = f"{row.type}:{store.max_pid() + 1}"
        log = None
        if messages and history.log is not None and messages[0].detail.get("in_flight"):
            log = _log_path(directory, address)
            # Past the in-flight message's entries, its whole log; inside them, up to ``at``.
            whole = entry.kind == "message" and not entry.detail.get("in_flight")
            _copy_log(history.log, log, address, new_name, imports, whole=whole)
        snapshot = StoredSnapshot(
            address, row.type, new_name, row.component, row.schema, True, row.state
        )
        try:
            store.put_forked(snapshot, [(s, n, b) for _q, s, n, b in rows])
        except BaseException:
            if log is not None:
                log.unlink(missing_ok=True)
            raise
    finally:
        store.close()
    return ForkResult(address, new_name, history.address, at, len(rows), imports, log)


def _copy_log(
    source: Path, target: Path, address: str, name: str, imports: int, *, whole: bool
) -> None:
    """The log at ``source`` written to ``target`` (the fork's own), keeping its records up to
    its ``imports``-th import (all of them with ``whole``); the records name the fork."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        raise ForkRefused(f"{target} exists already; the fork would share it")
    reader = _Log(source)
    header = {k: v for k, v in reader.header.items() if k not in _FILLED}
    recorder = Recorder(target, flush="call", positions=False, **header)
    count = 0
    try:
        for record in reader.records():
            if record.get("k") == "import":
                if not whole and count >= imports:
                    break
                count += 1
            if record.get("k") == "journal":
                # Which message the original's log is of: the fork's messages have other
                # numbers, and a log that names none is taken for the first (see _journal).
                continue
            copied = dict(record)
            if "a" in copied:
                copied["a"] = address
            if copied.get("k") == "instance" and "name" in copied:
                copied["name"] = name
            recorder.append(copied)
    except BaseException:
        recorder.close(sync=False)
        target.unlink(missing_ok=True)
        raise
    finally:
        reader.close()
    recorder.close()


_FILLED = frozenset({"format", "mighty", "wasmtime", "engine"})


def export_trace(state_dir: str | os.PathLike[str], agent: str, out: str | os.PathLike[str]) -> int:
    """Write ``agent``'s message in flight as a trace `mty replay` and `mty debug` run: a new
    instance of its component restored from the checkpoint (instantiation and ``restore``
    recorded live here: the import log leaves them out, they are recomputed), then the
    message's ``handle`` call with the logged imports, ended as interrupted where the log ends
    (replay stops there, as for a cancelled call). Returns the imports copied.

    :class:`BadInput` when there is nothing to replay (no message in flight: the runtime keeps
    no log of checkpointed messages), the component is not found, or ``out`` exists."""
    from mighty.engine import Component

    directory, target = Path(state_dir), Path(out)
    history = read_history(directory, agent, limit=1)
    if history.log is None or history.stale:
        raise BadInput(
            f"{history.address} has no message in flight, so no log to replay: a checkpointed "
            "message's log is deleted (record the system with --record to keep every call)"
        )
    with StoreView(directory) as view:
        row = view.get(history.address)
    if row is None:
        raise UnknownAgent(f"{history.address} left state_dir {directory} meanwhile")
    reader = _Log(history.log)
    try:
        records = reader.records()
        head = next(records, None)
        if head is None or head.get("k") != "instance" or head.get("component") != row.component:
            raise JournalCorrupt(f"{history.log}: its first record is not the agent's instance")
        path = Path(str(head.get("path", "")))
        try:
            component = Component.load(path)
        except (OSError, BadInput) as exc:
            raise BadInput(
                f"{history.address}: its component {path} cannot be loaded: {exc}"
            ) from None
        if component.sha256 != row.component:
            raise BadInput(
                f"{history.address}: {path} is component {component.sha256[:12]} now, the log "
                f"was written by {row.component[:12]}"
            )
        if target.exists():
            raise BadInput(f"{target} exists already")
        restored = _restored(component, row.state, history, target)
        recorder = Recorder(target, flush="call", positions=False)
        try:
            steps = 0
            for record in restored:
                steps = max(steps, int(record.get("s", 0)))
                recorder.append(record)
            imports = _append_log(recorder, records, steps, history.address)
        except BaseException:
            recorder.close(sync=False)
            target.unlink(missing_ok=True)
            raise
        recorder.close()
    finally:
        reader.close()
    return imports


def _restored(
    component: Any, state: bytes, history: AgentHistory, target: Path
) -> list[dict[str, Any]]:
    """The records of a new instance of ``component`` restored from ``state``, recorded live
    (into a scratch trace beside ``target``, deleted), without its ``close`` record."""
    import tempfile

    from mighty.abi import Ok
    from mighty.budget import Budget
    from mighty.instance import Instance
    from mighty.trace import answer_gate

    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        path = Path(scratch) / "restore.trace"
        budget = Budget(fuel=10**10)
        with Recorder(path, flush="call", positions=False) as recorder:
            instance = Instance(
                component,
                budget=budget,
                gate=answer_gate(component),
                record=recorder,
                agent=history.address,
                agent_name=history.name,
            )
            try:
                result = instance.call("restore", state, budget=budget)
            finally:
                instance.close()
        if result != Ok(None):
            raise BadInput(f"{history.address}: restore from its checkpoint failed: {result}")
        with TraceReader(path) as reader:
            return [r for r in reader.records() if r.get("k") != "close"]


def _append_log(
    recorder: Recorder, records: Iterator[dict[str, Any]], steps: int, address: str
) -> int:
    """The log's call and imports after step ``steps`` of instance 1, then an end that says
    the call was interrupted where the log ends (an ``end`` the log holds is kept)."""
    imports, ended, budget = 0, False, None
    for record in records:
        kind = record.get("k")
        if kind not in ("call", "import", "export"):
            continue
        if kind == "call" and budget is not None:
            break  # a second call: the log's message ended and the snapshot began
        steps += 1
        copied = {**record, "i": 1, "s": steps, "a": address}
        if kind == "call":
            budget = record.get("budget")
        elif kind == "import":
            imports += 1
        else:
            ended = True
        recorder.append(copied)
        if ended:
            break
    if budget is not None and not ended:
        recorder.append(
            {
                "k": "export",
                "i": 1,
                "s": steps + 1,
                "fn": "handle",
                "res": None,
                "ok": False,
                "error": {"kind": "cancelled", "message": "in flight where the log ends"},
                "fuel": None,
                "memory_peak": None,
                "a": address,
            }
        )
    return imports
