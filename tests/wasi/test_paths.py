"""Path resolution beneath a directory fd: nothing a guest writes resolves outside the root."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from mighty.wasi._paths import MAX_NAME, MAX_PATH, FsError, errno_code, resolve, split_path


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A root with a/b/, a file, in-root and escaping symlinks, and its fd."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("secret")
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "f.txt").write_text("f")
    (root / "link-out").symlink_to(outside)
    (root / "link-abs").symlink_to("/etc/passwd")
    (root / "link-in").symlink_to("a/b")
    (root / "link-up").symlink_to("../outside/secret")
    (root / "a" / "link-parent").symlink_to("..")
    (root / "loop1").symlink_to("loop2")
    (root / "loop2").symlink_to("loop1")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield root, fd
    finally:
        os.close(fd)


def where(fd: int, path: str, *, follow: bool = True) -> str:
    """The host path a guest path resolves to (dir realpath + name)."""
    with resolve(fd, path, follow=follow) as (d, name):
        return os.path.join(os.readlink(f"/proc/self/fd/{d}"), name)


def code(fd: int, path: str, *, follow: bool = True) -> str:
    """The error code resolving ``path`` fails with."""
    with pytest.raises(FsError) as info, resolve(fd, path, follow=follow):
        pass
    return info.value.code


def test_split_drops_dots_and_empty_parts() -> None:
    """`.` and empty components vanish; `..` stays for the walk."""
    assert split_path("./a//b/./../c/") == ["a", "b", "..", "c"]


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/etc/passwd", "not-permitted"),
        ("a\x00b", "invalid"),
        ("", "no-entry"),
        ("a/" * (MAX_PATH // 2 + 1), "name-too-long"),
        ("x" * (MAX_NAME + 1), "name-too-long"),
    ],
)
def test_split_refuses(path: str, expected: str) -> None:
    """Absolute, NUL, empty, over-long paths and components are refused with their codes."""
    with pytest.raises(FsError) as info:
        split_path(path)
    assert info.value.code == expected


def test_plain_paths_resolve_inside(tree: tuple[Path, int]) -> None:
    """Ordinary paths resolve to the directory and name expected."""
    root, fd = tree
    assert where(fd, "a/f.txt") == str(root / "a" / "f.txt")
    assert where(fd, "a/b/../f.txt") == str(root / "a" / "f.txt")
    assert where(fd, "a/..") == str(root) + "/."
    assert where(fd, ".") == str(root) + "/."
    assert where(fd, "missing") == str(root / "missing")


@pytest.mark.parametrize(
    "path", ["..", "../root", "a/../../x", "a/b/../../..", "link-out", "link-out/secret"]
)
def test_escapes_are_not_permitted(tree: tuple[Path, int], path: str) -> None:
    """`..` above the base and symlinks leading out are not-permitted."""
    _, fd = tree
    assert code(fd, path) == "not-permitted"


def test_absolute_symlink_is_refused(tree: tuple[Path, int]) -> None:
    """A symlink to /etc/passwd is not followed."""
    _, fd = tree
    assert code(fd, "link-abs") == "not-permitted"
    assert code(fd, "link-up") == "not-permitted"


def test_final_symlink_not_followed_without_flag(tree: tuple[Path, int]) -> None:
    """Without symlink-follow the last component names the link itself."""
    root, fd = tree
    assert where(fd, "link-abs", follow=False) == str(root / "link-abs")


def test_in_root_symlinks_are_followed(tree: tuple[Path, int]) -> None:
    """Symlinks that stay beneath the root are followed."""
    root, fd = tree
    assert where(fd, "link-in") == str(root / "a" / "b")
    assert where(fd, "link-in/../f.txt") == str(root / "a" / "f.txt")
    assert where(fd, "a/link-parent/a/f.txt") == str(root / "a" / "f.txt")


def test_symlink_cannot_climb_above_a_sub_base(tree: tuple[Path, int]) -> None:
    """Relative to a descriptor for a/, a link to `..` leaves the base: not-permitted."""
    root, _ = tree
    sub = os.open(root / "a", os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert code(sub, "link-parent/x") == "not-permitted"
        assert code(sub, "../a") == "not-permitted"
    finally:
        os.close(sub)


def test_symlink_loops_are_loop(tree: tuple[Path, int]) -> None:
    """Symlink cycles end in `loop`."""
    _, fd = tree
    assert code(fd, "loop1") == "loop"
    assert code(fd, "loop1/x") == "loop"


def test_file_as_directory_is_not_directory(tree: tuple[Path, int]) -> None:
    """A file in the middle of a path is not-directory."""
    _, fd = tree
    assert code(fd, "a/f.txt/x") == "not-directory"


def test_deep_paths_are_bounded(tree: tuple[Path, int]) -> None:
    """A path deeper than the walk allows is refused, not an fd exhaustion."""
    root, fd = tree
    deep = root
    for _ in range(300):
        deep = deep / "d"
    os.makedirs(deep)
    assert code(fd, "d/" * 300 + "x") == "name-too-long"
    assert where(fd, "d/" * 200 + "x").endswith("/d/x")


def test_errno_table_covers_common_errors() -> None:
    """OSError errno values map to WIT error codes, unknown ones to io."""
    assert errno_code(FileNotFoundError(2, "x")) == "no-entry"
    assert errno_code(OSError(9999, "x")) == "io"


COMPONENTS = ["a", "b", "..", ".", "", "/", "link-out", "x\x00"]


@settings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=hs.lists(hs.sampled_from(COMPONENTS), max_size=12))
def test_random_paths_never_leave_the_root(tree: tuple[Path, int], parts: list[str]) -> None:
    """Any mix of components resolves inside the root, or is refused; plain ones match normpath."""
    root, fd = tree
    (root / "a" / "a").mkdir(exist_ok=True)
    (root / "a" / "b").mkdir(exist_ok=True)
    path = "/".join(parts)
    try:
        got = where(fd, path)
    except FsError:
        return
    real = os.path.realpath(got)
    assert real == str(root) or real.startswith(str(root) + os.sep)
    if "link-out" not in parts:
        expected = posixpath.normpath(posixpath.join(str(root), path))
        assert posixpath.normpath(got) == expected
