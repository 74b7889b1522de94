"""Component.load checks a file before reading it whole: only regular files, bounded, wasm first."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from mighty import BadInput, Component, InvalidComponent
from mighty.engine._component import MAX_COMPONENT_BYTES


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO named as a component is refused at once (no writer is ever needed)."""
    fifo = tmp_path / "x.wasm"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def load() -> None:
        try:
            Component.load(fifo)
        except InvalidComponent as exc:
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "loading a FIFO blocked"
    assert "not a regular file" in str(outcome[0])


def test_a_device_is_refused() -> None:
    """/dev/zero would be read until memory runs out: it is refused before any read."""
    with pytest.raises(InvalidComponent, match="not a regular file"):
        Component.load("/dev/zero")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    """A directory gets its own message."""
    with pytest.raises(InvalidComponent, match="is a directory"):
        Component.load(tmp_path)


def test_an_oversized_file_is_refused_by_its_size(tmp_path: Path) -> None:
    """A sparse file over the limit is refused from its size alone (nothing is read)."""
    big = tmp_path / "big.wasm"
    with big.open("wb") as file:
        file.truncate(MAX_COMPONENT_BYTES + 1)
    with pytest.raises(InvalidComponent, match="over the"):
        Component.load(big)


def test_a_large_file_of_something_else_is_refused_by_its_first_bytes(tmp_path: Path) -> None:
    """The magic is checked on the first 8 bytes, before the rest is read."""
    other = tmp_path / "other.wasm"
    with other.open("wb") as file:
        file.write(b"PK\x03\x04junk")
        file.truncate(200 << 20)
    with pytest.raises(InvalidComponent, match="not WebAssembly"):
        Component.load(other)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    """No such file is one clear line."""
    with pytest.raises(InvalidComponent, match="no such file"):
        Component.load(tmp_path / "absent.wasm")


def test_the_limit_is_what_a_load_can_afford(tmp_path: Path) -> None:
    """A 1 GiB component (the finding's: 2.16 GB of RSS, then MemoryError) is refused by its
    size, from a path and as bytes; the cluster's max_component cannot go past the limit."""
    from mighty.cluster import parse_cluster
    from mighty.cluster._config import ClusterConfig

    assert MAX_COMPONENT_BYTES == 256 << 20
    huge = tmp_path / "huge.wasm"
    with huge.open("wb") as file:
        file.write(b"\x00asm\x0d\x00\x01\x00")
        file.truncate(1 << 30)
    with pytest.raises(InvalidComponent, match="over the 268435456-byte limit"):
        Component.load(huge)
    with pytest.raises(InvalidComponent, match="over the 268435456-byte limit"):
        Component.load(b"\x00asm\x0d\x00\x01\x00" + bytes(MAX_COMPONENT_BYTES))
    assert ClusterConfig.model_fields["max_component"].metadata[-1].le == MAX_COMPONENT_BYTES
    with pytest.raises(BadInput, match="max_component"):
        parse_cluster({"servers": ["nats://x"], "peers": {"a": {}}, "max_component": 1 << 30})
