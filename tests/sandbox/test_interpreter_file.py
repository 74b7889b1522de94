"""Where the interpreter's component file comes from: linked from the caches, never rewritten."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from mighty.build import BuildResult
from mighty.sandbox._interpreter import publish


def _built(tmp_path: Path, data: bytes) -> BuildResult:
    entry = tmp_path / "cache" / "builds" / "d.wasm"
    entry.parent.mkdir(parents=True, exist_ok=True)
    entry.write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    return BuildResult(path=entry, digest="d", component_sha256=sha, cached=True, seconds=0.0)


def test_publish_links_the_build_and_keeps_what_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file is the build's entry hard-linked (no copy); published once, then left alone."""
    monkeypatch.setenv("MTY_CACHE_DIR", str(tmp_path / "cache"))
    built = _built(tmp_path, b"\0asm\x0d\x00\x01\x00 interpreter")
    final = publish(built)
    assert final == tmp_path / "cache" / "sandbox" / f"interpreter-{built.component_sha256}.wasm"
    assert os.stat(final).st_ino == os.stat(built.path).st_ino
    built.path.unlink()  # `mty cache clean` of the builds: the published file stays whole
    assert final.read_bytes() == b"\0asm\x0d\x00\x01\x00 interpreter"
    assert publish(built) == final  # already there: nothing read or written
    assert sorted(p.name for p in final.parent.iterdir()) == [final.name]


def test_publish_copies_when_no_link_can_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where hard links fail (another file system), the bytes are copied whole."""
    monkeypatch.setenv("MTY_CACHE_DIR", str(tmp_path / "cache"))
    built = _built(tmp_path, b"\0asm\x0d\x00\x01\x00 copied")

    def no_link(*_args: object) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    final = publish(built)
    assert final.read_bytes() == b"\0asm\x0d\x00\x01\x00 copied"
    assert os.stat(final).st_ino != os.stat(built.path).st_ino
    assert sorted(p.name for p in final.parent.iterdir()) == [final.name]
