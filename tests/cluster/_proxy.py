"""A loopback TCP proxy the test can stall: a partition that keeps both ends' sockets open.

``pause()`` stops forwarding in both directions (bytes already read are held, the rest waits in
the kernel's buffers), so the node behind it sees a silent link, not a closed one, as in a
real partition; ``resume()`` lets everything through again, in order.
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress

__all__ = ["Proxy"]


class Proxy:
    """127.0.0.1:``port`` forwarded to ``upstream`` (a port on 127.0.0.1), until ``close``."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._open = threading.Event()
        self._open.set()
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def pause(self) -> None:
        """Stall every connection (both ways) and hold new ones."""
        self._open.clear()

    def resume(self) -> None:
        self._open.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    server.close()
                    return
                self._sockets += [client, server]
                for source, sink in ((client, server), (server, client)):
                    thread = threading.Thread(target=self._pump, args=(source, sink), daemon=True)
                    self._threads.append(thread)
                    thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not self._closed:
                self._open.wait()
            if not data or self._closed:
                with suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)
                return
            try:
                sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._open.set()
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (Linux)
        self._accepter.join(5)
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)
        for sock in sockets:
            sock.close()
