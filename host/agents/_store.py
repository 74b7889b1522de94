"""The snapshot store of hibernated and durable agents: one SQLite database in WAL mode.

``[runtime] state_dir`` names a directory; the store is ``state_dir/agents.sqlite3`` (plus its
``-wal`` and ``-shm`` files) and a lock file, ``state_dir/lock``, held (``flock``) for the
runtime's life so two runtimes never share one store. The kernel drops the lock when the
process dies, so a runtime killed with SIGKILL never leaves the directory locked.

One row per agent address: its type, registered name, the component and schema hashes its
snapshot was taken with, whether it is durable, the snapshot bytes and a SHA-256 digest of
them. A row is read back only through :meth:`SnapshotStore.get`, which checks every column
(types, lengths, the digest) and raises :class:`SnapshotCorrupt` on anything wrong: the store
is a file on disk, so its content is treated as untrusted input. The JSON of each schema hash
seen is kept once in a second table, so a hot swap can check the new component against the
schema of every stored snapshot without reading the snapshots.

Writes of a durable agent's snapshot are committed with ``synchronous = FULL`` (the WAL is
fsynced before the commit returns); the other writes with ``NORMAL`` (they survive the process
dying, and may be lost if the machine loses power, which only matters for agents that are not
durable: those do not outlive their runtime anyway).

:class:`StoreView` reads the same store without the lock and without writing (``mty history``,
beside a live runtime: SQLite WAL lets a reader see the last commit); ``put_forked`` writes a
new agent's row and its journaled messages in one transaction (``mty fork``).

A journaled message's ``seq`` grows for as long as its agent is stored, never reused after its
row is deleted (``inbox_seq`` keeps each agent's last one): the idempotency keys of a message's
calls are derived from it (mighty.wasi), so a number used again would give a new message the
keys of one handled before, and a server honouring keys would drop its effects as repeats.

Rejected: one file per agent (100,000 small files, a rename per write for atomicity, no cheap
"which schemas are stored" query); a key-value store outside the standard library (a new
native dependency for what SQLite, in every Python, does well).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import os
import sqlite3
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mighty._errors import BadInput, HostError

__all__ = [
    "DB_NAME",
    "MAX_SNAPSHOT_BYTES",
    "MAX_TIMER_ROW_BODY",
    "BadStateDir",
    "SnapshotCorrupt",
    "SnapshotRefused",
    "SnapshotStore",
    "StoreError",
    "StoreUnavailable",
    "StoreView",
    "StoredSnapshot",
    "TimerRow",
]

DB_NAME = "agents.sqlite3"
MAX_SNAPSHOT_BYTES = 64 << 20
"""A snapshot larger than this is not stored (the agent stays awake; a durable one crashes)."""
_MAX_TEXT = 1024
_DIGEST = 32

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshots (
    address   TEXT PRIMARY KEY,
    type      TEXT NOT NULL,
    name      TEXT,
    component TEXT NOT NULL,
    schema    TEXT NOT NULL,
    durable   INTEGER NOT NULL,
    state     BLOB NOT NULL,
    digest    BLOB NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS snapshots_name ON snapshots (name) WHERE name IS NOT NULL;
CREATE TABLE IF NOT EXISTS schemas (hash TEXT PRIMARY KEY, json TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox (
    address TEXT NOT NULL,
    seq     INTEGER NOT NULL,
    sender  TEXT NOT NULL,
    name    TEXT NOT NULL,
    body    BLOB NOT NULL,
    PRIMARY KEY (address, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS inbox_seq (address TEXT PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS timers (
    id     INTEGER PRIMARY KEY,
    due    REAL NOT NULL,
    every  REAL,
    sender TEXT NOT NULL,
    target TEXT NOT NULL,
    name   TEXT NOT NULL,
    body   BLOB NOT NULL
);
"""
MAX_INBOX_BODY = 64 << 20
"""Most bytes of one journaled message body; a longer row read back is corrupt."""
MAX_INBOX_ROWS = 1 << 20
"""Most journaled messages read back for one agent at recovery."""
MAX_TIMER_ROW_BODY = 1 << 20
"""Most bytes of a stored timer's body (mighty.agents._timers bounds what it writes the same)."""
TimerRow = tuple[int, float, float | None, str, str, str, bytes]
"""A stored timer: id, due (wall clock), period, sender, target, message name, body."""


class StoreError(HostError):
    """The snapshot store could not do what was asked."""

    kind = "store_error"


class StoreUnavailable(StoreError):
    """The store cannot be written or read: disk full, directory not writable, I/O error."""

    kind = "store_unavailable"


class SnapshotCorrupt(StoreError):
    """A stored snapshot row is damaged (truncated, wrong types, digest mismatch)."""

    kind = "snapshot_corrupt"


class SnapshotRefused(StoreError):
    """The current component refuses a stored snapshot (its schema, or its ``restore``)."""

    kind = "snapshot_refused"


class BadStateDir(BadInput):
    """``state_dir`` cannot hold a snapshot store (not a directory, not writable, in use)."""

    kind = "bad_state_dir"


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    """One agent's stored snapshot, checked."""

    address: str
    type: str
    name: str | None
    component: str
    schema: str
    durable: bool
    state: bytes


class SnapshotStore:
    """The SQLite store under one ``state_dir``; every method may be called from any thread."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        """Open (or create) the store; :class:`BadStateDir`, in one line, if it cannot be used."""
        directory = Path(state_dir)
        self.directory = directory
        self.path = directory / DB_NAME
        if directory.exists() and not directory.is_dir():
            raise BadStateDir(f"state_dir {directory}: not a directory")
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadStateDir(f"state_dir {directory}: cannot create it: {_why(exc)}") from None
        if not directory.is_dir():
            raise BadStateDir(f"state_dir {directory}: not a directory")
        if not os.access(directory, os.W_OK | os.X_OK):
            raise BadStateDir(f"state_dir {directory}: not writable")
        _check_owned(directory)
        self._lock_fd = _take_lock(directory)
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=5.0
            )
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                raise BadStateDir(f"state_dir {directory}: SQLite refused WAL mode")
            self._db.execute("PRAGMA synchronous=NORMAL")
            _bound_heap(self._db)
            # A damaged file opens without complaint and answers lookups with nothing (a name
            # then looks free, and its agent would start afresh at its old address): check
            # the pages once at open, and never write into a damaged store.
            checked = self._db.execute("PRAGMA quick_check").fetchall()
            if [tuple(r) for r in checked] != [("ok",)]:
                first = " ".join(str(checked[0][0]).split()) if checked else "no answer"
                raise BadStateDir(
                    f"state_dir {directory}: {self.path.name} is damaged ({first[:160]}); "
                    "restore it from a backup or move it away"
                )
            self._db.executescript(_SCHEMA)
            self._synchronous = "NORMAL"
        except sqlite3.DatabaseError as exc:
            self._release_lock()
            raise BadStateDir(f"state_dir {directory}: {self.path.name}: {exc}") from None
        except BadStateDir:
            self._release_lock()
            raise

    # -- rows ------------------------------------------------------------------------------

    def put(self, snapshot: StoredSnapshot, *, sync: bool = False, done: int | None = None) -> None:
        """Write (or replace) one agent's row; ``sync``: fsync the WAL before returning.
        ``done``: the journaled message (its inbox ``seq``) this state includes, deleted from
        the inbox in the same transaction, so a crash leaves either both or neither."""
        if len(snapshot.state) > MAX_SNAPSHOT_BYTES:
            raise StoreError(
                f"{snapshot.address}: snapshot of {len(snapshot.state)} bytes is over the "
                f"{MAX_SNAPSHOT_BYTES} byte limit"
            )
        digest = hashlib.sha256(snapshot.state).digest()
        row = (
            snapshot.address,
            snapshot.type,
            snapshot.name,
            snapshot.component,
            snapshot.schema,
            int(snapshot.durable),
            snapshot.state,
            digest,
        )
        with self._writing(sync):
            if done is None:
                self._db.execute("INSERT OR REPLACE INTO snapshots VALUES (?,?,?,?,?,?,?,?)", row)
                return
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("INSERT OR REPLACE INTO snapshots VALUES (?,?,?,?,?,?,?,?)", row)
                self._db.execute(
                    "DELETE FROM inbox WHERE address = ? AND seq = ?", (snapshot.address, done)
                )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def put_forked(self, snapshot: StoredSnapshot, messages: list[tuple[str, str, bytes]]) -> None:
        """A new durable agent's row and its journaled messages ``(sender, name, body)``
        (numbered from 1), in one fsynced transaction (``mty fork``): a crash leaves the whole
        fork or none of it. StoreError if the address is taken."""
        if len(snapshot.state) > MAX_SNAPSHOT_BYTES:
            raise StoreError(
                f"{snapshot.address}: snapshot over the {MAX_SNAPSHOT_BYTES} byte limit"
            )
        digest = hashlib.sha256(snapshot.state).digest()
        row = (
            snapshot.address,
            snapshot.type,
            snapshot.name,
            snapshot.component,
            snapshot.schema,
            int(snapshot.durable),
            snapshot.state,
            digest,
        )
        with self._writing(True):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                taken = self._db.execute(
                    "SELECT 1 FROM snapshots WHERE address = ? UNION ALL "
                    "SELECT 1 FROM inbox WHERE address = ? LIMIT 1",
                    (snapshot.address, snapshot.address),
                ).fetchone()
                if taken is not None:
                    raise StoreError(f"{snapshot.address} is already stored")
                self._db.execute("INSERT INTO snapshots VALUES (?,?,?,?,?,?,?,?)", row)
                for seq, (sender, name, body) in enumerate(messages, 1):
                    self._db.execute(
                        "INSERT INTO inbox VALUES (?,?,?,?,?)",
                        (snapshot.address, seq, sender, name, body),
                    )
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # -- the inbox of durable agents ------------------------------------------------------

    def inbox_put(self, address: str, sender: str, name: str, body: bytes) -> int:
        """Journal a message accepted for ``address`` (fsynced); its ``seq``."""
        with self._writing(True):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seq = self._inbox_insert(address, sender, name, body)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return seq

    def _inbox_insert(self, address: str, sender: str, name: str, body: bytes) -> int:
        """Add a journaled message inside the caller's transaction; its ``seq``, past every
        one ``address`` had (see the module doc)."""
        row = self._db.execute(
            "SELECT max((SELECT ifnull(max(seq), 0) FROM inbox WHERE address = ?), "
            "(SELECT ifnull(max(seq), 0) FROM inbox_seq WHERE address = ?))",
            (address, address),
        ).fetchone()
        seq = int(row[0]) + 1 if row else 1
        self._db.execute("INSERT INTO inbox VALUES (?,?,?,?,?)", (address, seq, sender, name, body))
        self._db.execute(
            "INSERT INTO inbox_seq VALUES (?, ?) ON CONFLICT (address) DO UPDATE SET seq = ?",
            (address, seq, seq),
        )
        return seq

    def inbox_done(self, address: str, seq: int) -> None:
        """The journaled message ``seq`` will not be handled again (it crashed its agent, was
        refused, or never made it into the mailbox)."""
        with self._writing(False):
            self._db.execute("DELETE FROM inbox WHERE address = ? AND seq = ?", (address, seq))

    # -- durable timers (mighty.agents._timers) ----------------------------------------------

    def timer_put(
        self, due: float, every: float | None, sender: str, target: str, name: str, body: bytes
    ) -> int:
        """Store a new timer (fsynced); its id."""
        with self._writing(True):
            cursor = self._db.execute(
                "INSERT INTO timers (due, every, sender, target, name, body) VALUES (?,?,?,?,?,?)",
                (due, every, sender, target, name, body),
            )
            timer_id = cursor.lastrowid
        assert timer_id is not None
        return int(timer_id)

    def timer_next(self, timer_id: int, due: float | None) -> None:
        """A timer fired (or was cancelled): move it to ``due``, or delete it (None)."""
        with self._writing(True):
            if due is None:
                self._db.execute("DELETE FROM timers WHERE id = ?", (timer_id,))
            else:
                self._db.execute("UPDATE timers SET due = ? WHERE id = ?", (due, timer_id))

    def timer_fired(
        self,
        timer_id: int,
        due: float | None,
        address: str,
        sender: str,
        name: str,
        body: bytes,
    ) -> int:
        """A timer fired at a durable agent: its message journaled in ``address``'s inbox and
        the timer moved to ``due`` (or deleted) in one transaction (fsynced); the inbox seq."""
        with self._writing(True):
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seq = self._inbox_insert(address, sender, name, body)
                if due is None:
                    self._db.execute("DELETE FROM timers WHERE id = ?", (timer_id,))
                else:
                    self._db.execute("UPDATE timers SET due = ? WHERE id = ?", (due, timer_id))
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return seq

    def timers(self, limit: int) -> list[TimerRow]:
        """The stored timers, ``(id, due, every, sender, target, name, body)``, checked;
        SnapshotCorrupt when a row is damaged or the table is over its bounds (``limit``
        rows)."""
        with self._reading():
            over = self._db.execute(
                "SELECT count(*), ifnull(max(length(body)), 0), "
                "ifnull(max(length(sender) + length(target) + length(name)), 0) FROM timers"
            ).fetchone()
            count, body, texts = over if over is not None else (0, 0, 0)
            if count > limit or body > MAX_TIMER_ROW_BODY or texts > 3 * _MAX_TEXT:
                raise SnapshotCorrupt(
                    f"the stored timers are over their bounds ({count} rows, a body of {body} "
                    "bytes)"
                )
            rows = self._db.execute(
                "SELECT id, due, every, sender, target, name, body FROM timers ORDER BY id"
            ).fetchall()
        timers: list[TimerRow] = []
        for timer_id, due, every, sender, target, name, data in rows:
            if not (
                isinstance(timer_id, int)
                and isinstance(due, float)
                and math.isfinite(due)
                and (every is None or (isinstance(every, float) and math.isfinite(every)))
                and isinstance(sender, str)
                and isinstance(target, str)
                and isinstance(name, str)
                and isinstance(data, bytes)
            ):
                raise SnapshotCorrupt(f"stored timer {timer_id!r}: the row is damaged")
            timers.append((timer_id, due, every, sender, target, name, data))
        return timers

    def inbox_addresses(self) -> list[str]:
        """The addresses with journaled messages not yet handled."""
        with self._reading():
            rows = self._db.execute("SELECT DISTINCT address FROM inbox").fetchall()
        return [r[0] for r in rows if isinstance(r[0], str)]

    def inbox(self, address: str) -> list[tuple[int, str, str, bytes]]:
        """``address``'s journaled messages, oldest first: ``(seq, sender, name, body)``; a row
        that is damaged or over the bounds raises SnapshotCorrupt (checked in SQL first)."""
        with self._reading():
            over = self._db.execute(
                "SELECT count(*), ifnull(max(length(body)), 0), "
                "ifnull(max(length(sender) + length(name)), 0) FROM inbox WHERE address = ?",
                (address,),
            ).fetchone()
            count, body, texts = over if over is not None else (0, 0, 0)
            if count > MAX_INBOX_ROWS or body > MAX_INBOX_BODY or texts > 2 * _MAX_TEXT:
                raise SnapshotCorrupt(
                    f"{address}: the journaled inbox is over its bounds ({count} rows, a body "
                    f"of {body} bytes)"
                )
            rows = self._db.execute(
                "SELECT seq, sender, name, body FROM inbox WHERE address = ? ORDER BY seq",
                (address,),
            ).fetchall()
        checked: list[tuple[int, str, str, bytes]] = []
        for seq, sender, name, body_bytes in rows:
            if not (
                isinstance(seq, int)
                and isinstance(sender, str)
                and isinstance(name, str)
                and isinstance(body_bytes, bytes)
            ):
                raise SnapshotCorrupt(f"{address}: a journaled message row is damaged")
            checked.append((seq, sender, name, body_bytes))
        return checked

    def get(self, address: str) -> StoredSnapshot | None:
        """The checked row of ``address`` (None: no row); :class:`SnapshotCorrupt` if damaged."""
        with self._reading():
            # The sizes first, in SQL: a 600 MB state must be refused before it is read.
            sizes = self._db.execute(
                "SELECT ifnull(length(type), 0) + ifnull(length(name), 0) "
                "+ ifnull(length(component), 0) + ifnull(length(schema), 0) "
                "+ ifnull(length(digest), 0), length(state) FROM snapshots WHERE address = ?",
                (address,),
            ).fetchone()
            if sizes is None:
                return None
            texts, state = sizes
            if (texts is not None and texts > 8 * _MAX_TEXT) or (
                state is not None and state > MAX_SNAPSHOT_BYTES
            ):
                raise SnapshotCorrupt(
                    f"{address}: stored snapshot is corrupt: a column is over its size limit "
                    f"(state {state} bytes; at most {MAX_SNAPSHOT_BYTES})"
                )
            row = self._db.execute(
                "SELECT address, type, name, component, schema, durable, state, digest "
                "FROM snapshots WHERE address = ?",
                (address,),
            ).fetchone()
        return None if row is None else _check_row(address, row)

    def address_of(self, name: str) -> str | None:
        """The address of the durable row registered under ``name``, if any."""
        with self._reading():
            row = self._db.execute(
                "SELECT address FROM snapshots WHERE name = ? AND durable = 1", (name,)
            ).fetchone()
        if row is None or not isinstance(row[0], str):
            return None
        return row[0]

    def delete(self, address: str) -> None:
        with self._writing(False):
            self._db.execute("DELETE FROM snapshots WHERE address = ?", (address,))

    def discard_volatile(self) -> int:
        """Delete the rows of agents that were not durable (left by an earlier runtime)."""
        with self._writing(False):
            return self._db.execute("DELETE FROM snapshots WHERE durable = 0").rowcount

    def max_pid(self) -> int:
        """The largest pid among stored addresses (``type:pid``), 0 when none."""
        best = 0
        with self._reading():
            rows = self._db.execute("SELECT address FROM snapshots").fetchall()
        for (address,) in rows:
            if isinstance(address, str):
                tail = address.rpartition(":")[2]
                if tail.isdigit() and len(tail) < 19:
                    best = max(best, int(tail))
        return best

    def count(self) -> int:
        with self._reading():
            row = self._db.execute("SELECT count(*) FROM snapshots").fetchone()
        return int(row[0]) if row else 0

    # -- schemas ---------------------------------------------------------------------------

    def put_schema(self, schema_hash: str, text: str) -> None:
        with self._writing(False):
            self._db.execute("INSERT OR IGNORE INTO schemas VALUES (?, ?)", (schema_hash, text))

    def schemas_of(self, type_name: str) -> dict[str, str | None]:
        """Schema hash -> its JSON (None when the JSON row is missing) of ``type_name``'s rows."""
        with self._reading():
            rows = self._db.execute(
                "SELECT DISTINCT s.schema, j.json FROM snapshots s "
                "LEFT JOIN schemas j ON j.hash = s.schema WHERE s.type = ?",
                (type_name,),
            ).fetchall()
        return {
            str(h): (text if isinstance(text, str) else None)
            for h, text in rows
            if isinstance(h, str)
        }

    # -- the files -------------------------------------------------------------------------

    def size_bytes(self) -> int:
        """The database, its WAL and shared-memory file, in bytes."""
        total = 0
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                total += os.stat(f"{self.path}{suffix}").st_size
        return total

    def checkpoint(self) -> None:
        """Fold the WAL into the database file (and truncate it)."""
        with self._writing(False):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        with self._lock:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._release_lock()

    def _release_lock(self) -> None:
        fd, self._lock_fd = self._lock_fd, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    @contextlib.contextmanager
    def _writing(self, sync: bool) -> Iterator[None]:
        with self._lock:
            try:
                wanted = "FULL" if sync else "NORMAL"
                if wanted != self._synchronous:
                    self._db.execute(f"PRAGMA synchronous={wanted}")
                    self._synchronous = wanted
                yield
            except sqlite3.DatabaseError as exc:
                raise StoreUnavailable(f"snapshot store {self.path}: {exc}") from None
            except sqlite3.ProgrammingError as exc:  # closed
                raise StoreUnavailable(f"snapshot store {self.path}: {exc}") from None
            except MemoryError:
                raise SnapshotCorrupt(
                    f"snapshot store {self.path}: a row is larger than the store allows "
                    f"({_HEAP_LIMIT >> 20} MiB of SQLite memory)"
                ) from None

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        with self._lock:
            try:
                yield
            except MemoryError:
                raise SnapshotCorrupt(
                    f"snapshot store {self.path}: a row is larger than the store allows "
                    f"({_HEAP_LIMIT >> 20} MiB of SQLite memory)"
                ) from None
            except sqlite3.DatabaseError as exc:
                # A damaged database file reads as "malformed": the rows cannot be trusted.
                if "malformed" in str(exc) or "not a database" in str(exc):
                    raise SnapshotCorrupt(f"snapshot store {self.path}: {exc}") from None
                raise StoreUnavailable(f"snapshot store {self.path}: {exc}") from None
            except sqlite3.ProgrammingError as exc:
                raise StoreUnavailable(f"snapshot store {self.path}: {exc}") from None


_HEAP_LIMIT = 2 * MAX_SNAPSHOT_BYTES + (64 << 20)
"""SQLite's memory while the store works: a largest legal row twice over, and room besides."""


def _bound_heap(db: sqlite3.Connection) -> None:
    """SQLite may use at most :data:`_HEAP_LIMIT` of memory.

    A row of a WITHOUT ROWID table is read whole even to read its key (SQLite loads the record
    to compare keys), so a 600 MB blob edited into the file would cost 600 MB at the first
    lookup, before any size check in SQL could refuse it. With the limit, SQLite fails the
    allocation instead (a MemoryError, reported as SnapshotCorrupt): measured, +0 MB to refuse
    that row instead of +600 MB. The limit is the SQLite library's, for the whole process, and
    the pragma can only lower it: opening a store lowers it to 192 MiB (a lower one set before
    stays), which bounds every other user of SQLite in the process too (their page caches are
    2 MiB each by default). Rejected: a rowid table for states (incremental blob reads, but a
    migration of every store written so far); setting and restoring the limit around each
    operation (the pragma cannot raise it back).
    """
    db.execute(f"PRAGMA hard_heap_limit={_HEAP_LIMIT}")


def _check_row(address: str, row: tuple[object, ...]) -> StoredSnapshot:
    """Every column of a row read back, checked: the file may have been damaged or edited."""
    stored, type_name, name, component, schema, durable, state, digest = row

    def bad(why: str) -> SnapshotCorrupt:
        return SnapshotCorrupt(f"{address}: stored snapshot is corrupt: {why}")

    def text(value: object, label: str) -> str:
        if not isinstance(value, str) or not value or len(value) > _MAX_TEXT:
            raise bad(f"bad {label} column")
        return value

    type_text, component_text, schema_text = (
        text(type_name, "type"),
        text(component, "component"),
        text(schema, "schema"),
    )
    if stored != address:
        raise bad("address column does not match")
    if name is not None and (not isinstance(name, str) or len(name) > _MAX_TEXT):
        raise bad("bad name column")
    name_text = name if isinstance(name, str) else None
    if durable not in (0, 1):
        raise bad("bad durable column")
    if not isinstance(state, bytes) or len(state) > MAX_SNAPSHOT_BYTES:
        raise bad("state is not a blob within the size limit")
    if not isinstance(digest, bytes) or len(digest) != _DIGEST:
        raise bad("bad digest column")
    if hashlib.sha256(state).digest() != digest:
        raise bad(f"digest mismatch ({len(state)} bytes; truncated or altered)")
    return StoredSnapshot(
        address, type_text, name_text, component_text, schema_text, bool(durable), state
    )


def _check_owned(directory: Path) -> None:
    """The directory is ours and its files are files: a store is never written through a
    symlink (into whatever it points at) nor kept in another user's directory."""
    info = directory.stat()
    if info.st_uid != os.getuid():
        raise BadStateDir(
            f"state_dir {directory}: owned by another user (uid {info.st_uid}, we are "
            f"{os.getuid()})"
        )
    for name in (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", "lock"):
        if (directory / name).is_symlink():
            raise BadStateDir(f"state_dir {directory}: {name} is a symlink; refusing to follow it")


def _take_lock(directory: Path) -> int:
    path = directory / "lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise BadStateDir(f"state_dir {directory}: cannot open {path.name}: {_why(exc)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise BadStateDir(
            f"state_dir {directory} is in use by another runtime (its lock file is held)"
        ) from None
    return fd


def _why(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


class StoreView:
    """A read-only look at the store under ``state_dir`` (``mty history``): it takes no lock
    and writes nothing, so it reads a store a live runtime holds (SQLite WAL lets a reader
    see the last committed state beside the writer). Every row read is checked as
    :meth:`SnapshotStore.get` checks it; sizes are checked in SQL before a row is read.
    :class:`BadStateDir` when there is no store to read or it is damaged."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        directory = Path(state_dir)
        self.directory = directory
        self.path = directory / DB_NAME
        if not directory.is_dir():
            why = "no such directory" if not directory.exists() else "not a directory"
            raise BadStateDir(f"state_dir {directory}: {why}")
        if not os.access(directory, os.R_OK | os.X_OK):
            raise BadStateDir(f"state_dir {directory}: not readable")
        if not self.path.is_file():
            raise BadStateDir(f"state_dir {directory}: no snapshot store ({DB_NAME}) in it")
        _check_owned(directory)
        self._lock = threading.Lock()
        uri = f"file:{urllib.request.pathname2url(str(self.path.resolve()))}?mode=ro"
        try:
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=5.0)
            _bound_heap(self._db)
            checked = self._db.execute("PRAGMA quick_check").fetchall()
            if [tuple(r) for r in checked] != [("ok",)]:
                first = " ".join(str(checked[0][0]).split()) if checked else "no answer"
                raise BadStateDir(
                    f"state_dir {directory}: {self.path.name} is damaged ({first[:160]})"
                )
            tables = {
                r[0]
                for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error, AttributeError):
                self._db.close()
            raise BadStateDir(f"state_dir {directory}: {self.path.name}: {exc}") from None
        except BadStateDir:
            self._db.close()
            raise
        if not {"snapshots", "inbox"} <= tables:
            self._db.close()
            raise BadStateDir(
                f"state_dir {directory}: {self.path.name} holds no snapshot store tables"
            )

    def durable(self, limit: int) -> list[tuple[str, str | None]]:
        """Up to ``limit`` durable agents stored: ``(address, name)``, by address."""
        with self._reading():
            rows = self._db.execute(
                "SELECT address, name FROM snapshots WHERE durable = 1 ORDER BY address LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            (a, n if isinstance(n, str) else None)
            for a, n in rows
            if isinstance(a, str) and len(a) <= _MAX_TEXT
        ]

    def find(self, agent: str) -> str | None:
        """The address of the durable agent named or addressed ``agent`` (None: none)."""
        with self._reading():
            row = self._db.execute(
                "SELECT address FROM snapshots WHERE durable = 1 AND (name = ? OR address = ?) "
                "ORDER BY name = ? DESC LIMIT 1",
                (agent, agent, agent),
            ).fetchone()
        return row[0] if row is not None and isinstance(row[0], str) else None

    def get(self, address: str) -> StoredSnapshot | None:
        """The checked row of ``address``, as :meth:`SnapshotStore.get` reads it (its sizes
        checked in SQL first)."""
        with self._reading():
            sizes = self._db.execute(
                "SELECT ifnull(length(type), 0) + ifnull(length(name), 0) "
                "+ ifnull(length(component), 0) + ifnull(length(schema), 0) "
                "+ ifnull(length(digest), 0), length(state) FROM snapshots WHERE address = ?",
                (address,),
            ).fetchone()
            if sizes is None:
                return None
            texts, state = sizes
            if (texts is not None and texts > 8 * _MAX_TEXT) or (
                state is not None and state > MAX_SNAPSHOT_BYTES
            ):
                raise SnapshotCorrupt(
                    f"{address}: stored snapshot is corrupt: a column is over its size limit"
                )
            row = self._db.execute(
                "SELECT address, type, name, component, schema, durable, state, digest "
                "FROM snapshots WHERE address = ?",
                (address,),
            ).fetchone()
        return None if row is None else _check_row(address, row)

    def inbox_count(self, address: str) -> int:
        with self._reading():
            row = self._db.execute(
                "SELECT count(*) FROM inbox WHERE address = ?", (address,)
            ).fetchone()
        return int(row[0]) if row is not None else 0

    def inbox_heads(
        self, address: str, limit: int, head: int = 256
    ) -> list[tuple[int, str, str, int, bytes]]:
        """Up to ``limit`` of ``address``'s journaled messages, oldest first: ``(seq, sender,
        name, body length, the body's first head bytes)``; never a whole body in memory.
        A damaged row raises SnapshotCorrupt."""
        with self._reading():
            over = self._db.execute(
                "SELECT ifnull(max(length(sender) + length(name)), 0) FROM inbox WHERE address = ?",
                (address,),
            ).fetchone()
            if over is not None and int(over[0] or 0) > 2 * _MAX_TEXT:
                raise SnapshotCorrupt(f"{address}: a journaled message row is over its bounds")
            rows = self._db.execute(
                "SELECT seq, sender, name, length(body), ifnull(substr(body, 1, ?), x'') "
                "FROM inbox WHERE address = ? ORDER BY seq LIMIT ?",
                (head, address, limit),
            ).fetchall()
        checked: list[tuple[int, str, str, int, bytes]] = []
        for seq, sender, name, size, first in rows:
            if not (
                isinstance(seq, int)
                and isinstance(sender, str)
                and isinstance(name, str)
                and isinstance(size, int)
                and isinstance(first, bytes)
                and size <= MAX_INBOX_BODY
            ):
                raise SnapshotCorrupt(f"{address}: a journaled message row is damaged")
            checked.append((seq, sender, name, size, first))
        return checked

    def inbox_rows(self, address: str, upto: int) -> list[tuple[int, str, str, bytes]]:
        """``address``'s journaled messages with ``seq <= upto``, whole (``mty fork`` copies
        them), checked as :meth:`SnapshotStore.inbox` checks them."""
        with self._reading():
            over = self._db.execute(
                "SELECT count(*), ifnull(max(length(body)), 0), "
                "ifnull(max(length(sender) + length(name)), 0) FROM inbox "
                "WHERE address = ? AND seq <= ?",
                (address, upto),
            ).fetchone()
            count, body, texts = over if over is not None else (0, 0, 0)
            if count > MAX_INBOX_ROWS or body > MAX_INBOX_BODY or texts > 2 * _MAX_TEXT:
                raise SnapshotCorrupt(f"{address}: the journaled inbox is over its bounds")
            rows = self._db.execute(
                "SELECT seq, sender, name, body FROM inbox WHERE address = ? AND seq <= ? "
                "ORDER BY seq",
                (address, upto),
            ).fetchall()
        checked: list[tuple[int, str, str, bytes]] = []
        for seq, sender, name, data in rows:
            if not (
                isinstance(seq, int)
                and isinstance(sender, str)
                and isinstance(name, str)
                and isinstance(data, bytes)
            ):
                raise SnapshotCorrupt(f"{address}: a journaled message row is damaged")
            checked.append((seq, sender, name, data))
        return checked

    def close(self) -> None:
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._db.close()

    def __enter__(self) -> StoreView:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        with self._lock:
            try:
                yield
            except MemoryError:
                raise SnapshotCorrupt(
                    f"snapshot store {self.path}: a row is larger than the store allows"
                ) from None
            except sqlite3.DatabaseError as exc:
                if "malformed" in str(exc) or "not a database" in str(exc):
                    raise SnapshotCorrupt(f"snapshot store {self.path}: {exc}") from None
                raise StoreUnavailable(f"snapshot store {self.path}: {exc}") from None
            except sqlite3.ProgrammingError as exc:
                raise StoreUnavailable(f"snapshot store {self.path}: {exc}") from None
