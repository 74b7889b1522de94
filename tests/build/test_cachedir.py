"""Tests for the cache directory and its atomic writes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mighty import _cachedir
from mighty._cachedir import atomic_copy, atomic_write_bytes, cache_root


def test_cache_root_honours_env_and_creates_private_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """$MTY_CACHE_DIR names the cache root, which is created with mode 0o700."""
    wanted = tmp_path / "a" / "cache"
    monkeypatch.setenv("MTY_CACHE_DIR", str(wanted))
    assert cache_root() == wanted
    assert wanted.is_dir()
    assert stat.S_IMODE(wanted.stat().st_mode) == 0o700


def test_cache_root_defaults_to_platform_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without $MTY_CACHE_DIR the root is platformdirs' user cache path for mighty."""
    import platformdirs

    monkeypatch.delenv("MTY_CACHE_DIR", raising=False)
    monkeypatch.setattr(platformdirs, "user_cache_path", lambda app: tmp_path / app)
    assert cache_root() == tmp_path / "mighty"
    assert (tmp_path / "mighty").is_dir()


def test_atomic_write_bytes_writes_and_replaces(tmp_path: Path) -> None:
    """atomic_write_bytes creates the file, replaces it, and leaves no temp files."""
    target = tmp_path / "sub" / "x.bin"
    atomic_write_bytes(target, b"first")
    atomic_write_bytes(target, b"second")
    assert target.read_bytes() == b"second"
    assert sorted(p.name for p in target.parent.iterdir()) == ["x.bin"]


def test_atomic_write_failing_rename_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure at the final rename leaves neither the target nor a temp file."""
    target = tmp_path / "x.bin"

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(_cachedir.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write_bytes(target, b"data" * 1000)
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_failing_mid_write_keeps_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure while writing keeps the previous file whole and removes the temp file."""
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")
    real_write = os.write
    calls = 0

    def flaky_write(fd: int, data: bytes | memoryview) -> int:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise OSError("no space left")
        # A short write, so the loop must come back for more and hits the failure.
        return real_write(fd, bytes(data)[:3])

    monkeypatch.setattr(_cachedir.os, "write", flaky_write)
    with pytest.raises(OSError, match="no space left"):
        atomic_write_bytes(target, b"new content")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bin"]


def test_atomic_write_keeps_existing_mode(tmp_path: Path) -> None:
    """Replacing a file keeps its permission bits; a new file gets 0o644."""
    target = tmp_path / "x.bin"
    atomic_write_bytes(target, b"a")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    target.chmod(0o600)
    atomic_write_bytes(target, b"b")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_atomic_copy_copies_and_cleans_up_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """atomic_copy copies the bytes, and on failure leaves no partial destination."""
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20))
    dst = tmp_path / "out" / "dst.bin"
    atomic_copy(src, dst)
    assert dst.read_bytes() == src.read_bytes()

    dst2 = tmp_path / "out" / "dst2.bin"

    def broken_fsync(fd: int) -> None:
        raise OSError("fsync failed")

    monkeypatch.setattr(_cachedir.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="fsync failed"):
        atomic_copy(src, dst2)
    assert sorted(p.name for p in dst.parent.iterdir()) == ["dst.bin"]
