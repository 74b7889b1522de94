"""Real HTTP/1.1 servers on loopback for the outgoing-HTTP tests and benchmarks.

``LoopbackServer`` is the standard library's ``ThreadingHTTPServer`` on 127.0.0.1 with a fixed
set of routes (echo, large chunked bodies, statuses, redirects, chosen response headers, and the
misbehaving servers: one that trickles forever, one that hangs up mid-body, one that never
answers) plus any routes a test adds. Every request that arrives is recorded.

Designs rejected: a mock transport (the client under test must meet real sockets, partial
writes and real hang-ups); an asyncio server (it would need its own loop thread and gains nothing
over one thread per connection at test scale); ``socketserver``'s own thread joining on close
(it joins without a deadline, and a handler blocked reading the next keep-alive request never
sees a flag). Instead ``close()`` sets a stop event that the slow routes wait on, shuts down every
open connection's socket so blocked reads and writes return at once, and joins the handler threads
against a deadline.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit

__all__ = ["Headers", "LoopbackServer", "Request", "Response", "Route", "pattern"]

Headers = list[tuple[str, str]]
"""Header fields in the order they were sent, names as sent."""

Response = tuple[int, Iterable[tuple[str, str]] | Mapping[str, str], bytes]
"""What a route callable returns: status, response headers, body (Content-Length is added)."""

Route = Callable[["Request"], Response]
"""A test's own route: gets the request, returns the response."""

_PATTERN_PERIOD = 251  # a prime, so the pattern never lines up with power-of-two chunk sizes
_MAX_LINE = 65536


def pattern(start: int, length: int) -> bytes:
    """``length`` bytes of the deterministic body pattern, from offset ``start``.

    Byte ``i`` of every pattern body is ``i % 251``, so a test checks any slice without the whole.
    """
    first = start % _PATTERN_PERIOD
    reps = (first + length) // _PATTERN_PERIOD + 1
    return (bytes(range(_PATTERN_PERIOD)) * reps)[first : first + length]


@dataclass(frozen=True)
class Request:
    """One request as it arrived: the target split into path and query, and the whole body."""

    method: str
    target: str
    path: str
    query: list[tuple[str, str]]
    headers: Headers
    body: bytes
    peer: tuple[str, int]
    """The client's address and port: two requests from one port came over one connection."""

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        lowered = name.lower()
        return next((v for n, v in self.headers if n.lower() == lowered), None)

    def param(self, name: str, default: str | None = None) -> str | None:
        """The first value of query parameter ``name``, or ``default``."""
        return next((v for n, v in self.query if n == name), default)


class _BadRequest(Exception):
    pass


class _Server(ThreadingHTTPServer):
    # Handler threads are tracked and joined by LoopbackServer.close with a deadline.
    daemon_threads = True
    block_on_close = False
    # Tests open dozens of connections at once; the default backlog of 5 would make some of
    # them wait for a SYN retransmit.
    request_queue_size = 128

    def __init__(self, owner: LoopbackServer) -> None:
        self.owner = owner
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"loopback-http-{client_address[1]}",
            daemon=True,
        )
        self.owner._track(thread, request)
        thread.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.owner._untrack(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        # A client that hangs up, or close() shutting the socket, is how these servers end
        # connections; anything else is a bug in a route and is kept for the test to see.
        if isinstance(error, OSError) or self.owner.stopping.is_set():
            return
        self.owner._error(error if error is not None else RuntimeError("unknown error"))
        traceback.print_exc()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read server.requests, not stderr

    def _dispatch(self) -> None:
        owner = self.server.owner
        try:
            request = self._read_request()
        except _BadRequest as exc:
            self.close_connection = True
            self._respond(400, [("Content-Type", "text/plain")], f"{exc}\n".encode())
            return
        owner._record(request)
        route = owner._routes.get(request.path)
        if route is not None:
            status, headers, body = route(request)
            pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers)
            self._respond(status, pairs, body)
            return
        second = request.path.find("/", 1)
        prefix = request.path[: second + 1] if second > 0 else None  # "/bytes/" of "/bytes/10"
        builtin = _BUILTINS.get(request.path) or (_BUILTINS.get(prefix) if prefix else None)
        try:
            if builtin is None:
                self._respond(404, [("Content-Type", "text/plain")], b"not found\n")
            else:
                builtin(self, request)
        except _BadRequest as exc:
            self._respond(400, [("Content-Type", "text/plain")], f"{exc}\n".encode())

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _dispatch  # noqa: N815

    def _read_request(self) -> Request:
        split = urlsplit(self.path)
        headers = list(self.headers.items())
        encoding = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in encoding:
            body = self._read_chunked()
        else:
            raw = self.headers.get("Content-Length")
            try:
                length = int(raw) if raw is not None else 0
            except ValueError:
                raise _BadRequest(f"bad Content-Length {raw!r}") from None
            if length < 0:
                raise _BadRequest(f"bad Content-Length {raw!r}")
            body = self.rfile.read(length)
            if len(body) < length:
                raise _BadRequest("body shorter than its Content-Length")
        return Request(
            method=self.command,
            target=self.path,
            path=split.path,
            query=parse_qsl(split.query, keep_blank_values=True),
            headers=headers,
            body=body,
            peer=(str(self.client_address[0]), int(self.client_address[1])),
        )

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            line = self.rfile.readline(_MAX_LINE)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _BadRequest(f"bad chunk size line {line!r}") from None
            if size == 0:
                while self.rfile.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):
                    pass  # trailer fields: not recorded
                return b"".join(parts)
            chunk = self.rfile.read(size)
            if len(chunk) < size or self.rfile.readline(_MAX_LINE) not in (b"\r\n", b"\n"):
                raise _BadRequest("truncated chunk")
            parts.append(chunk)

    def _head(self, status: int, headers: Iterable[tuple[str, str]]) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()

    def _respond(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        if not any(n.lower() == "content-length" for n, _ in headers):
            headers = [*headers, ("Content-Length", str(len(body)))]
        self._head(status, headers)
        self.wfile.write(body)

    # Builtin routes.

    def echo(self, request: Request) -> None:
        payload = {
            "method": request.method,
            "path": request.path,
            "query": urlsplit(request.target).query,
            "headers": [list(pair) for pair in request.headers],
            "body": request.body.decode("latin-1"),
        }
        self._respond(200, [("Content-Type", "application/json")], json.dumps(payload).encode())

    def bytes_(self, request: Request) -> None:
        total = _int(request.path.removeprefix("/bytes/"), "length")
        size = _int(request.param("chunk", "65536"), "chunk")
        if size <= 0:
            raise _BadRequest("chunk must be positive")
        self._head(
            200,
            [("Content-Type", "application/octet-stream"), ("Transfer-Encoding", "chunked")],
        )
        for piece in _pieces(total, size):
            if self.server.owner.stopping.is_set():
                self.close_connection = True
                return
            self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")

    def fixed(self, request: Request) -> None:
        total = _int(request.path.removeprefix("/fixed/"), "length")
        self._head(
            200, [("Content-Type", "application/octet-stream"), ("Content-Length", str(total))]
        )
        for piece in _pieces(total, 65536):
            if self.server.owner.stopping.is_set():
                self.close_connection = True
                return
            self.wfile.write(piece)

    def status(self, request: Request) -> None:
        code = _int(request.path.removeprefix("/status/"), "status")
        if not 200 <= code <= 599:
            raise _BadRequest("status must be 200-599 (a 1xx is not a final answer)")
        if code in (204, 304):
            self._head(code, [])  # these carry no body and no Content-Length
            return
        self._respond(code, [("Content-Type", "text/plain")], f"status {code}\n".encode())

    def redirect(self, request: Request) -> None:
        to = request.param("to")
        if to is None:
            raise _BadRequest("redirect needs ?to=URL")
        code = _int(request.param("code", "302"), "code")
        headers = [("Location", to), ("Content-Type", "text/plain")]
        self._respond(code, headers, f"redirecting to {to}\n".encode())

    def headers_(self, request: Request) -> None:
        body = json.dumps([list(pair) for pair in request.query]).encode()
        self._respond(200, [("Content-Type", "application/json"), *request.query], body)

    def trickle(self, request: Request) -> None:
        every = _float(request.param("every", "0.05"), "every")
        total = 1_000_000
        self._head(
            200, [("Content-Type", "application/octet-stream"), ("Content-Length", str(total))]
        )
        stop = self.server.owner.stopping
        for offset in range(total):
            self.wfile.write(pattern(offset, 1))
            if stop.wait(every):
                break
        self.close_connection = True

    def close_mid_body(self, request: Request) -> None:
        self._head(
            200, [("Content-Type", "application/octet-stream"), ("Content-Length", "100000")]
        )
        self.wfile.write(pattern(0, 1000))
        self.close_connection = True  # finish() then closes the socket, 99,000 bytes short

    def stall(self, request: Request) -> None:
        self.server.owner.stopping.wait()
        self.close_connection = True

    def delay(self, request: Request) -> None:
        ms = _float(request.param("ms", "20"), "ms")
        if self.server.owner.stopping.wait(ms / 1000):
            self.close_connection = True
            return
        self._respond(200, [("Content-Type", "text/plain")], b"ok")


_BUILTINS: dict[str, Callable[[_Handler, Request], None]] = {
    "/echo": _Handler.echo,
    "/bytes/": _Handler.bytes_,
    "/fixed/": _Handler.fixed,
    "/status/": _Handler.status,
    "/redirect": _Handler.redirect,
    "/headers": _Handler.headers_,
    "/trickle": _Handler.trickle,
    "/close-mid-body": _Handler.close_mid_body,
    "/stall": _Handler.stall,
    "/delay": _Handler.delay,
}


def _pieces(total: int, size: int) -> Iterator[bytes]:
    # One block of the pattern is built per response and sliced, so a 64 MiB body costs one
    # chunk of memory: every piece of a given size at a given phase is the same bytes.
    block = pattern(0, min(size, total) + _PATTERN_PERIOD)
    for offset in range(0, total, size):
        length = min(size, total - offset)
        phase = offset % _PATTERN_PERIOD
        yield block[phase : phase + length]


def _int(text: str | None, what: str) -> int:
    try:
        value = int(text or "")
    except ValueError:
        raise _BadRequest(f"bad {what} {text!r}") from None
    if value < 0:
        raise _BadRequest(f"bad {what} {text!r}")
    return value


def _float(text: str | None, what: str) -> float:
    try:
        value = float(text or "")
    except ValueError:
        raise _BadRequest(f"bad {what} {text!r}") from None
    if not value >= 0:  # also rejects nan
        raise _BadRequest(f"bad {what} {text!r}")
    return value


class LoopbackServer:
    """A real HTTP/1.1 server on 127.0.0.1 at an ephemeral port; use it as a context manager.

    ``routes`` maps exact paths to a test's own handlers; they take precedence over the builtin
    routes. ``join_timeout`` bounds how long ``close()`` waits for handler threads.
    """

    def __init__(
        self, routes: Mapping[str, Route] | None = None, *, join_timeout: float = 5.0
    ) -> None:
        self._routes: dict[str, Route] = dict(routes or {})
        self._join_timeout = join_timeout
        self._lock = threading.Lock()
        self._requests: list[Request] = []
        self._errors: list[BaseException] = []
        self._threads: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        self._httpd: _Server | None = None
        self._serve_thread: threading.Thread | None = None
        self.stopping = threading.Event()
        """Set by close(); the slow routes (trickle, stall, delay, bodies) give up when it is."""

    def start(self) -> Self:
        """Bind and start serving (once)."""
        if self._httpd is not None:
            raise RuntimeError("LoopbackServer already started")
        if self.stopping.is_set():
            raise RuntimeError("LoopbackServer already closed")
        self._httpd = _Server(self)
        # A short poll interval: shutdown() waits for the serve loop to notice it.
        self._serve_thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="loopback-http-serve",
            daemon=True,
        )
        self._serve_thread.start()
        return self

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def port(self) -> int:
        """The port the server listens on."""
        if self._httpd is None:
            raise RuntimeError("LoopbackServer not started")
        return int(self._httpd.server_address[1])

    @property
    def origin(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "/") -> str:
        """The absolute URL of ``path`` (which starts with ``/`` and may carry a query)."""
        if not path.startswith("/"):
            raise ValueError(f"path must start with '/': {path!r}")
        return self.origin + path

    @property
    def requests(self) -> list[Request]:
        """A snapshot of the requests received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised by routes (not connection errors); a test may assert it is empty."""
        with self._lock:
            return list(self._errors)

    def add_route(self, path: str, route: Route) -> None:
        """Serve ``path`` with ``route`` from now on (over a builtin route of that path)."""
        with self._lock:
            self._routes[path] = route

    def close(self) -> None:
        """Stop serving, hang up every open connection and join the handler threads."""
        self.stopping.set()
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._serve_thread is not None:
            self._serve_thread.join(self._join_timeout)
        with self._lock:
            connections = list(self._connections)
            threads = list(self._threads)
        for conn in connections:
            with contextlib.suppress(OSError):  # already closed by its handler
                conn.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(self._join_timeout)
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            raise RuntimeError(f"handler threads still running after close(): {stuck}")

    def _track(self, thread: threading.Thread, conn: socket.socket) -> None:
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
            self._connections.add(conn)

    def _untrack(self, conn: socket.socket) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _error(self, error: BaseException) -> None:
        with self._lock:
            self._errors.append(error)

    def _record(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)
