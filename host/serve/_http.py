"""The HTTP/1.1 server under ``mty serve`` and the agents' HTTP front: connections, limits,
timeouts, the bearer token and graceful shutdown, with what a request means left to a subclass.

One asyncio loop owns every connection (HTTP/1.1 through ``h11``, keep-alive). A subclass
answers a request head (:meth:`HttpServer._answer`): :class:`~mighty.serve.Server` runs a
``wasi:http`` component on it, :class:`~mighty.serve.AgentFront` asks an agent. Everything the
client can abuse is bounded here, once, for both (:class:`ServeLimits`): open connections,
requests in flight (the excess answered 503 at once, never queued), header bytes (431), body
bytes (413), the time to send headers (slow headers, from the first byte), the idle time of a
kept-alive connection, the time between body reads, the time a write waits for a client that
does not read. A refusal is a short JSON object naming the kind and nothing of the host.

Rejected: a second server for the agents' front (two sets of limits and timeouts to keep
right); uvicorn (see :mod:`mighty.serve._server`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import h11

from mighty.budget import CancelScope
from mighty.serve._limits import ServeLimits

__all__ = ["HttpServer", "Running", "ServeStats"]

_CHUNK = 64 << 10


@dataclass
class ServeStats:
    """What a server has done (read it from any thread; counts only grow, but ``in_flight``
    and ``open_connections``)."""

    connections: int = 0
    """Connections accepted (refused ones included)."""
    refused_connections: int = 0
    """Connections closed at once because ``max_connections`` were open."""
    peak_connections: int = 0
    """The most connections open at once."""
    open_connections: int = 0
    """Connections open now."""
    requests: int = 0
    """Requests whose head was read."""
    in_flight: int = 0
    """Requests whose instance is running now."""
    statuses: Counter[int] = field(default_factory=Counter)
    """Responses by status code."""
    failures: Counter[str] = field(default_factory=Counter)
    """Failed requests by kind (``trap``, ``out_of_fuel``, ``too_large``, ``busy``...)."""


class _Closed(Exception):
    """The connection is over (the client went away, or a timeout or a bound ended it)."""


class _Timeout(Exception):
    """A read did not complete in time."""


class HttpServer:
    """HTTP/1.1 over asyncio with every bound of :class:`ServeLimits`; a subclass answers.

    ``token``, when set, is the bearer token every request must carry (401 otherwise);
    ``log`` receives one line per request and the details of failures the client is not told.
    """

    def __init__(
        self,
        *,
        limits: ServeLimits | None = None,
        token: str | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.limits = limits or ServeLimits()
        self.token = token.encode() if token is not None else None
        self.log = log or (lambda _line: None)
        self.stats = ServeStats()
        self._workers = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.limits.max_concurrent, thread_name_prefix="mty-serve"
        )
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._active = 0
        self._closing = False
        self._idle: set[asyncio.StreamWriter] = set()
        self._running: set[CancelScope] = set()
        self._guests: set[asyncio.Future[Any]] = set()
        self._accepted: set[asyncio.StreamWriter] = set()
        """Every connection from its acceptance until its task ends (a task may not have
        started when a shutdown ends: its transport is closed then)."""
        self._lock = threading.Lock()

    @property
    def closing(self) -> bool:
        """Whether a shutdown has begun (no new connection or request is taken)."""
        return self._closing

    # -- what a subclass provides -------------------------------------------------------------

    def _started(self) -> None:
        """Called once listening starts (the component server fills its pool here)."""

    def _stopped(self) -> None:
        """Called at the end of a shutdown, once nothing runs."""

    async def _answer(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head: h11.Request,
    ) -> int:
        """Answer one request whose head was read (authorized); its status."""
        raise NotImplementedError

    # -- helpers for a subclass ---------------------------------------------------------------

    def _admit(self) -> bool:
        """Take a slot of ``max_concurrent``; False (answer 503) when none is free or the
        server is closing. Give it back with :meth:`_leave`."""
        with self._lock:
            if self._active >= self.limits.max_concurrent or self._closing:
                return False
            self._active += 1
            return True

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1

    async def _read_body(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bytes | str:
        """A whole request body (at most ``max_request_bytes``, each read within
        ``body_timeout``), or why not: ``too_large``, ``body_timeout``, ``gone``."""
        limits = self.limits
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                return "gone"
            if event is h11.NEED_DATA:
                if conn.they_are_waiting_for_100_continue:
                    writer.write(
                        conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
                    )
                try:
                    data = await self._read(reader, limits.body_timeout)
                except _Timeout:
                    return "body_timeout"
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > limits.max_request_bytes:
                    return "too_large"
                parts.append(bytes(event.data))
                continue
            if isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            return "gone"

    async def _reply(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        status: int,
        data: bytes,
        headers: list[tuple[bytes, bytes]] | None = None,
        *,
        head_only: bool = False,
    ) -> int:
        """Answer ``status`` with ``data`` (JSON) as one write (its head alone for a HEAD
        request); ``_Closed`` if it could not."""
        self.stats.statuses[status] += 1
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            raise _Closed
        head = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
            *(headers or []),
        ]
        try:
            out = conn.send(h11.Response(status_code=status, headers=head, reason=_reason(status)))
            if not head_only:
                out = (out or b"") + (conn.send(h11.Data(data=data)) or b"")
            out += conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:
            raise _Closed from None
        await self._send(writer, out)
        return status

    # -- lifetime ---------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 8080) -> tuple[str, int]:
        """Listen on ``host:port`` (port 0: any free one); the address bound."""
        self._started()
        self._server = await asyncio.start_server(
            self._accept, host, port, limit=_CHUNK, backlog=1024
        )
        sock = self._server.sockets[0]
        bound = sock.getsockname()
        return str(bound[0]), int(bound[1])

    async def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting, close idle connections, let requests in flight finish (up to
        ``timeout``, default ``limits.shutdown_timeout``), then stop the rest."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for writer in list(self._idle):
            writer.close()
        wait = self.limits.shutdown_timeout if timeout is None else timeout
        # A guest may still be returning after its response went out: wait for it too, or
        # its trace would end in a cancel that happened after its last import.
        waited: list[asyncio.Future[Any]] = [*self._connections, *self._guests]
        if waited:
            _, pending = await asyncio.wait(waited, timeout=wait)
            for scope in list(self._running):
                scope.cancel("the server is shutting down")
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5.0)
        if self._server is not None:
            await self._server.wait_closed()
        for writer in list(self._accepted):
            # Accepted as the server closed, its task not yet begun (it would be cancelled
            # unstarted when the loop ends, and its socket left open).
            writer.transport.abort()
        self._workers.shutdown(wait=True, cancel_futures=True)
        self._stopped()

    def run(
        self,
        host: str = "127.0.0.1",
        port: int = 8080,
        *,
        on_ready: Callable[[str, int], None] | None = None,
        stop: asyncio.Event | None = None,
    ) -> None:
        """Serve until SIGINT or SIGTERM (then shut down gracefully), in this thread."""
        import signal

        async def main() -> None:
            done = stop or asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                # Signals reach only the main thread (ValueError elsewhere) and not every
                # platform's loop (NotImplementedError): there, `stop` is how a caller ends it.
                with suppress(NotImplementedError, ValueError):
                    loop.add_signal_handler(signum, done.set)
            bound = await self.start(host, port)
            if on_ready is not None:
                on_ready(*bound)
            await done.wait()
            await self.shutdown()

        asyncio.run(main())

    @contextmanager
    def background(self, host: str = "127.0.0.1", port: int = 0) -> Iterator[Running]:
        """Serve on a thread of its own for the ``with`` block (tests, notebooks); shut down
        gracefully when it ends."""
        ready = threading.Event()
        found: dict[str, Any] = {}

        def serve() -> None:
            async def main() -> None:
                found["loop"] = asyncio.get_running_loop()
                found["stop"] = stop = asyncio.Event()
                try:
                    found["address"] = await self.start(host, port)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                    found["error"] = exc
                    ready.set()
                    return
                ready.set()
                await stop.wait()
                await self.shutdown()

            asyncio.run(main())

        thread = threading.Thread(target=serve, name="mty-serve-loop", daemon=True)
        thread.start()
        ready.wait()
        if "error" in found:
            thread.join()
            raise found["error"]
        bound = found["address"]
        try:
            yield Running(self, bound[0], bound[1])
        finally:
            found["loop"].call_soon_threadsafe(found["stop"].set)
            thread.join()

    # -- connections ------------------------------------------------------------------------

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._accepted.add(writer)
        task = asyncio.get_running_loop().create_task(self._connection(reader, writer))
        task.add_done_callback(lambda _task: self._accepted.discard(writer))

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        if len(self._connections) >= self.limits.max_connections or self._closing:
            self.stats.refused_connections += 1
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self.stats.open_connections = len(self._connections)
        self.stats.peak_connections = max(self.stats.peak_connections, len(self._connections))
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)
        try:
            while not self._closing:
                self._idle.add(writer)
                try:
                    event = await self._request_head(conn, reader, writer)
                finally:
                    self._idle.discard(writer)
                if event is None:
                    break
                await self._request(conn, reader, writer, event)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except (_Closed, ConnectionError, h11.LocalProtocolError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug of the server's: 500, never a detail
            self.log(f"  internal error: {type(exc).__name__}: {exc}")
            self.log(traceback.format_exc())
            with suppress(Exception):
                await self._refuse(conn, writer, 500, "internal", close=True)
        finally:
            self._connections.discard(task)
            self.stats.open_connections = len(self._connections)
            writer.close()
            with suppress(Exception):
                await writer.wait_closed()

    async def _request_head(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> h11.Request | None:
        """The next request's head; None when the connection should end quietly (the client
        closed it, or it stayed idle past ``idle_timeout``). A malformed or oversized head,
        or one that takes more than ``header_timeout`` from its first byte, is answered
        (400/431/408) and ends the connection."""
        limits = self.limits
        deadline = time.monotonic() + limits.idle_timeout
        started = False
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                kind = "header_too_large" if status == 431 else "malformed"
                await self._refuse(conn, writer, status, kind, close=True)
                return None
            if event is h11.NEED_DATA:
                if self._closing and not started:
                    return None
                remaining = deadline - time.monotonic()
                try:
                    data = await self._read(reader, remaining)
                except _Timeout:
                    if started:
                        await self._refuse(conn, writer, 408, "header_timeout", close=True)
                    return None
                if not started and data:
                    started = True
                    deadline = time.monotonic() + limits.header_timeout
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                # h11 bounds what it buffers; a head that arrived whole in one read is
                # measured here.
                size = len(event.method) + len(event.target) + 12
                size += sum(len(k) + len(v) + 4 for k, v in event.headers)
                if size > limits.max_header_bytes:
                    await self._refuse(conn, writer, 431, "header_too_large", close=True)
                    return None
                return event
            return None  # ConnectionClosed

    async def _read(self, reader: asyncio.StreamReader, timeout: float) -> bytes:
        if timeout <= 0:
            raise _Timeout
        try:
            async with asyncio.timeout(timeout):  # no task per read, as wait_for makes
                return await reader.read(_CHUNK)
        except TimeoutError:
            raise _Timeout from None
        except ConnectionError:
            return b""

    # -- one request ------------------------------------------------------------------------

    async def _request(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head: h11.Request,
    ) -> None:
        self.stats.requests += 1
        started = time.monotonic()
        method = head.method.decode("ascii", "replace")
        target = head.target.decode("ascii", "replace")
        if self.token is not None and not self._authorized(head.headers):
            status = await self._refuse(conn, writer, 401, "unauthorized", close=True)
        else:
            length = _content_length(head.headers)
            if length is not None and length > self.limits.max_request_bytes:
                status = await self._refuse(conn, writer, 413, "too_large", close=True)
            else:
                status = await self._answer(conn, reader, writer, head)
        self.log(f"{method} {target} {status} {1000 * (time.monotonic() - started):.1f}ms")

    async def _send(self, writer: asyncio.StreamWriter, data: bytes | None) -> None:
        if not data:
            return
        writer.write(data)
        if writer.transport.get_write_buffer_size() == 0:
            return  # all of it went to the socket: nothing to wait for
        try:
            async with asyncio.timeout(self.limits.write_timeout):
                await writer.drain()
        except TimeoutError:
            self.stats.failures["write_timeout"] += 1
            raise _Closed from None

    async def _refuse(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter | None,
        status: int,
        kind: str,
        *,
        code: str | None = None,
        close: bool = False,
    ) -> int:
        """Answer ``status`` with ``{"error": kind}`` (and the guest's error ``code``): never
        a host message. ``close`` ends the connection after it (a body left unread)."""
        self.stats.statuses[status] += 1
        self.stats.failures[kind] += 1
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            raise _Closed
        payload: dict[str, str] = {"error": kind}
        if code is not None:
            payload["code"] = code
        data = json.dumps(payload).encode() + b"\n"
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
        ]
        if close or conn.their_state not in (h11.DONE, h11.IDLE):
            headers.append((b"connection", b"close"))
        if writer is None:
            return status
        try:
            head = h11.Response(status_code=status, headers=headers, reason=_reason(status))
            await self._send(writer, conn.send(head))
            await self._send(writer, conn.send(h11.Data(data=data)))
            await self._send(writer, conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:
            raise _Closed from None
        return status

    def _authorized(self, headers: Any) -> bool:
        assert self.token is not None
        for name, value in headers:
            if name == b"authorization":
                scheme, _, given = bytes(value).partition(b" ")
                return scheme.lower() == b"bearer" and hmac.compare_digest(given, self.token)
        return False


@dataclass(frozen=True)
class Running:
    """A server serving in the background (:meth:`HttpServer.background`)."""

    server: HttpServer
    host: str
    port: int

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"


async def _first(event: asyncio.Event, *futures: asyncio.Future[Any]) -> None:
    """Wait until ``event`` is set or one of ``futures`` is done."""
    if event.is_set() or any(f.done() for f in futures):
        return
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([waiter, *futures], return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def _content_length(headers: Any) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            with suppress(ValueError):
                return int(value)
    return None
