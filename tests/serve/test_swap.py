"""Hot swap under load: Server.swap while 50 connections keep requests in flight: no request
fails or is dropped, and the responses switch from v1 to v2 at one point (every request that
starts after the swap returned runs v2; every one that ended before it began ran v1)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass

from mighty import Component
from mighty.budget import Budget
from mighty.serve import ServeLimits, Server

CONNECTIONS = 50
REQUEST = b"GET /hello HTTP/1.1\r\nHost: swap\r\n\r\n"


@dataclass
class _Done:
    connection: int
    started: int
    ended: int
    status: int
    body: bytes
    latency: float


class _Load:
    """50 keep-alive connections sending GET /hello back to back, on a thread of its own;
    each request is stamped with a global sequence number when it starts and when it ends."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.clock = itertools.count()
        self.lock = threading.Lock()
        self.done: list[_Done] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()))

    def tick(self) -> int:
        with self.lock:
            return next(self.clock)

    async def _connection(self, index: int) -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError as exc:
            self.errors.append(f"connect: {exc}")
            return
        try:
            while not self.stop.is_set():
                started = self.tick()
                t0 = time.perf_counter()
                writer.write(REQUEST)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                ended = self.tick()
                status = int(head.split(b" ", 2)[1])
                elapsed = time.perf_counter() - t0
                self.done.append(_Done(index, started, ended, status, body, elapsed))
        except (OSError, asyncio.IncompleteReadError, IndexError, ValueError) as exc:
            self.errors.append(f"connection {index}: {type(exc).__name__}: {exc}")
        finally:
            writer.close()

    async def _run(self) -> None:
        await asyncio.gather(*(self._connection(i) for i in range(CONNECTIONS)))

    def wait_for(self, count: int) -> None:
        """Until ``count`` requests have completed (or a failure)."""
        gate = threading.Event()
        while len(self.done) < count and not self.errors:
            gate.wait(0.01)


def test_swap_under_load_fails_no_request(
    serve_guest: Component, serve_guest_v2: Component
) -> None:
    """No request fails; v1 before the swap, v2 after it, one switch per connection."""
    server = Server(
        serve_guest,
        budget=Budget(fuel=2_000_000_000, timeout=60.0),
        # Limits past any stall of a loaded machine: the subject is the swap. At load, a
        # client's next request came after the 5 s idle default and its connection was closed
        # under it (CI saw resets); and a request holds its `max_concurrent` slot until its
        # guest's call returns on its worker thread, which may come after the response reached
        # the client and the connection's next request was admitted: with 50 connections, more
        # than 64 slots were taken, one request was answered 503 and its connection closed
        # (the suite's stress round beside two busy loops saw the reset). Four per connection.
        limits=ServeLimits(
            max_concurrent=4 * CONNECTIONS, idle_timeout=120.0, header_timeout=120.0
        ),
    )
    with server.background() as live:
        load = _Load(live.port)
        load.thread.start()
        try:
            load.wait_for(150)
            before = load.tick()
            report = server.swap(serve_guest_v2)
            after = load.tick()
            load.wait_for(len(load.done) + 150)
        finally:
            load.stop.set()
            load.thread.join()
    assert load.errors == []
    assert {d.status for d in load.done} == {200}
    assert {d.body for d in load.done} == {b"hello", b"hello v2"}
    for done in load.done:
        if done.started > after:
            assert done.body == b"hello v2"
        if done.ended < before:
            assert done.body == b"hello"
    for connection in range(CONNECTIONS):
        bodies = [d.body for d in load.done if d.connection == connection]
        switches = sum(1 for a, b in itertools.pairwise(bodies) if a != b)
        assert switches <= 1 and (not bodies or bodies[-1] == b"hello v2" or switches == 0)
    assert report["new_component"] == serve_guest_v2.sha256
    assert server.stats.failures == {}
