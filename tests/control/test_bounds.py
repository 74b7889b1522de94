"""Hostile control requests stay bounded: files read by path are checked first, idle peers leave."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mighty.control import (
    IDLE_TIMEOUT,
    MAX_FILE_BYTES,
    ControlError,
    ControlServer,
    FileRefused,
    read_regular_file,
    request,
)
from mighty.control._server import MAX_CONNECTIONS

LIMIT = 1 << 16


def _reload(args: dict[str, Any]) -> dict[str, int]:
    """What `mty run`'s reload handler does with the path it is given."""
    return {"bytes": len(read_regular_file(str(args["component"]), LIMIT))}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[ControlServer, Path]]:
    """A running server with a reload-like op and a short idle timeout."""
    path = tmp_path / "ctl.sock"
    srv = ControlServer(path, {"reload": _reload})
    srv.idle_timeout = 0.3
    with srv:
        yield srv, path


def test_limits_are_sane() -> None:
    """Defaults: a 256 MiB file limit and a 30 s idle timeout."""
    assert MAX_FILE_BYTES == 256 << 20
    assert IDLE_TIMEOUT == 30.0


def test_regular_file_is_read(tmp_path: Path) -> None:
    """A small regular file, even through a symlink, is read whole."""
    (tmp_path / "c.wasm").write_bytes(b"\x00asm" + b"x" * 100)
    (tmp_path / "link").symlink_to(tmp_path / "c.wasm")
    assert len(read_regular_file(tmp_path / "link", LIMIT)) == 104


def test_big_file_refused_before_reading(tmp_path: Path) -> None:
    """A file over the limit (sparse 1 GiB) is refused by its size, nothing read."""
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(1 << 30)
    with pytest.raises(FileRefused, match="over the 65536-byte limit"):
        read_regular_file(big, LIMIT)


def test_fifo_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO with no writer does not block the open; it is refused as a FIFO."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FileRefused, match="FIFO"):
        read_regular_file(fifo, LIMIT)


def test_devices_and_directories_refused(tmp_path: Path) -> None:
    """/dev/zero and a directory are not regular files."""
    with pytest.raises(FileRefused, match="device"):
        read_regular_file("/dev/zero", LIMIT)
    with pytest.raises(FileRefused, match="directory"):
        read_regular_file(tmp_path, LIMIT)
    with pytest.raises(FileRefused, match="cannot open"):
        read_regular_file(tmp_path / "missing", LIMIT)


def test_reload_attacks_get_error_replies(
    server: tuple[ControlServer, Path], tmp_path: Path
) -> None:
    """Through the socket, each hostile path is a bad_file reply and the server still serves."""
    _, path = server
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(1 << 30)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (big, fifo, Path("/dev/zero")):
        with pytest.raises(ControlError) as info:
            request(path, "reload", {"component": str(target)}, timeout=10)
        assert info.value.kind == "bad_file"
    (tmp_path / "ok").write_bytes(b"z" * 10)
    assert request(path, "reload", {"component": str(tmp_path / "ok")}) == {"bytes": 10}


def test_idle_connections_time_out(server: tuple[ControlServer, Path]) -> None:
    """MAX_CONNECTIONS idle peers are closed by the server; the owner gets in afterwards."""
    _, path = server
    idle = []
    for _ in range(MAX_CONNECTIONS):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.fspath(path))
        idle.append(s)
    try:
        for s in idle:
            s.settimeout(10)
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            assert b"idle_timeout" in data  # told why, then closed (recv saw EOF)
        assert request(path, "ping", timeout=10) == {"pong": True}
    finally:
        for s in idle:
            s.close()


def test_slow_request_times_out_mid_line(server: tuple[ControlServer, Path]) -> None:
    """A peer that stops inside a request line is closed too, and the server keeps serving."""
    srv, path = server
    done = threading.Event()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(os.fspath(path))
        s.sendall(b'{"v": 1, "id": 1, "op": "pi')
        s.settimeout(10)
        assert s.recv(4096).startswith(b"{")
        assert s.recv(4096) == b""
        done.set()
    assert done.is_set()
    assert srv.running
    assert request(path, "ping", timeout=10) == {"pong": True}


def test_trickling_connections_are_closed_by_their_total_time(
    server: tuple[ControlServer, Path],
) -> None:
    """MAX_CONNECTIONS peers each sending one byte of a request every 0.1 s (never idle for the
    0.3 s timeout) are closed once a whole request has not come within it; the owner gets in."""
    _, path = server
    peers = []
    for _ in range(MAX_CONNECTIONS):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.fspath(path))
        peers.append(s)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.1):
            for s in peers:
                with contextlib.suppress(OSError):
                    s.send(b" ")

    feeder = threading.Thread(target=trickle, daemon=True)
    feeder.start()
    try:
        for s in peers:
            s.settimeout(30)
            data = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := s.recv(4096):
                    data += chunk
            assert b"idle_timeout" in data
        assert request(path, "ping", timeout=10) == {"pong": True}
    finally:
        stop.set()
        feeder.join(5)
        for s in peers:
            s.close()
