"""Sessions that outlive their instance: snapshot, restore (here and in a new process), fork."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty import HostError, Instance
from mighty.engine import Component, MemoryState, live_memories
from mighty.sandbox import (
    Limits,
    MemoryDir,
    Sandbox,
    Session,
    SnapshotCorrupt,
    SnapshotError,
    SnapshotMismatch,
    SnapshotTooLarge,
)

SETUP = textwrap.dedent(
    """
    import json, fractions
    import collections as coll
    x = 41
    items = [1, 2, 3]
    def f(a):
        return a + x
    def counter():
        n = 0
        def step():
            nonlocal n
            n += 1
            return n
        return step
    tick = counter()
    tick()
    class Point:
        def __init__(self, a, b):
            self.a, self.b = a, b
        def norm1(self):
            return abs(self.a) + abs(self.b)
    p = Point(3, -4)
    gen = (i * i for i in range(10))
    next(gen)
    print("set up")
    f(1)
    """
)

CHECK = textwrap.dedent(
    """
    print("still here")
    import sys
    print("err", file=sys.stderr)
    [f(1), tick(), p.norm1(), next(gen), json.dumps(coll.OrderedDict(a=items)),
     str(fractions.Fraction(1, 3) * 3), type(p).__name__]
    """
)
EXPECTED = [42, 2, 7, 1, '{"a": [1, 2, 3]}', "1", "Point"]


def search(query: str) -> list[str]:
    """Search."""
    return [query.upper()]


@pytest.fixture(scope="module")
def box(interpreter: Component) -> Iterator[Sandbox]:
    with Sandbox(tools=[search], pool=0) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def quick(interpreter: Component) -> Iterator[Sandbox]:
    """The same tools, and a short deadline: for restores of forged snapshots."""
    with Sandbox(tools=[search], pool=0, limits=Limits(timeout=1.0)) as sandbox:
        yield sandbox


@pytest.fixture(scope="module")
def snapshot(box: Sandbox) -> bytes:
    with box.session() as session:
        result = session.run(SETUP)
        assert result.ok and result.value == 42 and result.stdout == "set up\n", result
        return session.snapshot()


def checked(session: Session) -> None:
    result = session.run(CHECK)
    assert result.ok, result
    assert result.value == EXPECTED
    assert result.stdout == "still here\n"
    assert result.stderr == "err\n"


def test_restore_in_a_fresh_sandbox_keeps_everything(snapshot: bytes) -> None:
    with Sandbox(tools=[search], pool=0) as other, other.restore(snapshot) as session:
        checked(session)
        # Tools still work, and the session goes on as any session does.
        assert session.run("search('q') + [x]").value == ["Q", 41]
        assert session.run("y = 5").ok
        assert session.run("x + y").value == 46


def test_restore_twice_gives_independent_sessions(box: Sandbox, snapshot: bytes) -> None:
    with box.restore(snapshot) as one, box.restore(snapshot) as two:
        assert one.run("items.append(4); x = 0").ok
        assert two.run("[items, x]").value == [[1, 2, 3], 41]
        assert one.run("[items, x]").value == [[1, 2, 3, 4], 0]


def test_restore_in_a_new_process(snapshot: bytes, tmp_path: Path) -> None:
    path = tmp_path / "session.snap"
    path.write_bytes(snapshot)
    script = textwrap.dedent(
        f"""
        import json, sys
        from mighty.sandbox import Sandbox

        def search(query: str) -> list[str]:
            \"\"\"Search.\"\"\"
            return [query.upper()]

        data = open(sys.argv[1], "rb").read()
        with Sandbox(tools=[search], pool=0) as box, box.restore(data) as session:
            result = session.run({CHECK!r})
            print(json.dumps([result.ok, result.value, result.stdout, result.stderr]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    ok, value, stdout, stderr = json.loads(done.stdout.strip().splitlines()[-1])
    assert ok and value == EXPECTED and stdout == "still here\n" and stderr == "err\n"


def test_forks_diverge_independently(box: Sandbox) -> None:
    with box.session() as parent:
        assert parent.run(
            "data = {'n': 0}\ndef bump(k):\n    data['n'] += k\n    return data['n']"
        ).ok
        assert parent.run("bump(1)").value == 1
        with parent.fork() as left, parent.fork() as right:
            assert left.run("bump(10)").value == 11
            assert right.run("bump(100)").value == 101
            assert parent.run("bump(1000)").value == 1001
            assert left.run("bump(0)").value == 11
            assert right.run("bump(0)").value == 101
            with left.fork() as grandchild:
                assert grandchild.run("bump(5)").value == 16
                assert left.run("bump(0)").value == 11
        assert parent.run("bump(0)").value == 1001


def test_fork_and_snapshot_of_an_unused_session(box: Sandbox) -> None:
    with box.session() as fresh, fresh.fork() as child:
        assert child.run("'x' in globals()").value is False
        with box.restore(fresh.snapshot()) as restored:
            assert restored.run("1 + 1").value == 2


def test_snapshot_after_more_runs_and_after_reset(box: Sandbox) -> None:
    with box.session() as session:
        session.run("a = 1")
        first = session.snapshot()
        assert session.snapshot() == first  # nothing ran in between: the same state
        session.run("a = 2")
        second = session.snapshot()
        session.reset()
        third = session.snapshot()
        with box.restore(first) as one, box.restore(second) as two, box.restore(third) as three:
            assert one.run("a").value == 1
            assert two.run("a").value == 2
            assert three.run("'a' in globals()").value is False


def test_a_restart_loses_the_restored_state(box: Sandbox, snapshot: bytes) -> None:
    with box.restore(snapshot) as session:
        stopped = session.run("import os\nos._exit(3)")
        assert not stopped.ok and session.restarts == 1
        assert session.run("'x' in globals()").value is False


def test_open_files_refuse_a_snapshot(interpreter: Component) -> None:
    files = [MemoryDir("/data", files={"a.txt": b"hello"})]
    with Sandbox(pool=0, files=files) as box, box.session() as session:
        assert session.run("open('/data/a.txt').read()").value == "hello"
        assert session.run("handle = open('/data/a.txt')").ok
        with pytest.raises(SnapshotError, match="close open files"):
            session.snapshot()
        with pytest.raises(SnapshotError, match="close open files"):
            session.fork()
        assert session.run("handle.close()").ok
        with box.restore(session.snapshot()) as restored:
            assert restored.run("open('/data/a.txt').read()").value == "hello"


def _rechecksum(body: bytes) -> bytes:
    return body + hashlib.sha256(body).digest()


def test_a_snapshot_from_another_build_is_refused(box: Sandbox, snapshot: bytes) -> None:
    body = bytearray(snapshot[:-32])
    body[12:44] = bytes(32)  # the interpreter's component SHA-256
    with pytest.raises(SnapshotMismatch, match="interpreter build"):
        box.restore(_rechecksum(bytes(body)))


def test_another_format_version_is_refused(box: Sandbox, snapshot: bytes) -> None:
    body = bytearray(snapshot[:-32])
    body[8:10] = struct.pack("<H", 99)
    with pytest.raises(SnapshotMismatch, match="version 99"):
        box.restore(_rechecksum(bytes(body)))


def test_other_tools_are_refused(snapshot: bytes, interpreter: Component) -> None:
    def lookup(key: str) -> str:
        return key

    with Sandbox(tools=[lookup], pool=0) as other, pytest.raises(SnapshotMismatch, match="tools"):
        other.restore(snapshot)


def test_oversize_snapshots_are_refused(snapshot: bytes, interpreter: Component) -> None:
    with Sandbox(tools=[search], pool=0, limits=Limits(memory=32 << 20)) as small:
        with pytest.raises(SnapshotTooLarge, match="accepts at most"):
            small.restore(snapshot + bytes(40 << 20))
        body = bytearray(snapshot[:-32])
        body[76:84] = struct.pack("<Q", 64 << 20)  # a memory over the 32 MiB limit
        with pytest.raises(SnapshotTooLarge, match="over this sandbox's"):
            small.restore(_rechecksum(bytes(body)))


@pytest.mark.parametrize("cut", [0, 7, 8, 100, -33, -1])
def test_truncated_snapshots_are_refused(box: Sandbox, snapshot: bytes, cut: int) -> None:
    with pytest.raises(SnapshotCorrupt):
        box.restore(snapshot[:cut])


def test_not_bytes_is_refused(box: Sandbox) -> None:
    with pytest.raises(SnapshotCorrupt, match="bytes"):
        box.restore("MTYSNAP")  # type: ignore[arg-type]


def test_a_strided_or_shaped_view_is_a_snapshot_error(box: Sandbox, snapshot: bytes) -> None:
    """A non-contiguous memoryview (every other byte) or a multi-dimensional one is refused
    with SnapshotCorrupt, never a raw TypeError; a contiguous view of the bytes restores."""
    doubled = bytes(b for pair in zip(snapshot, snapshot, strict=True) for b in pair)
    with pytest.raises(SnapshotCorrupt, match="contiguous"):
        box.restore(memoryview(doubled)[::2])
    square = memoryview(bytes(64)).cast("B", (8, 8))[::2]
    with pytest.raises(SnapshotCorrupt):
        box.restore(square)
    assert box.restore(memoryview(bytearray(snapshot))).run("result = 1").value == 1


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_corrupted_snapshots_are_refused(
    box: Sandbox, snapshot: bytes, data: st.DataObject
) -> None:
    """Any change to a snapshot's bytes is refused with a SnapshotCorrupt, nothing else."""
    raw = bytearray(snapshot)
    position = data.draw(st.integers(0, len(raw) - 1), label="position")
    change = data.draw(st.sampled_from(["flip", "drop", "insert"]), label="change")
    if change == "flip":
        raw[position] ^= data.draw(st.integers(1, 255), label="mask")
    elif change == "drop":
        del raw[position : position + data.draw(st.integers(1, 64), label="length")]
    else:
        raw[position:position] = data.draw(st.binary(min_size=1, max_size=64), label="bytes")
    with pytest.raises(SnapshotCorrupt):
        box.restore(bytes(raw))


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_rechecksummed_header_changes_are_refused_or_harmless(
    quick: Sandbox, snapshot: bytes, data: st.DataObject
) -> None:
    """A header altered *with* a valid checksum (a forged snapshot) is refused with a
    SnapshotError, or restores into a session that still answers: never a host failure."""
    body = bytearray(snapshot[:-32])
    header_end = min(len(body), 200)
    position = data.draw(st.integers(0, header_end - 1), label="position")
    body[position] ^= data.draw(st.integers(1, 255), label="mask")
    try:
        session = quick.restore(_rechecksum(bytes(body)))
    except SnapshotError:
        return
    with session:
        result = session.run("1 + 1")
        assert result.ok or result.error is not None


def test_forks_from_spare_instances(interpreter: Component) -> None:
    """With a pool, a fork finds an instance started ahead of time (one per memory size): it
    behaves exactly as one made on the spot."""
    with Sandbox(pool=1) as box, box.session() as parent:
        assert parent.run("log = []").ok
        first = parent.fork()  # no spare yet: makes its own, and asks for one of this size
        spares = box._spares
        assert spares is not None
        size = parent._freeze().size
        deadline = time.monotonic() + 60
        while not spares.ready(size) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert spares.ready(size)
        with first, parent.fork() as second, parent.fork() as third:
            for session, tag in ((first, 1), (second, 2), (third, 3)):
                assert session.run(f"log.append({tag})\nlog").value == [tag]
            assert parent.run("log").value == []


def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, "the spares never got there"
        time.sleep(0.005)


def _forked_once(box: Sandbox, parent: Session) -> tuple[Any, Session, MemoryState]:
    """The sandbox's spares, a first fork of ``parent`` (holding ``log = []``), its state."""
    assert parent.run("log = []").ok
    spares = box._spares
    assert spares is not None
    first = parent.fork()
    return spares, first, parent._freeze()


def test_a_spare_holding_the_state_serves_its_next_fork(interpreter: Component) -> None:
    """A spare is mapped ahead of time for the newest state forked of its size: the next fork of
    that state takes it as it is, a fork after a run maps the run's state, and every fork sees
    its own copy."""
    with Sandbox(pool=1) as box, box.session() as parent:
        spares, first, state = _forked_once(box, parent)
        _until(lambda: spares.mapped(state))
        with first, parent.fork() as second:
            assert spares.mapped(state)  # a fork makes no instance until it is used
            assert second.run("log.append(2)\nlog").value == [2]
            assert not spares.mapped(state)  # taken by the fork's first run
            assert first.run("log.append(1)\nlog").value == [1]
            assert parent.run("log.append('p')\nlog").value == ["p"]
            _until(lambda: spares.ready(state.size))  # made again, mapped for `state`
            with parent.fork() as third:  # the state after the parent's run, not `state`
                assert third.run("log").value == ["p"]
            newer = parent._freeze()
            _until(lambda: spares.mapped(newer))  # the spare mapped again, for the newer state
            with parent.fork() as fourth:
                assert fourth.run("log").value == ["p"]
            assert second.run("log").value == [2]


def test_a_spare_that_cannot_be_mapped_ahead_is_left_to_the_fork(
    interpreter: Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When mapping a spare ahead fails (the kernel refuses an mmap, say), the spares thread
    tries once, makes the next spare unmapped, and forks still get their own copy."""
    tries: list[MemoryState] = []  # every spares thread's, other sandboxes' included
    real = Instance.restore_memory

    def failing(self: Instance, state: MemoryState) -> None:
        if threading.current_thread().name == "mighty-sandbox-spares":
            tries.append(state)
            raise OSError(12, "Cannot allocate memory")
        real(self, state)

    monkeypatch.setattr(Instance, "restore_memory", failing)
    with Sandbox(pool=1) as box, box.session() as parent:
        spares, first, state = _forked_once(box, parent)
        _until(lambda: spares.ready(state.size))  # a loop of failed mappings never gets here
        assert [t for t in tries if t is state] == [state]
        assert not spares.mapped(state)
        with first, parent.fork() as second:
            assert second.run("log.append(2)\nlog").value == [2]
            assert first.run("log").value == []


@pytest.mark.slow
def test_the_interpreter_keeps_no_state_outside_its_memory(interpreter: Component) -> None:
    """What makes a memory snapshot the whole state (docs/sandbox.md): at run time no code
    writes a global but the two shadow-stack pointers and the preview1 adapter's state
    globals, and none changes a table. Checked on the component's text, module by module
    (``__init`` runs at build time only)."""
    tool = Path(sys.executable).parent / "wasm-tools"
    module = ""
    written: set[tuple[str, str]] = set()
    tables: set[str] = set()
    with subprocess.Popen(
        [str(tool), "print", interpreter.origin], stdout=subprocess.PIPE, text=True
    ) as printer:
        assert printer.stdout is not None
        for line in printer.stdout:
            if line.startswith("  (core module "):
                module = line.split()[2]
            elif module == "$__init" or line.lstrip().startswith("(data"):
                continue
            elif "global.set " in line:
                written.add((module, line.split("global.set ", 1)[1].split()[0]))
            elif any(f"table.{op}" in line for op in ("set", "grow", "fill", "copy", "init")):
                tables.add(module)
    assert printer.returncode == 0
    names = {name for _module, name in written}
    assert "$__stack_pointer" in names  # the scan did see the code
    assert names <= {
        "$__stack_pointer",
        "$internal_state_ptr",
        "$allocation_state",
    }, written
    assert not tables


def test_a_fork_makes_no_instance_until_it_is_used(interpreter: Component) -> None:
    """A fork kept as a checkpoint holds its state, no instance: forking it again shares that
    state, and its first run, reset or snapshot makes the instance from it; closing it
    unused frees the state."""
    # No pool: no spares thread making instances of its own meanwhile.
    with Sandbox(pool=0) as box, box.session() as parent:
        assert parent.run("log = [1]").ok
        before = live_memories()
        checkpoint = parent.fork()
        again = checkpoint.fork()
        assert live_memories() == before
        assert again._pending is not None and checkpoint._pending is not None
        assert again._pending[0] is checkpoint._pending[0]
        assert parent.run("log.append(2)\nlog").value == [1, 2]
        assert checkpoint.run("log.append(3)\nlog").value == [1, 3]
        assert again.run("log").value == [1]
        reset = parent.fork()
        reset.reset()
        assert reset.run("'log' in globals()").value is False
        unused = parent.fork()
        unused.close()
        assert unused._pending is None
        assert unused.run("log = 5\nlog").value == 5  # closed then used: a fresh interpreter
        for session in (checkpoint, again, reset, unused):
            session.close()


def test_a_spare_mapped_ahead_is_populated_and_serves_a_fork_later(
    interpreter: Component,
) -> None:
    """After a fork the spares thread maps its state into a spare and then copies its pages
    in; the fork's first run takes that spare, and sees exactly the forked state."""
    with Sandbox(pool=1) as box, box.session() as parent:
        spares, first, state = _forked_once(box, parent)
        _until(lambda: spares.mapped(state))

        def populated() -> bool:
            with spares._cond:
                spare = spares._ready.get(state.size)
                return (
                    spare is not None and spare.populated is not None and spare.populated() is state
                )

        _until(populated)
        assert parent.run("log.append('p')").ok
        with first:
            assert first.run("log.append(1)\nlog").value == [1]
            assert not spares.mapped(state)  # taken
        assert parent.run("log").value == ["p"]


def _held_back(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Make ``box``'s spares thread take no fork's state to freeze (as when it is busy
    elsewhere): whichever needs the state first freezes it. The jobs it was given."""
    spares = box._spares
    assert spares is not None
    given: list[Any] = []

    def later(job: Any) -> bool:
        given.append(weakref.ref(job))  # held weakly, as the thread does
        return True

    monkeypatch.setattr(spares, "freeze", later)
    return given


def _captures(monkeypatch: pytest.MonkeyPatch, of: Session, fail: int = 0) -> list[str]:
    """Count captures of the memory of ``of``'s instance (the thread each ran on); the first
    ``fail`` raise OSError."""
    seen: list[str] = []
    real = Instance.capture_memory
    live = of._live
    assert live is not None

    def counted(self: Instance, **kwargs: Any) -> MemoryState:
        if self is not live.instance:  # the pool's, say
            return real(self, **kwargs)
        seen.append(threading.current_thread().name)
        if len(seen) <= fail:
            raise OSError(24, "Too many open files")
        return real(self, **kwargs)

    monkeypatch.setattr(Instance, "capture_memory", counted)
    return seen


def test_a_fork_is_frozen_by_whichever_needs_it_first(
    interpreter: Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork returns before its state is frozen; the session's next run freezes it first
    (the fork then sees the state as of the fork), or the fork's first run does (the session
    then runs on without freezing again)."""
    with Sandbox(pool=1) as box, box.session() as parent:
        assert parent.run("log = [1]").ok
        _held_back(box, monkeypatch)
        captures = _captures(monkeypatch, parent)
        first = parent.fork()
        assert captures == []  # nothing frozen yet
        assert parent.run("log.append(2)\nlog").value == [1, 2]
        assert len(captures) == 1  # by the run, before it changed anything
        second = parent.fork()
        with first, second:
            assert second.run("log.append(3)\nlog").value == [1, 2, 3]  # frozen by its run
            assert len(captures) == 2
            assert parent.run("log").value == [1, 2]
            assert first.run("log").value == [1]
            assert len(captures) == 2


def test_a_fork_closed_before_it_is_frozen_freezes_nothing(
    interpreter: Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session holds a fork's pending state only weakly: when every fork that wants it is
    closed or dropped, its next run freezes nothing."""
    with Sandbox(pool=1) as box, box.session() as parent:
        assert parent.run("log = [1]").ok
        given = _held_back(box, monkeypatch)
        captures = _captures(monkeypatch, parent)
        fork = parent.fork()
        again = fork.fork()  # a fork of an unused fork shares its pending state
        fork.close()
        assert given[0]() is not None  # `again` still wants it
        del again
        assert given[0]() is None
        assert parent.run("log.append(2)\nlog").value == [1, 2]
        assert captures == []


def test_the_spares_thread_freezes_a_fork_ahead(
    interpreter: Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a pool, the spares thread freezes a fork's state soon after the fork returns (and
    maps a spare for it): neither the session nor the fork freezes it again."""
    with Sandbox(pool=1) as box, box.session() as parent:
        assert parent.run("log = [1]").ok
        captures = _captures(monkeypatch, parent)
        spares = box._spares
        assert spares is not None
        with parent.fork() as fork:
            _until(spares.idle)
            assert captures == ["mighty-sandbox-spares"]
            assert parent.run("log.append(2)\nlog").value == [1, 2]
            assert fork.run("log").value == [1]
            assert captures == ["mighty-sandbox-spares"]


def test_a_freeze_that_fails_is_the_forks_error(
    interpreter: Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state that cannot be frozen (no memfd, say) is the fork's error: raised by fork()
    itself where no thread freezes ahead, else by the fork's every use (the session has moved
    on); the session runs on unharmed either way."""
    with Sandbox(pool=0) as box, box.session() as parent:
        assert parent.run("log = [1]").ok
        _captures(monkeypatch, parent, fail=1)
        with pytest.raises(HostError, match=r"could not be frozen: .*Too many open files"):
            parent.fork()
        assert parent.run("log.append(2)\nlog").value == [1, 2]
        with parent.fork() as fork:  # the next one freezes
            assert fork.run("log").value == [1, 2]
    monkeypatch.undo()
    with Sandbox(pool=1) as box, box.session() as parent:
        assert parent.run("log = [1]").ok
        _held_back(box, monkeypatch)
        _captures(monkeypatch, parent, fail=1)
        with parent.fork() as fork:
            assert parent.run("log.append(2)\nlog").value == [1, 2]  # its freeze failed
            for _ in range(2):
                with pytest.raises(HostError, match="could not be frozen"):
                    fork.run("log")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["run", "fork", "close"]), st.integers(0, 7)),
        min_size=1,
        max_size=10,
    ),
    held=st.booleans(),
)
def test_forks_and_runs_in_any_order_see_their_own_history(
    interpreter: Component, steps: list[tuple[str, int]], held: bool
) -> None:
    """Runs, forks and closes of a family of sessions in any order, with the spares thread
    freezing forks ahead or not at all: each session's run sees exactly its own history."""
    with Sandbox(pool=1) as box, pytest.MonkeyPatch.context() as monkeypatch:
        if held:
            _held_back(box, monkeypatch)
        sessions: list[Session] = [box.session()]
        model: list[list[int] | None] = [[]]
        assert sessions[0].run("log = []").ok
        try:
            for token, (op, pick) in enumerate(steps):
                index = pick % len(sessions)
                session, seen = sessions[index], model[index]
                if op == "run":
                    result = session.run(f"log.append({token})\nlog")
                    if seen is None:  # closed: used again, a fresh interpreter
                        assert result.error is not None and "NameError" in result.error.message
                        continue
                    seen.append(token)
                    assert result.value == seen
                elif op == "fork" and seen is not None:
                    sessions.append(session.fork())
                    model.append(list(seen))
                elif op == "close":
                    session.close()
                    model[index] = None
            for session, seen in zip(sessions, model, strict=True):
                if seen is not None:
                    assert session.run("log").value == seen
        finally:
            for session in sessions:
                session.close()
