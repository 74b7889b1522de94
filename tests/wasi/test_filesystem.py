"""wasi:filesystem on host directories and memory directories, called through its bindings."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import wasmtime

from mighty.abi import Err, Ok, Variant
from mighty.engine import get_engine
from mighty.gate import GuestContext, Handle
from mighty.wasi import DirGrant, MemoryDir, Policy
from mighty.wasi import _filesystem as fs
from mighty.wasi._streams import INPUT_STREAM, OUTPUT_STREAM, StreamClosed, StreamFailed

FNS: dict[str, Callable[..., Any]] = {b.name: b.fn for b in fs.bindings()}
NONE: frozenset[str] = frozenset()
FOLLOW = frozenset({"symlink-follow"})
RW = frozenset({"read", "write"})
R = frozenset({"read"})
CREATE = frozenset({"create"})
MUTATIONS_REFUSED = {"read-only", "not-permitted", "access", "bad-descriptor"}


class Guest:
    """A filesystem instance driven the way the gate drives it."""

    def __init__(self, policy: Policy, ctx: GuestContext | None = None) -> None:
        self.ctx = ctx or GuestContext(wasmtime.Store(get_engine()))
        fs.setup(self.ctx, policy)
        self.dirs = {
            guest: self.ctx.get(fs.DESCRIPTOR, h.rep)
            for h, guest in FNS["get-directories"](self.ctx)
        }

    def call(self, name: str, *args: Any) -> Any:
        """Call ``[method]descriptor.<name>`` (or a free function) with the guest's context."""
        fn = FNS.get(f"[method]descriptor.{name}") or FNS[name]
        return fn(self.ctx, *args)

    def ok(self, name: str, *args: Any) -> Any:
        """Call and unwrap Ok; Handles become their host objects."""
        result = self.call(name, *args)
        assert isinstance(result, Ok), (name, args, result)
        value = result.value
        if isinstance(value, Handle):
            return self.ctx.get(value.kind, value.rep)
        return value

    def err(self, name: str, *args: Any) -> str:
        """Call and return the Err code."""
        result = self.call(name, *args)
        assert isinstance(result, Err), (name, args, result)
        assert result.value in fs.ERROR_CODES
        return str(result.value)

    def open(
        self, d: Any, path: str, oflags: frozenset[str] = NONE, flags: frozenset[str] = R
    ) -> Any:
        return (
            self.ok("open-at", FOLLOW, path, oflags, flags)
            if d is None
            else self.ok("open-at", d, FOLLOW, path, oflags, flags)
        )

    def listdir(self, d: Any) -> dict[str, str]:
        stream = self.ok("read-directory", d)
        out: dict[str, str] = {}
        while True:
            r = FNS["[method]directory-entry-stream.read-directory-entry"](self.ctx, stream)
            assert isinstance(r, Ok)
            if r.value is None:
                return out
            out[r.value["name"]] = r.value["type"]

    def close(self) -> None:
        fs.close_all(self.ctx)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[Guest, Path]]:
    """A read-write preopen at /rw and a read-only one at /ro, plus a secret outside both."""
    (tmp_path / "rw").mkdir()
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "data.txt").write_bytes(b"read only")
    (tmp_path / "ro" / "sub").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"SECRET")
    policy = Policy(
        dirs=(
            DirGrant(tmp_path / "rw", "/rw", readonly=False),
            DirGrant(tmp_path / "ro", "/ro", readonly=True),
        ),
        max_read=1024,
    )
    guest = Guest(policy)
    yield guest, tmp_path
    guest.close()


def test_preopens_listed_with_rights(host: tuple[Guest, Path]) -> None:
    """get-directories returns each grant with read, plus mutate-directory when writable."""
    g, _ = host
    assert set(g.dirs) == {"/rw", "/ro"}
    assert g.ok("get-flags", g.dirs["/rw"]) == {"read", "mutate-directory"}
    assert g.ok("get-flags", g.dirs["/ro"]) == {"read"}
    assert g.ok("get-type", g.dirs["/rw"]) == "directory"


def test_create_write_read_stat(host: tuple[Guest, Path]) -> None:
    """A created file is written, read back at offsets, and stat'ed."""
    g, tmp = host
    f = g.ok("open-at", g.dirs["/rw"], NONE, "new.txt", CREATE, RW)
    assert g.ok("write", f, b"hello world", 0) == 11
    assert g.ok("read", f, 5, 6) == (b"world", False)
    assert g.ok("read", f, 100, 6) == (b"world", True)
    assert g.ok("read", f, 10, 50) == (b"", True)
    assert (tmp / "rw" / "new.txt").read_bytes() == b"hello world"
    s = g.ok("stat", f)
    assert s["type"] == "regular-file"
    assert s["size"] == 11
    assert s["data-modification-timestamp"]["seconds"] > 0
    assert g.ok("stat-at", g.dirs["/rw"], NONE, "new.txt")["size"] == 11


def test_read_is_capped_by_max_read(host: tuple[Guest, Path]) -> None:
    """A read asking for more than policy.max_read gets max_read bytes and no EOF."""
    g, tmp = host
    (tmp / "rw" / "big").write_bytes(b"x" * 5000)
    f = g.open(g.dirs["/rw"], "big")
    data, eof = g.ok("read", f, 1 << 40, 0)
    assert len(data) == 1024
    assert not eof


def test_streams_read_write_append(host: tuple[Guest, Path]) -> None:
    """read-via-stream, write-via-stream and append-via-stream move through the file."""
    g, tmp = host
    f = g.ok("open-at", g.dirs["/rw"], NONE, "s.txt", CREATE, RW)
    out = g.ok("write-via-stream", f, 2)
    out.write(b"ab")
    app = g.ok("append-via-stream", f)
    app.write(b"cd")
    assert (tmp / "rw" / "s.txt").read_bytes() == b"\0\0abcd"
    inp = g.ok("read-via-stream", f, 2)
    assert inp.read(3) == b"abc"
    assert inp.read(100) == b"d"
    with pytest.raises(StreamClosed):
        inp.read(1)
    for obj in (inp, out, app):
        obj.close()
    assert g.ctx.live(INPUT_STREAM) == 1
    assert g.ctx.live(OUTPUT_STREAM) == 2


def test_directories_rename_unlink(host: tuple[Guest, Path]) -> None:
    """mkdir, readdir, rename, unlink and rmdir work inside a writable preopen."""
    g, tmp = host
    rw = g.dirs["/rw"]
    g.ok("create-directory-at", rw, "d")
    assert g.err("create-directory-at", rw, "d") == "exist"
    g.ok("open-at", rw, NONE, "d/f", CREATE, RW)
    assert g.listdir(rw) == {"d": "directory"}
    assert g.listdir(g.open(rw, "d")) == {"f": "regular-file"}
    g.ok("rename-at", rw, "d/f", rw, "g")
    assert (tmp / "rw" / "g").exists()
    assert g.err("remove-directory-at", rw, "g") == "not-directory"
    g.ok("open-at", rw, NONE, "d/h", CREATE, RW)
    assert g.err("remove-directory-at", rw, "d") == "not-empty"
    assert g.err("unlink-file-at", rw, "d") == "is-directory"
    g.ok("unlink-file-at", rw, "d/h")
    g.ok("remove-directory-at", rw, "d")
    g.ok("unlink-file-at", rw, "g")
    assert g.listdir(rw) == {}


def test_open_flags(host: tuple[Guest, Path]) -> None:
    """exclusive, truncate and directory behave as in POSIX."""
    g, tmp = host
    rw = g.dirs["/rw"]
    (tmp / "rw" / "f").write_bytes(b"abc")
    assert g.err("open-at", rw, NONE, "f", frozenset({"create", "exclusive"}), RW) == "exist"
    assert g.err("open-at", rw, NONE, "f", frozenset({"directory"}), R) == "not-directory"
    assert g.err("open-at", rw, NONE, "nope", NONE, R) == "no-entry"
    g.ok("open-at", rw, NONE, "f", frozenset({"truncate"}), RW)
    assert (tmp / "rw" / "f").read_bytes() == b""


def test_times_links_hashes(host: tuple[Guest, Path]) -> None:
    """set-times(-at), link-at, is-same-object and metadata-hash behave."""
    g, tmp = host
    rw = g.dirs["/rw"]
    f = g.ok("open-at", rw, NONE, "f", CREATE, RW)
    stamp = Variant("timestamp", {"seconds": 1000, "nanoseconds": 5})
    g.ok("set-times", f, Variant("no-change"), stamp)
    assert (tmp / "rw" / "f").stat().st_mtime_ns == 1000 * 10**9 + 5
    g.ok("set-times-at", rw, NONE, "f", stamp, Variant("now"))
    assert (tmp / "rw" / "f").stat().st_atime_ns == 1000 * 10**9 + 5
    g.ok("link-at", rw, NONE, "f", rw, "f2")
    f2 = g.open(rw, "f2")
    assert g.call("is-same-object", f, f2) is True
    assert g.call("is-same-object", f, rw) is False
    h1 = g.ok("metadata-hash", f)
    assert h1 == g.ok("metadata-hash-at", rw, NONE, "f2")
    g.ok("write", f, b"more", 0)
    assert g.ok("metadata-hash", f) != h1
    g.ok("set-size", f, 2)
    assert (tmp / "rw" / "f").read_bytes() == b"mo"
    g.ok("sync", f)
    g.ok("sync-data", f)
    g.ok("advise", f, 0, 10, "sequential")


def test_read_only_preopen_refuses_every_mutation(host: tuple[Guest, Path]) -> None:
    """Nothing in a read-only preopen can be created, changed, renamed or removed."""
    g, tmp = host
    ro, rw = g.dirs["/ro"], g.dirs["/rw"]
    stamp = Variant("now")
    refused = [
        ("open-at", ro, NONE, "data.txt", NONE, RW),
        ("open-at", ro, NONE, "new", CREATE, R),
        ("open-at", ro, NONE, "data.txt", frozenset({"truncate"}), R),
        ("open-at", ro, NONE, "sub", NONE, frozenset({"read", "mutate-directory"})),
        ("create-directory-at", ro, "d"),
        ("remove-directory-at", ro, "sub"),
        ("unlink-file-at", ro, "data.txt"),
        ("rename-at", ro, "data.txt", ro, "x"),
        ("set-times-at", ro, NONE, "data.txt", stamp, stamp),
        ("symlink-at", ro, "data.txt", "l"),
        ("link-at", ro, NONE, "data.txt", ro, "l"),
        ("set-times", ro, stamp, stamp),
    ]
    for name, *args in refused:
        assert g.err(str(name), *args) in MUTATIONS_REFUSED, name
    f = g.open(ro, "data.txt")
    for name, *args in [
        ("write", f, b"x", 0),
        ("set-size", f, 0),
        ("set-times", f, stamp, stamp),
        ("write-via-stream", f, 0),
        ("append-via-stream", f),
    ]:
        assert g.err(str(name), *args) in MUTATIONS_REFUSED, name
    sub = g.open(ro, "sub")
    assert g.err("create-directory-at", sub, "x") in MUTATIONS_REFUSED
    assert g.ok("read", f, 100, 0) == (b"read only", True)
    # Across preopens: cross-device, and never a way to write the read-only file.
    assert g.err("link-at", ro, NONE, "data.txt", rw, "stolen") == "cross-device"
    assert g.err("rename-at", rw, "x", ro, "y") in MUTATIONS_REFUSED
    assert (tmp / "ro" / "data.txt").read_bytes() == b"read only"
    assert sorted(os.listdir(tmp / "ro")) == ["data.txt", "sub"]


def test_read_only_file_descriptor_cannot_write(host: tuple[Guest, Path]) -> None:
    """In a writable preopen, a file opened for read only cannot be written."""
    g, tmp = host
    (tmp / "rw" / "f").write_bytes(b"abc")
    f = g.open(g.dirs["/rw"], "f")
    assert g.err("write", f, b"x", 0) == "bad-descriptor"
    wo = g.ok("open-at", g.dirs["/rw"], NONE, "f", NONE, frozenset({"write"}))
    assert g.err("read", wo, 1, 0) == "bad-descriptor"


def test_opened_directory_inherits_its_grant(host: tuple[Guest, Path]) -> None:
    """A directory opened without asking for mutate-directory still has its parent's rights."""
    g, tmp = host
    (tmp / "rw" / "d").mkdir()
    d = g.open(g.dirs["/rw"], "d")
    assert g.ok("get-flags", d) == {"read", "mutate-directory"}
    g.ok("open-at", d, NONE, "f", CREATE, RW)
    g.ok("create-directory-at", d, "x")
    sub = g.open(g.dirs["/ro"], "sub")
    assert g.ok("get-flags", sub) == {"read"}
    assert g.err("create-directory-at", sub, "x") == "read-only"


ESCAPES = [
    "..",
    "../outside/secret",
    "a/../../outside/secret",
    "/etc/passwd",
    "link-out/secret",
    "link-passwd",
    "link-dir-out",
    "link-dir-out/secret",
    "ok\x00",
    "a/" * 2100,
    "x" * 300,
]


@pytest.mark.parametrize("path", ESCAPES)
def test_escapes_are_refused_everywhere(host: tuple[Guest, Path], path: str) -> None:
    """Every path-taking function refuses escaping paths, and nothing outside changes."""
    g, tmp = host
    rw = g.dirs["/rw"]
    (tmp / "rw" / "a").mkdir()
    (tmp / "rw" / "link-out").symlink_to(tmp / "outside")
    (tmp / "rw" / "link-passwd").symlink_to("/etc/passwd")
    (tmp / "rw" / "link-dir-out").symlink_to("../outside")
    stamp = Variant("timestamp", {"seconds": 1, "nanoseconds": 0})
    calls = [
        ("open-at", rw, FOLLOW, path, NONE, R),
        ("open-at", rw, FOLLOW, path, CREATE, RW),
        ("stat-at", rw, FOLLOW, path),
        ("metadata-hash-at", rw, FOLLOW, path),
        ("set-times-at", rw, FOLLOW, path, stamp, stamp),
        ("create-directory-at", rw, path + "/new"),
        ("unlink-file-at", rw, path + "/secret"),
        ("remove-directory-at", rw, path + "/x"),
        ("rename-at", rw, path + "/secret", rw, "stolen"),
        ("link-at", rw, FOLLOW, path, rw, "hard"),
        ("readlink-at", rw, path if path.startswith("link") else path + "/x"),
    ]
    for name, *args in calls:
        result = g.call(str(name), *args)
        assert isinstance(result, Err), (name, path, result)
    assert (tmp / "outside" / "secret").read_bytes() == b"SECRET"
    assert os.listdir(tmp / "outside") == ["secret"]
    assert (tmp / "outside" / "secret").stat().st_mtime_ns != 10**9


def test_symlink_escape_codes(host: tuple[Guest, Path]) -> None:
    """Links out of the root are not-permitted; in-root links are followed and made."""
    g, tmp = host
    rw = g.dirs["/rw"]
    (tmp / "rw" / "real").write_bytes(b"in")
    (tmp / "rw" / "inside").symlink_to("real")
    (tmp / "rw" / "passwd").symlink_to("/etc/passwd")
    assert g.err("open-at", rw, FOLLOW, "passwd", NONE, R) == "not-permitted"
    assert g.err("open-at", rw, NONE, "passwd", NONE, R) == "loop"
    assert g.err("readlink-at", rw, "passwd") == "not-permitted"
    assert g.ok("stat-at", rw, NONE, "passwd")["type"] == "symbolic-link"
    assert g.ok("readlink-at", rw, "inside") == "real"
    assert g.ok("read", g.open(rw, "inside"), 10, 0) == (b"in", True)
    g.ok("symlink-at", rw, "real", "l2")
    assert g.ok("read", g.open(rw, "l2"), 10, 0) == (b"in", True)
    assert g.err("symlink-at", rw, "/etc/passwd", "l3") == "not-permitted"
    assert g.err("open-at", rw, NONE, "/etc/passwd", NONE, R) == "not-permitted"
    assert g.err("open-at", rw, NONE, "a\x00", NONE, R) == "invalid"
    assert g.err("open-at", rw, NONE, "a/" * 2100, NONE, R) == "name-too-long"


def test_directory_swapped_for_symlink_race(host: tuple[Guest, Path]) -> None:
    """A thread flipping a directory and a symlink to outside never lets an open land outside."""
    g, tmp = host
    rw = g.dirs["/rw"]
    d = tmp / "rw" / "d"
    d.mkdir()
    (d / "secret").write_bytes(b"inside")
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            os.rename(d, tmp / "rw" / "d-real")
            os.symlink(tmp / "outside", d)
            os.unlink(d)
            os.rename(tmp / "rw" / "d-real", d)

    thread = threading.Thread(target=flip)
    thread.start()
    try:
        for _ in range(3000):
            r = g.call("open-at", rw, FOLLOW, "d/secret", NONE, R)
            if isinstance(r, Ok):
                f = g.ctx.get(r.value.kind, r.value.rep)
                assert g.ok("read", f, 100, 0)[0] == b"inside"
                f.close()
    finally:
        stop.set()
        thread.join()


def test_non_utf8_names_are_skipped(host: tuple[Guest, Path]) -> None:
    """read-directory skips names that are not UTF-8 instead of failing."""
    g, tmp = host
    os.close(os.open(os.fsencode(str(tmp / "rw")) + b"/bad\xff", os.O_CREAT | os.O_WRONLY))
    (tmp / "rw" / "good").write_bytes(b"")
    assert g.listdir(g.dirs["/rw"]) == {"good": "regular-file"}


def test_error_code_for_stream_errors(host: tuple[Guest, Path]) -> None:
    """filesystem-error-code reads back the code of a filesystem stream failure."""
    g, _ = host
    assert g.call("filesystem-error-code", "wasi:filesystem error-code io: x") == "io"
    assert g.call("filesystem-error-code", "something else") is None


def test_close_all_closes_fds(tmp_path: Path) -> None:
    """close_all closes every fd an instance still holds."""
    before = len(os.listdir("/proc/self/fd"))
    g = Guest(Policy(dirs=(DirGrant(tmp_path, "/t", readonly=False),)))
    g.ok("open-at", g.dirs["/t"], NONE, "f", CREATE, RW)
    g.ok("read-directory", g.dirs["/t"])
    assert len(os.listdir("/proc/self/fd")) > before
    g.close()
    assert len(os.listdir("/proc/self/fd")) == before


# -- memory directories ---------------------------------------------------------------------


@pytest.fixture
def mem() -> Guest:
    """A memory directory at /m (seeded, 4 KiB) and a read-only one at /mro."""
    return Guest(
        Policy(
            dirs=(
                MemoryDir("/m", {"a.txt": b"alpha", "sub/b.txt": b"beta"}, max_bytes=4096),
                MemoryDir("/mro", {"x": b"x"}, readonly=True),
            )
        )
    )


def test_memory_dir_seeded_and_readable(mem: Guest) -> None:
    """Seeded files and subdirectories are there."""
    m = mem.dirs["/m"]
    assert mem.listdir(m) == {"a.txt": "regular-file", "sub": "directory"}
    assert mem.ok("read", mem.open(m, "sub/b.txt"), 10, 0) == (b"beta", True)
    assert mem.ok("stat-at", m, NONE, "a.txt")["size"] == 5


def test_memory_dir_operations(mem: Guest) -> None:
    """Create, write, stream, rename, link, unlink and rmdir work in memory."""
    m = mem.dirs["/m"]
    f = mem.ok("open-at", m, NONE, "new", CREATE, RW)
    assert mem.ok("write", f, b"hello", 3) == 5
    assert mem.ok("read", f, 100, 0) == (b"\0\0\0hello", True)
    out = mem.ok("append-via-stream", f)
    out.write(b"!")
    assert mem.ok("read-via-stream", f, 3).read(100) == b"hello!"
    mem.ok("create-directory-at", m, "d")
    mem.ok("rename-at", m, "new", m, "d/moved")
    assert mem.err("rename-at", m, "d", m, "d/inner") == "invalid"
    mem.ok("link-at", m, NONE, "d/moved", m, "hard")
    assert mem.call("is-same-object", mem.open(m, "hard"), f) is True
    assert mem.err("remove-directory-at", m, "d") == "not-empty"
    mem.ok("unlink-file-at", m, "d/moved")
    mem.ok("remove-directory-at", m, "d")
    assert mem.err("open-at", m, NONE, "../x", NONE, R) == "not-permitted"
    assert mem.err("open-at", m, NONE, "/x", NONE, R) == "not-permitted"
    assert mem.err("symlink-at", m, "a", "b") == "not-permitted"
    assert mem.ok("read", mem.open(m, "hard"), 100, 0)[0] == b"\0\0\0hello!"


def test_memory_dir_quota(mem: Guest) -> None:
    """Writes past max_bytes fail with insufficient-space, in calls and in streams."""
    m = mem.dirs["/m"]
    f = mem.ok("open-at", m, NONE, "big", CREATE, RW)
    assert mem.err("write", f, b"x" * 5000, 0) == "insufficient-space"
    assert mem.err("set-size", f, 1 << 40) == "insufficient-space"
    out = mem.ok("write-via-stream", f, 0)
    with pytest.raises(StreamFailed) as info:
        out.write(b"x" * 5000)
    assert mem.call("filesystem-error-code", str(info.value)) == "insufficient-space"
    mem.ok("write", f, b"x" * 3000, 0)
    mem.ok("unlink-file-at", m, "big")
    g = mem.ok("open-at", m, NONE, "g", CREATE, RW)
    assert mem.err("write", g, b"y" * 3000, 0) == "insufficient-space"
    out.close()
    f.close()  # the last holder of the unlinked file: its bytes are free now
    assert mem.ok("write", g, b"y" * 3000, 0) == 3000


def test_memory_dir_many_files_bounded(mem: Guest) -> None:
    """Empty files cost bytes too: creating thousands runs out of space."""
    m = mem.dirs["/m"]
    codes = {mem.call("create-directory-at", m, f"d{i}") for i in range(200)}
    assert Err("insufficient-space") in codes


def test_memory_read_only(mem: Guest) -> None:
    """A read-only memory directory refuses mutations."""
    ro = mem.dirs["/mro"]
    assert mem.err("open-at", ro, NONE, "x", NONE, RW) in MUTATIONS_REFUSED
    assert mem.err("unlink-file-at", ro, "x") in MUTATIONS_REFUSED
    assert mem.err("create-directory-at", ro, "d") in MUTATIONS_REFUSED
    assert mem.err("write", mem.open(ro, "x"), b"y", 0) in MUTATIONS_REFUSED
    assert mem.err("rename-at", mem.dirs["/m"], "a.txt", ro, "y") in MUTATIONS_REFUSED


def test_bindings_cover_the_interfaces() -> None:
    """Every function of types and preopens 0.2 is bound."""
    names = {b.name for b in fs.bindings()}
    assert len(names) == 30
    assert {"get-directories", "filesystem-error-code"} <= names
    assert "[method]descriptor.is-same-object" in names


class _Provider:
    """The filesystem module alone as a gate provider."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def resources(self) -> list[Any]:
        return fs.resources()

    def bindings(self) -> list[Any]:
        return fs.bindings()

    def setup(self, ctx: GuestContext) -> None:
        fs.setup(ctx, self.policy)


def test_module_plugs_into_the_gate(tmp_path: Path) -> None:
    """A Gate accepts the module's resources and bindings and sets up its state."""
    from mighty.gate import Gate

    gate = Gate([_Provider(Policy(dirs=(DirGrant(tmp_path, "/t"),)))])
    assert {"wasi:filesystem/types", "wasi:filesystem/preopens"} <= gate.interfaces()
    ctx = gate.context(wasmtime.Store(get_engine()))
    try:
        [(handle, guest)] = FNS["get-directories"](ctx)
        assert guest == "/t"
        assert ctx.live(fs.DESCRIPTOR) == 1
        assert isinstance(ctx.get(handle.kind, handle.rep), fs.HostDescriptor)
    finally:
        fs.close_all(ctx)
        gate.release(ctx)
