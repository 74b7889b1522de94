"""The snapshot store: rows round-trip, damaged rows are typed errors, bad state_dirs one line."""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mighty import Component
from mighty.agents import (
    AgentChild,
    AgentType,
    BadStateDir,
    NoProc,
    Runtime,
    SnapshotCorrupt,
    StoreError,
    SupervisorSpec,
    start_tree,
)
from mighty.agents._manifest import load_manifest
from mighty.agents.hosting import SnapshotStore, StoredSnapshot

texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40)
snapshots = st.builds(
    StoredSnapshot,
    address=texts,
    type=texts,
    name=st.none() | texts,
    component=texts,
    schema=texts,
    durable=st.booleans(),
    state=st.binary(max_size=2048),
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SnapshotStore]:
    """One store for all examples (each example uses addresses of its own)."""
    opened = SnapshotStore(tmp_path_factory.mktemp("state"))
    yield opened
    opened.close()


_fresh = itertools.count()


def unique(snapshot: StoredSnapshot) -> StoredSnapshot:
    return replace(snapshot, address=f"{next(_fresh)}/{snapshot.address}")


@settings(max_examples=60, deadline=None)
@given(snapshot=snapshots.map(unique))
def test_a_row_round_trips(store: SnapshotStore, snapshot: StoredSnapshot) -> None:
    store.put(snapshot)
    assert store.get(snapshot.address) == snapshot
    assert store.get(snapshot.address + "x") is None
    changed = replace(snapshot, state=snapshot.state + b"!")
    store.put(changed)  # a later write replaces it
    assert store.get(snapshot.address) == changed


_COLUMNS = ("address", "type", "name", "component", "schema", "durable", "state", "digest")
_VALUES = st.none() | st.integers(-3, 3) | st.binary(max_size=40) | st.text(max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    snapshot=snapshots.map(unique),
    column=st.sampled_from(_COLUMNS[1:]),
    value=_VALUES,
    flip=st.integers(0, 4095),
)
def test_a_damaged_row_is_snapshot_corrupt_or_still_valid(
    store: SnapshotStore,
    snapshot: StoredSnapshot,
    column: str,
    value: object,
    flip: int,
) -> None:
    """Any column overwritten with any value, or one state byte flipped: the read gives a
    checked row or SnapshotCorrupt, never another exception or an unchecked state."""
    store.put(snapshot)
    if column == "state" and snapshot.state and isinstance(value, int):
        damaged = bytearray(snapshot.state)
        damaged[flip % len(damaged)] ^= 1 << (value % 8)
        value = bytes(damaged)
    with sqlite3.connect(store.path) as db:
        try:
            # Columns are not strictly typed in SQLite: any value lands as it is.
            db.execute(
                f"UPDATE snapshots SET {column} = ? WHERE address = ?", (value, snapshot.address)
            )
        except sqlite3.IntegrityError:  # NULL in a NOT NULL column: no such damage
            return
    try:
        got = store.get(snapshot.address)
    except SnapshotCorrupt as exc:
        error: SnapshotCorrupt | None = exc
    else:
        error = None
    if error is not None:
        assert snapshot.address in str(error)
        return
    assert got is not None
    if column in ("state", "digest"):
        assert got.state == snapshot.state  # only the very same bytes pass the digest


def test_truncated_database_file_is_a_typed_error(tmp_path: Path) -> None:
    state = tmp_path / "state"
    store = SnapshotStore(state)
    store.put(StoredSnapshot("t:1", "t", None, "c", "s", True, b"x" * 100_000))
    store.checkpoint()
    store.close()
    db = state / "agents.sqlite3"
    db.write_bytes(db.read_bytes()[:5000])  # the rows' pages are gone
    (state / "agents.sqlite3-wal").unlink(missing_ok=True)
    (state / "agents.sqlite3-shm").unlink(missing_ok=True)
    try:
        reopened = SnapshotStore(state)
    except BadStateDir as exc:  # SQLite may notice at open
        opened: BadStateDir | SnapshotStore = exc
    else:
        opened = reopened
    if isinstance(opened, BadStateDir):
        assert "\n" not in str(opened)
        return
    try:
        with pytest.raises(StoreError):
            opened.get("t:1")
    finally:
        opened.close()


def test_unusable_state_dirs_are_one_line_errors(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(BadStateDir, match=r"cannot create it|not a directory") as info:
        Runtime(state_dir=a_file / "below")
    assert "\n" not in str(info.value)
    with pytest.raises(BadStateDir, match="not a directory"):
        Runtime(state_dir=a_file)
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "agents.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(BadStateDir, match=r"agents\.sqlite3"):
        Runtime(state_dir=garbage)
    # In use by another runtime (the lock is per open file, so this process counts too).
    with Runtime(state_dir=tmp_path / "busy"), pytest.raises(BadStateDir, match="in use"):
        Runtime(state_dir=tmp_path / "busy")
    with Runtime(state_dir=tmp_path / "busy"):  # released at shutdown
        pass


def test_hibernation_needs_a_state_dir(echo_agent: Component, tmp_path: Path) -> None:
    with Runtime() as rt, pytest.raises(ValueError, match="state_dir"):
        rt.register(AgentType("e", echo_agent, hibernate_after=1.0))
    manifest = tmp_path / "mighty.toml"
    manifest.write_text('[agents.e]\ncomponent = "e.wasm"\ndurable = true\n')
    with pytest.raises(ValueError, match=r"\[runtime\] state_dir"):
        load_manifest(manifest)
    manifest.write_text('[agents.e]\ncomponent = "e.wasm"\nhibernate_after = 0\n')
    with pytest.raises(ValueError, match="hibernate_after"):
        load_manifest(manifest)


# -- corrupt rows met by a wake ------------------------------------------------------------


@pytest.mark.slow
def test_corrupt_rows_fail_the_wake_and_are_kept(counter_wasm: Path, tmp_path: Path) -> None:
    counter = Component.load(counter_wasm)
    with Runtime(workers=2, state_dir=tmp_path / "state") as rt:
        rt.register(AgentType("counter", counter))
        start_tree(rt, SupervisorSpec("root", [AgentChild("sup", "counter")], intensity=2))
        lone, healthy = rt.spawn("counter"), rt.spawn("counter")
        supervised = rt.whereis("sup")
        assert supervised is not None
        for address in (lone, supervised, healthy):
            rt.ask(address, "incr", {"by": 5})
            assert rt.hibernate(address)
        assert rt.hibernation is not None
        store = rt.hibernation.store
        with sqlite3.connect(store.path) as db:
            # Truncated state (digest mismatch), and a digest that is not one.
            db.execute(
                "UPDATE snapshots SET state = substr(state, 1, 10) WHERE address = ?", (lone,)
            )
            db.execute("UPDATE snapshots SET digest = 'x' WHERE address = ?", (supervised,))
            rows = dict(
                db.execute("SELECT address, hex(state) || hex(digest) FROM snapshots").fetchall()
            )
        # Unsupervised: the wake fails, the agent is gone, its asker told why.
        with pytest.raises(NoProc, match="snapshot_corrupt"):
            rt.ask(lone, "get")
        # Supervised: each restart tries the stored snapshot again, until the supervisor
        # gives up; the runtime is fine all along.
        with pytest.raises(NoProc, match="stopped for good by its supervisor"):
            rt.ask("sup", "get")
        reasons = [e.data["reason"] for e in rt.events_of("wake.failed") if e.address == supervised]
        assert len(reasons) >= 2 and all("snapshot_corrupt" in r for r in reasons)
        assert rt.ask(healthy, "get")["count"] == 5
        with sqlite3.connect(store.path) as db:
            after = dict(
                db.execute("SELECT address, hex(state) || hex(digest) FROM snapshots").fetchall()
            )
        assert after[lone] == rows[lone] and after[supervised] == rows[supervised]
        assert rt.hibernation_stats()["wake_failures"] >= 2
        assert [e for e in rt.events if e.kind == "supervisor.restart_limit"]


@pytest.mark.slow
def test_a_full_store_keeps_the_agent_awake(kvstore: Component, tmp_path: Path) -> None:
    """SQLite's own "database or disk is full" (a page limit stands in for a full disk)."""
    with Runtime(workers=2, state_dir=tmp_path / "state") as rt:
        rt.register(AgentType("kv", kvstore))
        small = rt.spawn("kv")
        assert rt.hibernate(small)
        assert rt.hibernation is not None
        store = rt.hibernation.store
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")
        big = rt.spawn("kv")
        rt.ask(big, "put", {"key": "k", "value": "v" * 50_000})  # needs pages there are not
        assert not rt.hibernate(big)
        failed = [e for e in rt.events if e.kind == "hibernate.failed"]
        assert failed and "store_unavailable" in failed[0].data["reason"]
        assert not rt.process(big).hibernated
        assert rt.ask(big, "get", {"key": "k"})["value"] == "v" * 50_000  # awake, intact
        assert rt.ask(small, "size")["size"] == 0  # and the asleep one still wakes


def test_a_damaged_store_is_refused_at_open(tmp_path: Path) -> None:
    """A database whose b-tree pages are damaged is a BadStateDir at open, never a store that
    answers 'no such name' and takes new rows into the damaged file."""
    state = tmp_path / "state"
    store = SnapshotStore(state)
    for i in range(200):
        store.put(StoredSnapshot(f"counter:{i}", "counter", f"n{i}", "c", "s", True, b"x" * 3000))
    store.checkpoint()
    store.close()
    db = state / "agents.sqlite3"
    data = bytearray(db.read_bytes())
    page = 4096
    for at in range(2 * page, len(data) - page, 7 * page):  # scribble over interior pages
        data[at + 8 : at + 64] = bytes(range(56))
    db.write_bytes(bytes(data))
    before = db.read_bytes()
    with pytest.raises(BadStateDir, match="damaged") as info:
        SnapshotStore(state)
    assert "\n" not in str(info.value)
    assert db.read_bytes() == before  # nothing written into it


def test_a_huge_state_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A state column over MAX_SNAPSHOT_BYTES is SnapshotCorrupt from its length in SQL."""
    from mighty.agents._store import MAX_SNAPSHOT_BYTES

    store = SnapshotStore(tmp_path / "state")
    try:
        store.put(StoredSnapshot("big:1", "t", None, "c", "s", True, b"x"))
        with sqlite3.connect(store.path) as db:
            db.execute(
                "UPDATE snapshots SET state = zeroblob(?) WHERE address = 'big:1'",
                (MAX_SNAPSHOT_BYTES + 1,),
            )
        with pytest.raises(SnapshotCorrupt, match="over its size limit"):
            store.get("big:1")
    finally:
        store.close()


_BIG_ROW = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("UPDATE snapshots SET state = zeroblob(260 << 20) WHERE address = 'big:1'")
db.commit()
"""

_OPEN_AND_GET = """
import resource, sys
from mighty.agents._store import SnapshotCorrupt, SnapshotStore
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
store = SnapshotStore(sys.argv[1])
try:
    store.get("big:1")
    outcome = "read"
except SnapshotCorrupt as exc:
    outcome = str(exc)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10, outcome)
"""


def test_a_row_larger_than_sqlite_may_hold_costs_no_memory_to_refuse(tmp_path: Path) -> None:
    """A 260 MiB state edited into the file: refused with well under its size of new memory
    (SQLite reads a WITHOUT ROWID row whole even for its key; its heap is bounded)."""
    import subprocess
    import sys

    state = tmp_path / "state"
    store = SnapshotStore(state)
    store.put(StoredSnapshot("big:1", "t", None, "c", "s", True, b"x"))
    store.close()
    run = [sys.executable, "-c"]
    subprocess.run([*run, _BIG_ROW, str(state / "agents.sqlite3")], check=True, timeout=300)
    done = subprocess.run(
        [*run, _OPEN_AND_GET, str(state)], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    grown_mb, outcome = done.stdout.split(" ", 1)
    assert "larger than the store allows" in outcome
    assert int(grown_mb) < 64  # the row is 260 MiB


def test_symlinks_in_a_state_dir_are_not_followed(tmp_path: Path) -> None:
    """A database or lock file that is a symlink is refused, and its target is untouched."""
    elsewhere = tmp_path / "elsewhere.sqlite3"
    for name in ("agents.sqlite3", "lock"):
        state = tmp_path / f"state-{name}"
        state.mkdir()
        (state / name).symlink_to(elsewhere)
        with pytest.raises(BadStateDir, match="symlink"):
            SnapshotStore(state)
        assert not elsewhere.exists()


def test_a_state_dir_of_another_user_is_refused(tmp_path: Path) -> None:
    """A state_dir owned by another uid is refused (as root: one chowned away; otherwise a
    directory root owns)."""
    import os

    if os.getuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
    else:
        theirs = Path("/")
    with pytest.raises(BadStateDir, match=r"owned by another user|not writable"):
        SnapshotStore(theirs)
