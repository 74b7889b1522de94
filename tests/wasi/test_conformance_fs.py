"""wasi:filesystem as wasmtime and POSIX answer it (issue 36): inherited directory rights, guest
symlinks that never lead out of their grant, trailing slashes, access-mode errors."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty.abi import Ok
from mighty.wasi import DirGrant, MemoryDir, Policy
from mighty.wasi._memfs import ENTRY_COST
from mighty.wasi._paths import MAX_LINK_PARTS, MAX_SYMLINKS
from tests.wasi.test_filesystem import CREATE, FOLLOW, NONE, RW, Guest, R

pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture
def grants(tmp_path: Path) -> Iterator[tuple[Guest, Path]]:
    """Writable /rw and /rw2, read-only /ro, and a secret beside them that no grant holds."""
    for name in ("rw", "rw2", "ro", "outside"):
        (tmp_path / name).mkdir()
    (tmp_path / "outside" / "secret").write_bytes(b"SECRET")
    (tmp_path / "ro" / "data").write_bytes(b"ro data")
    (tmp_path / "rw2" / "other").write_bytes(b"other grant")
    policy = Policy(
        dirs=(
            DirGrant(tmp_path / "rw", "/rw", readonly=False),
            DirGrant(tmp_path / "rw2", "/rw2", readonly=False),
            DirGrant(tmp_path / "ro", "/ro", readonly=True),
        ),
        max_read=1024,
    )
    guest = Guest(policy)
    yield guest, tmp_path
    guest.close()


def _read(g: Guest, d: object, path: str) -> bytes:
    data: bytes = g.ok("read", g.open(d, path), 100, 0)[0]
    return data


# -- rights -------------------------------------------------------------------------------


def test_rw_grant_is_writable_all_the_way_down(grants: tuple[Guest, Path]) -> None:
    """Directories opened with no flags at all, three deep in a :rw grant, can be changed."""
    g, tmp = grants
    d = g.dirs["/rw"]
    for name in ("a", "b", "c"):
        g.ok("create-directory-at", d, name)
        d = g.ok("open-at", d, NONE, name, frozenset({"directory"}), frozenset())
        assert g.ok("get-flags", d) == {"read", "mutate-directory"}
    g.ok("write", g.ok("open-at", d, NONE, "f", CREATE, RW), b"deep", 0)
    g.ok("rename-at", d, "f", d, "g")
    assert (tmp / "rw" / "a" / "b" / "c" / "g").read_bytes() == b"deep"
    g.ok("unlink-file-at", d, "g")


def test_read_only_grant_stays_read_only_all_the_way_down(grants: tuple[Guest, Path]) -> None:
    """Asking for mutate-directory below a read-only grant is refused; what opens is read-only."""
    g, tmp = grants
    (tmp / "ro" / "sub" / "deeper").mkdir(parents=True)
    ro = g.dirs["/ro"]
    mutate = frozenset({"read", "mutate-directory"})
    assert g.err("open-at", ro, NONE, "sub", NONE, mutate) == "read-only"
    sub = g.open(ro, "sub")
    deeper = g.open(sub, "deeper")
    assert g.ok("get-flags", deeper) == {"read"}
    assert g.err("create-directory-at", deeper, "x") == "read-only"
    assert g.err("open-at", deeper, NONE, "f", CREATE, RW) == "read-only"
    assert not (tmp / "ro" / "sub" / "deeper" / "x").exists()


def test_memory_directories_inherit_too() -> None:
    """A memory directory's subdirectory has its grant's rights, writable or not."""
    g = Guest(Policy(dirs=(MemoryDir("/m", {"d/x": b"1"}), MemoryDir("/mro", {"d/x": b"1"}, True))))
    try:
        d = g.open(g.dirs["/m"], "d")
        assert g.ok("get-flags", d) == {"read", "mutate-directory"}
        g.ok("create-directory-at", d, "new")
        ro = g.open(g.dirs["/mro"], "d")
        assert g.ok("get-flags", ro) == {"read"}
        assert g.err("create-directory-at", ro, "new") == "read-only"
    finally:
        g.close()


def test_access_mode_errors_are_bad_descriptor(grants: tuple[Guest, Path]) -> None:
    """Writing a read-only descriptor, or reading a write-only one, is bad-descriptor (EBADF)."""
    g, tmp = grants
    (tmp / "rw" / "f").write_bytes(b"abc")
    rw = g.dirs["/rw"]
    ro_file = g.open(rw, "f")
    for name, *args in [
        ("write", ro_file, b"x", 0),
        ("write-via-stream", ro_file, 0),
        ("append-via-stream", ro_file),
        ("set-size", ro_file, 0),
    ]:
        assert g.err(str(name), *args) == "bad-descriptor", name
    wo = g.ok("open-at", rw, NONE, "f", NONE, frozenset({"write"}))
    assert g.err("read", wo, 1, 0) == "bad-descriptor"
    assert g.err("read-via-stream", wo, 0) == "bad-descriptor"
    assert (tmp / "rw" / "f").read_bytes() == b"abc"


# -- symlinks -----------------------------------------------------------------------------


def test_guest_symlinks_create_read_follow_remove(grants: tuple[Guest, Path]) -> None:
    """In a :rw grant a guest makes links, reads them, follows them and removes them."""
    g, tmp = grants
    rw = g.dirs["/rw"]
    g.ok("create-directory-at", rw, "dir")
    g.ok("write", g.ok("open-at", rw, NONE, "dir/file", CREATE, RW), b"hello", 0)
    g.ok("symlink-at", rw, "dir/file", "to-file")
    g.ok("symlink-at", rw, "dir", "to-dir")
    g.ok("symlink-at", rw, "../dir/file", "dir/up")  # climbs within the grant
    assert g.ok("readlink-at", rw, "to-file") == "dir/file"
    assert os.readlink(tmp / "rw" / "to-file") == "dir/file"
    assert g.ok("stat-at", rw, NONE, "to-file")["type"] == "symbolic-link"
    assert g.ok("stat-at", rw, FOLLOW, "to-file")["type"] == "regular-file"
    assert _read(g, rw, "to-file") == b"hello"
    assert _read(g, rw, "to-dir/file") == b"hello"
    assert _read(g, rw, "to-dir/up") == b"hello"
    assert g.err("open-at", rw, NONE, "to-file", NONE, R) == "loop"  # O_NOFOLLOW, as wasmtime
    assert g.listdir(rw)["to-dir"] == "symbolic-link"
    assert g.err("symlink-at", rw, "x", "to-file") == "exist"
    g.ok("unlink-file-at", rw, "to-dir")
    assert (tmp / "rw" / "dir" / "file").exists()
    g.ok("symlink-at", rw, "missing", "dangling")
    assert g.err("open-at", rw, FOLLOW, "dangling", NONE, R) == "no-entry"
    g.ok("open-at", rw, FOLLOW, "dangling", CREATE, RW)  # creates its target, in the grant
    assert (tmp / "rw" / "missing").exists()


def test_symlinks_refused_in_read_only_and_memory_grants(grants: tuple[Guest, Path]) -> None:
    """A read-only grant never gets a link (read-only); a memory directory has none at all."""
    g, tmp = grants
    assert g.err("symlink-at", g.dirs["/ro"], "data", "l") == "read-only"
    assert os.listdir(tmp / "ro") == ["data"]
    mem = Guest(Policy(dirs=(MemoryDir("/m", {"a": b"1"}),)))
    try:
        assert mem.err("symlink-at", mem.dirs["/m"], "a", "l") == "not-permitted"
    finally:
        mem.close()


@pytest.mark.parametrize(
    "target",
    [
        "/",
        "/etc/passwd",
        "..",
        "../outside/secret",
        "../rw2/other",  # another grant
        "a/../../outside",
        "dir/../../..",
        "x\x00",
        "",
        "a/" * 2100,
    ],
)
def test_escaping_link_targets_are_refused_at_creation(
    grants: tuple[Guest, Path], target: str
) -> None:
    """A link whose text is absolute, climbs above its descriptor or is malformed is not made."""
    g, tmp = grants
    rw = g.dirs["/rw"]
    g.ok("create-directory-at", rw, "dir")
    assert g.err("symlink-at", rw, target, "l") in {
        "not-permitted",
        "invalid",
        "no-entry",
        "name-too-long",
    }
    dir_fd = g.open(rw, "dir")
    assert g.err("symlink-at", dir_fd, "../" + target.lstrip("/"), "l") in {
        "not-permitted",
        "invalid",
        "name-too-long",
    }
    assert sorted(os.listdir(tmp / "rw")) == ["dir"]
    assert os.listdir(tmp / "rw" / "dir") == []


def test_a_link_allowed_at_creation_still_cannot_lead_out(grants: tuple[Guest, Path]) -> None:
    """`s -> .` and `t -> s/..` each look harmless; following t is still refused in the host
    (the kernel would land outside), and so is every link a guest moves upward by renaming."""
    g, tmp = grants
    rw = g.dirs["/rw"]
    g.ok("symlink-at", rw, ".", "s")
    g.ok("symlink-at", rw, "s/..", "t")
    for path in ("t", "t/outside/secret", "t/rw2/other", "s/../outside/secret"):
        assert g.err("open-at", rw, FOLLOW, path, NONE, R) == "not-permitted", path
    assert g.err("stat-at", rw, FOLLOW, "t") == "not-permitted"
    # A link made one level down, then renamed to the grant's root: its `..` now climbs out.
    g.ok("create-directory-at", rw, "d")
    g.ok("symlink-at", rw, "../outside", "d/up")
    g.ok("rename-at", rw, "d/up", rw, "up")
    assert g.err("open-at", rw, FOLLOW, "up/secret", NONE, R) == "not-permitted"
    assert g.err("readlink-at", rw, "up") == "not-permitted"
    assert (tmp / "outside" / "secret").read_bytes() == b"SECRET"


def test_links_across_grants_are_not_followed(grants: tuple[Guest, Path]) -> None:
    """A link the host left in one grant pointing into another is not-permitted, both ways."""
    g, tmp = grants
    (tmp / "rw" / "to-rw2").symlink_to("../rw2/other")
    (tmp / "rw" / "to-ro-abs").symlink_to(tmp / "ro" / "data")
    (tmp / "rw2" / "to-rw").symlink_to(tmp / "rw")
    rw, rw2 = g.dirs["/rw"], g.dirs["/rw2"]
    assert g.err("open-at", rw, FOLLOW, "to-rw2", NONE, R) == "not-permitted"
    assert g.err("open-at", rw, FOLLOW, "to-ro-abs", NONE, RW) == "not-permitted"
    assert g.err("create-directory-at", rw2, "to-rw/new") == "not-permitted"
    assert g.err("link-at", rw, FOLLOW, "to-rw2", rw, "hard") == "not-permitted"
    assert not (tmp / "rw" / "new").exists()
    assert (tmp / "rw2" / "other").read_bytes() == b"other grant"


def test_symlink_swapped_between_calls(grants: tuple[Guest, Path]) -> None:
    """Each call resolves afresh: a directory the guest swaps for a link, or the host swaps for
    a link to outside, between two calls, never takes the second call out."""
    g, tmp = grants
    rw = g.dirs["/rw"]
    g.ok("create-directory-at", rw, "d")
    g.ok("write", g.ok("open-at", rw, NONE, "d/f", CREATE, RW), b"in", 0)
    held = g.open(rw, "d")
    assert _read(g, rw, "d/f") == b"in"
    # The guest swaps d for a link to a sibling directory: followed, inside.
    g.ok("rename-at", rw, "d", rw, "real")
    g.ok("symlink-at", rw, "real", "d")
    assert _read(g, rw, "d/f") == b"in"
    # The host swaps d for a link to outside: refused, and the held descriptor still works.
    (tmp / "rw" / "d").unlink()
    (tmp / "rw" / "d").symlink_to(tmp / "outside")
    assert g.err("open-at", rw, FOLLOW, "d/secret", NONE, R) == "not-permitted"
    assert g.err("unlink-file-at", rw, "d/secret") == "not-permitted"
    assert _read(g, held, "f") == b"in"
    assert g.err("open-at", held, FOLLOW, "../outside/secret", NONE, R) == "not-permitted"
    assert (tmp / "outside" / "secret").read_bytes() == b"SECRET"


def test_guest_flipping_its_own_links_races_no_open_outside(grants: tuple[Guest, Path]) -> None:
    """A second guest on the same grant flips `d` between a directory and links that a kernel
    would follow out (`t -> s/..`, `s -> .`) while the first opens through it: every open that
    succeeds is the file inside, never the secret beside the grant."""
    g, tmp = grants
    other = Guest(Policy(dirs=(DirGrant(tmp / "rw", "/rw", readonly=False),)))
    rw, rw_other = g.dirs["/rw"], other.dirs["/rw"]
    g.ok("symlink-at", rw, ".", "s")
    g.ok("symlink-at", rw, "s/..", "t")
    g.ok("create-directory-at", rw, "real")
    (tmp / "rw" / "real" / "secret").write_bytes(b"inside")
    g.ok("symlink-at", rw, "real", "d")
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            for target in ("t/outside", "s/../outside", "real"):
                other.call("unlink-file-at", rw_other, "d")
                other.call("symlink-at", rw_other, target, "d")

    thread = threading.Thread(target=flip)
    thread.start()
    try:
        for _ in range(2000):
            result = g.call("open-at", rw, FOLLOW, "d/secret", NONE, R)
            if isinstance(result, Ok):
                desc = g.ctx.get(result.value.kind, result.value.rep)
                assert g.ok("read", desc, 100, 0)[0] == b"inside"
                desc.close()
    finally:
        stop.set()
        thread.join()
        other.close()
    assert (tmp / "outside" / "secret").read_bytes() == b"SECRET"


def test_link_chains_end_in_loop_after_the_limit(grants: tuple[Guest, Path]) -> None:
    """A chain of MAX_SYMLINKS links resolves; one more, or a cycle, is loop (ELOOP)."""
    g, tmp = grants
    rw = g.dirs["/rw"]
    (tmp / "rw" / "end").write_bytes(b"end")
    previous = "end"
    for i in range(MAX_SYMLINKS + 1):
        g.ok("symlink-at", rw, previous, f"l{i}")
        previous = f"l{i}"
    assert _read(g, rw, f"l{MAX_SYMLINKS - 1}") == b"end"
    assert g.err("open-at", rw, FOLLOW, f"l{MAX_SYMLINKS}", NONE, R) == "loop"
    g.ok("symlink-at", rw, "b", "a")
    g.ok("symlink-at", rw, "a", "b")
    assert g.err("open-at", rw, FOLLOW, "a", NONE, R) == "loop"
    assert g.err("stat-at", rw, FOLLOW, "a/x") == "loop"
    g.ok("symlink-at", rw, "self", "self")
    assert g.err("open-at", rw, FOLLOW, "self", CREATE, RW) == "loop"


def test_link_targets_bound_the_walk(grants: tuple[Guest, Path]) -> None:
    """Links whose targets add more than MAX_LINK_PARTS components to one walk are a loop, so
    40 links of `a/..` x 800 cannot make one call cost 64,000 openat calls."""
    g, tmp = grants
    rw = g.dirs["/rw"]
    (tmp / "rw" / "a").mkdir()
    (tmp / "rw" / "end").write_bytes(b"end")
    detour = "/".join(["a", ".."] * 800)
    previous = "end"
    for i in range(10):
        g.ok("symlink-at", rw, f"{detour}/{previous}", f"l{i}")
        previous = f"l{i}"
    assert 2 * 1601 <= MAX_LINK_PARTS < 3 * 1601
    assert _read(g, rw, "l1") == b"end"
    assert g.err("open-at", rw, FOLLOW, "l2", NONE, R) == "loop"


def test_symlinks_are_charged_to_the_write_quota(tmp_path: Path) -> None:
    """A link costs ENTRY_COST plus its target's bytes of a grant's max_bytes."""
    g = Guest(Policy(dirs=(DirGrant(tmp_path, "/q", readonly=False, max_bytes=2 * ENTRY_COST),)))
    try:
        q = g.dirs["/q"]
        g.ok("symlink-at", q, "t" * ENTRY_COST, "one")
        assert g.err("symlink-at", q, "t", "two") == "insufficient-space"
        assert os.listdir(tmp_path) == ["one"]
    finally:
        g.close()


_PARTS = st.sampled_from(["..", ".", "a", "b", "l0", "l1", "l2", "secret", ""])
_TARGETS = st.lists(_PARTS, min_size=1, max_size=5).map("/".join)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    links=st.lists(st.tuples(st.sampled_from(["", "a/", "a/b/"]), _TARGETS), max_size=3),
    paths=st.lists(_TARGETS, min_size=1, max_size=6),
)
def test_no_open_lands_outside(
    tmp_path_factory: pytest.TempPathFactory, links: list[tuple[str, str]], paths: list[str]
) -> None:
    """Whatever links the guest makes (and the host plants) and whatever paths it opens, every
    descriptor it gets is a file or directory inside its grant."""
    tmp = tmp_path_factory.mktemp("prop")
    root, outside = tmp / "root", tmp / "outside"
    (root / "a" / "b").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_bytes(b"SECRET")
    (root / "a" / "b" / "l2").symlink_to("../../../outside")  # planted by the host
    g = Guest(Policy(dirs=(DirGrant(root, "/g", readonly=False),)))
    try:
        base = g.dirs["/g"]
        for i, (where, target) in enumerate(links):
            g.call("symlink-at", base, target, f"{where}l{i % 2}")
        for path in paths:
            for flags in (NONE, CREATE):
                result = g.call("open-at", base, FOLLOW, path, flags, R)
                if isinstance(result, Ok):
                    desc = g.ctx.get(result.value.kind, result.value.rep)
                    where_fd = os.readlink(f"/proc/self/fd/{desc.fd}")
                    assert where_fd == str(root) or where_fd.startswith(f"{root}/"), path
                    desc.close()
        assert os.listdir(outside) == ["secret"]
    finally:
        g.close()


# -- trailing slashes ----------------------------------------------------------------------


def test_trailing_slash_on_a_file_is_not_directory(grants: tuple[Guest, Path]) -> None:
    """`file/` names a directory or nothing: not-directory for every call on a file, as POSIX."""
    g, tmp = grants
    rw = g.dirs["/rw"]
    (tmp / "rw" / "file").write_bytes(b"x")
    (tmp / "rw" / "dir").mkdir()
    (tmp / "rw" / "link-to-file").symlink_to("file")
    for path in ("file/", "file/.", "link-to-file/"):
        assert g.err("stat-at", rw, NONE, path) == "not-directory", path
        assert g.err("open-at", rw, NONE, path, NONE, R) == "not-directory", path
        assert g.err("unlink-file-at", rw, path) == "not-directory", path
        assert g.err("remove-directory-at", rw, path) == "not-directory", path
        assert g.err("rename-at", rw, path, rw, "moved") == "not-directory", path
    assert g.err("rename-at", rw, "file", rw, "new/") == "not-directory"
    assert g.err("unlink-file-at", rw, "dir/") == "is-directory"
    assert g.err("open-at", rw, NONE, "new/", CREATE, RW) == "is-directory"
    assert g.err("symlink-at", rw, "file", "new/") == "no-entry"
    assert g.err("symlink-at", rw, "file", "dir/") == "exist"
    assert g.err("symlink-at", rw, "file", "file/") == "not-directory"
    assert g.err("link-at", rw, NONE, "file", rw, "new/") == "no-entry"
    assert g.ok("stat-at", rw, NONE, "dir/")["type"] == "directory"
    assert sorted(os.listdir(tmp / "rw")) == ["dir", "file", "link-to-file"]
    # Directories take slashes anywhere.
    g.ok("rename-at", rw, "dir/", rw, "dir2/")
    g.ok("create-directory-at", rw, "made/")
    g.ok("remove-directory-at", rw, "made/")
    g.ok("remove-directory-at", rw, "dir2/")
    g.ok("unlink-file-at", rw, "file")


def test_trailing_slash_in_memory_directories() -> None:
    """A memory directory answers `file/` with not-directory too."""
    g = Guest(Policy(dirs=(MemoryDir("/m", {"f": b"1", "d/x": b"2"}),)))
    try:
        m = g.dirs["/m"]
        assert g.err("stat-at", m, NONE, "f/") == "not-directory"
        assert g.err("open-at", m, NONE, "f/", NONE, R) == "not-directory"
        assert g.err("unlink-file-at", m, "f/") == "not-directory"
        assert g.err("open-at", m, NONE, "new/", CREATE, RW) == "is-directory"
        assert g.err("rename-at", m, "f", m, "new/") == "not-directory"
        assert g.ok("stat-at", m, NONE, "d/")["type"] == "directory"
        g.ok("rename-at", m, "d/", m, "d2/")
        assert g.ok("stat-at", m, NONE, "d2/x")["type"] == "regular-file"
    finally:
        g.close()


def test_open_directory_flag_with_create_is_invalid(grants: tuple[Guest, Path]) -> None:
    """open-at cannot create or truncate a directory: invalid, and nothing is made."""
    g, tmp = grants
    rw = g.dirs["/rw"]
    for extra in ("create", "exclusive", "truncate"):
        flags = frozenset({"directory", extra})
        assert g.err("open-at", rw, NONE, "x", flags, R) == "invalid"
    assert os.listdir(tmp / "rw") == []
