"""A hostile guest stays bounded: open descriptors are capped, read-write grants have a quota."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import wasmtime

from mighty import Budget, Component, Instance, Ok
from mighty.engine import get_engine
from mighty.gate import GuestContext, GuestViolation
from mighty.trace import Recorder, read_trace
from mighty.wasi import DirGrant, MemoryDir, Policy
from mighty.wasi import _filesystem as fs
from mighty.wasi._memfs import ENTRY_COST
from mighty.wasi._policy import DEFAULT_MAX_OPEN
from mighty.wasi._streams import StreamFailed
from tests.wasi.test_filesystem import CREATE, FNS, RW, Guest

R = frozenset({"read"})
FOLLOW = frozenset({"symlink-follow"})
NONE: frozenset[str] = frozenset()


def _fds_on(path: Path) -> int:
    """How many of the process's descriptors are open on ``path``: other threads of the test
    process (a finalizer, a pool) may open and close descriptors of their own meanwhile."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:
            continue  # closed since it was listed
    return count


def test_policy_defaults_are_safe() -> None:
    """The default policy caps open descriptors and refuses nonsense limits."""
    assert Policy().max_open == DEFAULT_MAX_OPEN == 256
    assert DirGrant(Path("/tmp"), "/d").max_bytes is None
    with pytest.raises(ValueError, match="max_open"):
        Policy(max_open=0)
    with pytest.raises(ValueError, match="max_bytes"):
        DirGrant(Path("/tmp"), "/d", max_bytes=-1)
    assert Policy().with_dir("/tmp", "/d", readonly=False, max_bytes=5).dirs[0].max_bytes == 5


def test_open_loop_stops_at_the_cap(tmp_path: Path) -> None:
    """Opening a read-only file in a loop holds at most max_open fds; then `quota`."""
    (tmp_path / "f").write_bytes(b"x")
    guest = Guest(Policy(dirs=(DirGrant(tmp_path, "/ro"),), max_open=16))
    root = guest.dirs["/ro"]
    assert _fds_on(tmp_path / "f") == 0
    assert _fds_on(tmp_path) == 2  # the preopen root and its guest descriptor
    opened = 0
    while True:
        result = guest.call("open-at", root, FOLLOW, "f", NONE, R)
        if not isinstance(result, Ok):
            assert result.value == "quota"
            break
        opened += 1
        assert opened <= 16
    assert opened == 15  # the preopen descriptor is the 16th
    assert _fds_on(tmp_path / "f") == 15
    guest.close()
    assert _fds_on(tmp_path / "f") == 0
    assert _fds_on(tmp_path) == 0  # the preopen root and its guest descriptor went too


def test_streams_and_listings_count(tmp_path: Path) -> None:
    """Streams on files and directory listings count against the same cap."""
    (tmp_path / "f").write_bytes(b"x")
    guest = Guest(Policy(dirs=(DirGrant(tmp_path, "/ro"),), max_open=4))
    root = guest.dirs["/ro"]
    f = guest.open(root, "f")
    assert guest.call("read-via-stream", f, 0).value is not None
    guest.ok("read-directory", root)
    assert guest.err("read-via-stream", f, 0) == "quota"
    assert guest.err("read-directory", root) == "quota"
    assert guest.err("open-at", root, FOLLOW, "f", NONE, R) == "quota"
    f.close()  # dropping one frees a place
    guest.open(root, "f")
    guest.close()


def test_memory_dirs_count_too() -> None:
    """Memory descriptors and streams hold no fd but are capped all the same."""
    guest = Guest(Policy(dirs=(MemoryDir("/m", {"a": b"1"}),), max_open=3))
    root = guest.dirs["/m"]
    a = guest.open(root, "a")
    guest.ok("read-via-stream", a, 0)
    assert guest.err("open-at", root, FOLLOW, "a", NONE, R) == "quota"
    assert guest.err("write-via-stream", a, 0) in ("quota", "bad-descriptor")
    guest.close()


def test_get_directories_in_a_loop_is_a_violation(tmp_path: Path) -> None:
    """get-directories cannot fail in the WIT, so looping on it past the cap stops the guest."""
    ctx = GuestContext(wasmtime.Store(get_engine()))
    fs.setup(ctx, Policy(dirs=(DirGrant(tmp_path, "/ro"),), max_open=8))
    before = _fds_on(tmp_path)

    def loop() -> None:
        for _ in range(100):
            FNS["get-directories"](ctx)

    with pytest.raises(GuestViolation, match="8 open descriptors"):
        loop()
    assert _fds_on(tmp_path) - before <= 8
    fs.close_all(ctx)


def test_write_quota_on_a_host_grant(tmp_path: Path) -> None:
    """Writes past a grant's max_bytes fail with insufficient-space and write nothing."""
    guest = Guest(Policy(dirs=(DirGrant(tmp_path, "/rw", readonly=False, max_bytes=1000),)))
    root = guest.dirs["/rw"]
    f = guest.open(root, "f", CREATE, RW)
    assert guest.ok("write", f, b"a" * 900, 0) == 900
    assert guest.err("write", f, b"b" * 100, 900) == "insufficient-space"
    assert (tmp_path / "f").stat().st_size == 900
    assert guest.err("set-size", f, 10_000) == "insufficient-space"
    guest.ok("set-size", f, 10)  # shrinking costs nothing and gives nothing back
    assert guest.err("write", f, b"c" * 100, 0) == "insufficient-space"
    assert guest.err("create-directory-at", root, "d") == "insufficient-space"
    guest.close()


def test_write_quota_on_streams(tmp_path: Path) -> None:
    """An output stream on a quota'd grant fails with the filesystem error-code."""
    guest = Guest(
        Policy(dirs=(DirGrant(tmp_path, "/rw", readonly=False, max_bytes=ENTRY_COST + 10),))
    )
    root = guest.dirs["/rw"]
    f = guest.open(root, "f", CREATE, RW)
    stream = guest.ok("append-via-stream", f)
    stream.write(b"0123456789")
    with pytest.raises(StreamFailed, match="insufficient-space"):
        stream.write(b"x")
    assert (tmp_path / "f").read_bytes() == b"0123456789"
    guest.close()


def test_entries_are_charged(tmp_path: Path) -> None:
    """Creating empty files is not free: each costs ENTRY_COST of the quota."""
    guest = Guest(
        Policy(dirs=(DirGrant(tmp_path, "/rw", readonly=False, max_bytes=10 * ENTRY_COST),))
    )
    root = guest.dirs["/rw"]
    made = 0
    while isinstance(guest.call("open-at", root, FOLLOW, f"e{made}", CREATE, R), Ok):
        made += 1
        assert made <= 10
    assert made == 10
    assert len(os.listdir(tmp_path)) == 10
    guest.close()


@pytest.mark.slow
def test_real_guest_open_loop_and_quota(probe_wasm: Path, tmp_path: Path) -> None:
    """A real guest opening in a loop gets EDQUOT at the cap; writing forever stops at the quota."""
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "f").write_bytes(b"x")
    (tmp_path / "rw").mkdir()
    policy = Policy(
        dirs=(
            DirGrant(tmp_path / "ro", "/ro"),
            DirGrant(tmp_path / "rw", "/rw", readonly=False, max_bytes=1 << 20),
        ),
        max_open=64,
    )
    code = """
import errno, json, os
fds = []
try:
    while len(fds) < 100000:
        fds.append(os.open('/ro/f', os.O_RDONLY))
except OSError as e:
    opened, open_err = len(fds), errno.errorcode.get(e.errno, str(e.errno))
for fd in fds:
    os.close(fd)
written = 0
try:
    with open('/rw/big', 'wb') as f:
        while written < 64 << 20:
            f.write(b'z' * 65536)
            written += 65536
except OSError as e:
    write_err = errno.errorcode.get(e.errno, str(e.errno))
again = open('/ro/f').read()
result = json.dumps([opened, open_err, written, write_err, again])
"""
    component = Component.load(probe_wasm)
    instance = Instance(component, policy=policy, budget=Budget(timeout=60))
    try:
        value = instance.call("run", code)
    finally:
        instance.close()
    assert isinstance(value, Ok), value
    opened, open_err, written, write_err, again = json.loads(value.value)
    assert opened < 64
    assert open_err == "EDQUOT"
    assert written <= 1 << 20
    # componentize-py's wasi-libc reports any failed stream write as EIO without asking
    # filesystem-error-code; the host's own code is insufficient-space (tested above).
    assert write_err in ("ENOSPC", "EIO")
    assert again == "x"
    assert (tmp_path / "rw" / "big").stat().st_size <= 1 << 20
    # Everything the guest held is closed with the instance.
    assert _fds_on(tmp_path / "ro") == _fds_on(tmp_path / "ro" / "f") == 0
    assert _fds_on(tmp_path / "rw") == _fds_on(tmp_path / "rw" / "big") == 0


@pytest.mark.slow
def test_limits_are_recorded(probe_wasm: Path, tmp_path: Path) -> None:
    """max_open and a grant's max_bytes land in the trace's instance record."""
    policy = Policy(dirs=(DirGrant(tmp_path, "/rw", readonly=False, max_bytes=4096),), max_open=9)
    trace = tmp_path / "t.mtytrace"
    with Recorder(trace) as recorder:
        instance = Instance(Component.load(probe_wasm), policy=policy, record=recorder)
        try:
            instance.call("run", "result = 'ok'")
        finally:
            instance.close()
    head = next(r for r in read_trace(trace).records() if r["k"] == "instance")
    assert head["policy"]["max_open"] == 9
    assert head["policy"]["dirs"][0]["max_bytes"] == 4096
