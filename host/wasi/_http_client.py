"""The host's HTTP client for ``wasi:http``: one exchange per request, run on its own thread.

An :class:`Exchange` is a request the guest handed to ``outgoing-handler.handle``. A worker
thread makes it with httpcore and leaves what came (the head, then body chunks, or the
``error-code``) in the exchange, where the guest's imports read it without blocking; the
instance's wake event tells a waiting ``poll`` that something moved. The body is read ahead
into a bounded buffer (``HttpLimits.buffer_bytes``): while it is full the worker waits, so a
guest that never reads holds one buffer's worth of host memory, not the whole response.

The address check happens where the connection is made: :class:`_GuardedBackend` resolves the
name, refuses private, loopback and link-local addresses unless the grant allows them, and
connects to an address it checked (never resolving twice, so a DNS answer cannot change
between the check and the connect). TLS still verifies the certificate against the name.

Rejected: httpx's ``Client``. It is the expected choice and its engine is what runs here, but
its public API does not expose the network backend, which is where an after-DNS address check
belongs (its ``HTTPTransport`` builds its httpcore pool itself, with the default backend), and
every header it adds by default (``accept-encoding``, ``user-agent``) would be a header the guest
did not write. httpcore is httpx's own transport core, by the same maintainers. Rejected too:
connecting to a pre-resolved IP in the URL (pinning): connections would pool by IP, so two
names on one CDN address would share a TLS connection made for the other's name.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpcore

from mighty.abi import Variant
from mighty.wasi._http_policy import HttpLimits, Secret, is_private_address

__all__ = [
    "BodyBuffer",
    "Exchange",
    "PreparedRequest",
    "Responder",
    "error_code",
    "start",
]


def error_code(case: str, payload: Any = None) -> Variant:
    """A ``wasi:http/types`` ``error-code`` value."""
    return Variant(case, payload)


class _SecretUnavailable(Exception):
    """A grant's secret cannot be read (unset variable) or cannot be a header value."""


class _Prohibited(Exception):
    """Every address a name resolved to is one the grant does not allow."""


class BodyBuffer:
    """A request body the guest writes, whole in host memory (at most ``limit`` bytes), handed
    to the worker when the guest finishes it (or aborted when it drops it unfinished)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.done = threading.Event()
        self.aborted = False

    def finish(self) -> None:
        self.done.set()

    def abort(self) -> None:
        if not self.done.is_set():
            self.aborted = True
            self.done.set()


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A request checked against the policy, with the host's headers added."""

    method: str
    scheme: str
    host: str
    port: int
    authority: str
    target: str
    headers: tuple[tuple[bytes, bytes], ...]
    """Without ``content-length``: the worker adds it once the body is finished."""
    body: BodyBuffer
    allow_private: bool
    secrets: tuple[Secret, ...]
    """Headers the host adds when the request goes to the network, read from their sources
    then; their values are redacted from the response headers the guest reads."""
    connect_timeout: float
    read_timeout: float
    total_timeout: float

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.authority}{self.target}"


_CURRENT = threading.local()
"""``exchange``: the Exchange a worker thread is making (its reads and writes can be cut)."""


class _CutStream(httpcore.NetworkStream):
    """A connection's stream whose reads and writes the exchange being made on it can cut
    short: while one blocks, the exchange holds the stream, and its ``cancel`` shuts the
    socket down, which ends the blocked call at once (the connection is then dropped)."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        exchange = _entered(self)
        try:
            return self._inner.read(max_bytes, timeout)
        finally:
            if exchange is not None:
                exchange.left_io()

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        exchange = _entered(self)
        try:
            self._inner.write(buffer, timeout)
        finally:
            if exchange is not None:
                exchange.left_io()

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _CutStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)

    def cut(self) -> None:
        """Shut the socket down (both ways) under a blocked read or write. Through a duplicate
        of its descriptor: a TLS socket's own ``shutdown`` drops its TLS state under the
        thread reading it."""
        sock = self._inner.get_extra_info("socket")
        if sock is None:
            return
        with contextlib.suppress(OSError, ValueError):
            dup = socket.fromfd(sock.fileno(), sock.family, sock.type)
            try:
                dup.shutdown(socket.SHUT_RDWR)
            finally:
                dup.close()


def _entered(stream: _CutStream) -> Exchange | None:
    """The exchange this thread is making, now holding ``stream`` (None outside one);
    httpcore.ReadError if it was cancelled."""
    exchange: Exchange | None = getattr(_CURRENT, "exchange", None)
    if exchange is not None:
        exchange.entered_io(stream)
    return exchange


class _GuardedBackend(httpcore.SyncBackend):
    """The default socket backend, with every resolved address checked before connecting."""

    def __init__(self, allow_private: bool) -> None:
        self.allow_private = allow_private

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        allowed = [a for a in addresses if self.allow_private or not is_private_address(a)]
        if not allowed:
            raise _Prohibited(f"{host} resolves only to addresses not granted: {addresses}")
        last: Exception | None = None
        for address in allowed:
            try:
                stream = super().connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
            else:
                return _CutStream(stream)
        assert last is not None
        raise last


_POOLS: dict[bool, httpcore.ConnectionPool] = {}
_POOLS_LOCK = threading.Lock()


@atexit.register
def _close_pools() -> None:
    """Close the kept-alive connections at exit (else each is an unclosed socket to the GC)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        with contextlib.suppress(Exception):
            pool.close()


def _pool(allow_private: bool) -> httpcore.ConnectionPool:
    """The process's connection pool for grants that do (or do not) reach private addresses.

    Two pools, so a connection made under a permissive grant is never reused by a strict one.
    """
    with _POOLS_LOCK:
        pool = _POOLS.get(allow_private)
        if pool is None:
            pool = httpcore.ConnectionPool(
                max_connections=256,
                max_keepalive_connections=64,
                keepalive_expiry=30.0,
                network_backend=_GuardedBackend(allow_private),
            )
            _POOLS[allow_private] = pool
        return pool


_HEAD_PENDING, _HEAD_READY, _HEAD_FAILED = 0, 1, 2

Responder = Callable[["Exchange", bytes], None]
"""``respond(exchange, body)``: answers an exchange in place of the network (on its worker)."""


class Exchange:
    """One request and its response, shared by a worker thread and the guest's imports.

    Everything the guest reads is under ``lock``; the worker sets ``wake`` after each change.
    """

    def __init__(
        self,
        request: PreparedRequest,
        limits: HttpLimits,
        wake: threading.Event,
        respond: Responder | None = None,
    ) -> None:
        self.request = request
        self.respond = respond
        self.limits = limits
        self.wake = wake
        self.lock = threading.Condition()
        self.head = _HEAD_PENDING
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.error: Variant | None = None
        """The request's error-code, when ``head`` failed."""
        self.body_error: Variant | None = None
        """The body's error-code, when the body failed after the head."""
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self.eof = False
        self.cancelled = False
        self._io: _CutStream | None = None
        """The stream a read or write of this exchange blocks on now (the worker's)."""
        self.running = True
        self.received = 0
        # What the guest has taken (a second take is refused; a drop before a take cancels).
        self.response_taken = False
        self.body_taken = False
        self.stream_taken = False

    # -- the guest's side ---------------------------------------------------------------------

    def head_ready(self) -> bool:
        return self.head != _HEAD_PENDING

    def body_ready(self) -> bool:
        with self.lock:
            return bool(self._chunks) or self.eof or self.body_error is not None

    def read(self, limit: int) -> tuple[bytes, bool, Variant | None]:
        """Up to ``limit`` buffered bytes, whether the body ended, and its error if it failed."""
        with self.lock:
            out = bytearray()
            while self._chunks and len(out) < limit:
                chunk = self._chunks.popleft()
                room = limit - len(out)
                if len(chunk) > room:
                    self._chunks.appendleft(chunk[room:])
                    chunk = chunk[:room]
                out += chunk
            self._buffered -= len(out)
            self.lock.notify_all()
            ended = not self._chunks and (self.eof or self.body_error is not None)
            return bytes(out), ended, self.body_error if ended else None

    def cancel(self) -> None:
        """Stop the worker at its next step and drop what is buffered; a read or write of
        its connection that blocks now (waiting for the response) ends at once, and the
        connection is closed, so the server sees the request go."""
        with self.lock:
            self.cancelled = True
            self._chunks.clear()
            self._buffered = 0
            self.lock.notify_all()
            # Under the lock: the worker cannot leave the call and close the stream (whose
            # descriptor could then be another socket's) until the cut is done.
            if self._io is not None:
                self._io.cut()

    def entered_io(self, stream: _CutStream) -> None:
        """The worker is about to block on ``stream`` (httpcore.ReadError if cancelled)."""
        with self.lock:
            if self.cancelled:
                raise httpcore.ReadError("the request was cancelled")
            self._io = stream

    def left_io(self) -> None:
        with self.lock:
            self._io = None

    # -- the worker's side --------------------------------------------------------------------

    def _set_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        with self.lock:
            self.status, self.headers, self.head = status, headers, _HEAD_READY
        self.wake.set()

    def _fail(self, code: Variant) -> None:
        with self.lock:
            if self.head == _HEAD_PENDING:
                self.error, self.head = code, _HEAD_FAILED
            elif not self.eof and self.body_error is None:
                self.body_error = code
        self.wake.set()

    def _push(self, chunk: bytes, deadline: float) -> bool:
        """Buffer ``chunk``, waiting while the buffer is full; False once cancelled."""
        with self.lock:
            while not self.cancelled and self._buffered >= self.limits.buffer_bytes:
                if time.monotonic() >= deadline:
                    return False
                self.lock.wait(min(1.0, max(0.0, deadline - time.monotonic())))
            if self.cancelled:
                return False
            self._chunks.append(chunk)
            self._buffered += len(chunk)
        self.wake.set()
        return True

    def _end(self) -> None:
        with self.lock:
            self.eof = True
        self.wake.set()

    def run(self) -> None:
        """The worker thread: make the request, then read the body into the buffer."""
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - every failure must reach the guest as a code
            self._fail(_translate(exc, self.request))
        finally:
            with self.lock:
                self.running = False
            self.wake.set()

    def _body(self, deadline: float) -> bytes | None:
        """The finished request body, waiting for the guest to finish it; None to give up."""
        body = self.request.body
        while not body.done.wait(0.25):
            if self.cancelled:
                return None
            if time.monotonic() >= deadline:
                self._fail(error_code("HTTP-request-body-size", None))
                return None
        if body.aborted:
            self._fail(error_code("internal-error", "the request body was dropped unfinished"))
            return None
        return bytes(body.data)

    def _run(self) -> None:
        request = self.request
        deadline = time.monotonic() + request.total_timeout
        content = self._body(deadline)
        if content is None:
            return
        if self.respond is not None:
            self.respond(self, content)
            return
        self.network(content, deadline)

    # -- answers ------------------------------------------------------------------------------

    def answer(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        chunks: Iterable[bytes],
        body_error: Variant | None = None,
    ) -> None:
        """Answer with a response made elsewhere (a recording): the head, then each chunk
        through the same bounded buffer, then the end or ``body_error``."""
        deadline = time.monotonic() + self.request.total_timeout
        self._set_head(status, headers)
        for chunk in chunks:
            if chunk and not self._push(bytes(chunk), deadline):
                return
        if body_error is not None:
            self._fail(body_error)
        else:
            self._end()

    def fail(self, code: Variant) -> None:
        """Answer with an ``error-code`` instead of a response."""
        self._fail(code)

    def network(self, content: bytes, deadline: float | None = None) -> None:
        """Make the request over the network with ``content`` as its body (the worker's own
        answer; a responder calls it for a request it sends on)."""
        request = self.request
        if deadline is None:
            deadline = time.monotonic() + request.total_timeout
        headers = list(request.headers)
        try:
            values = _secret_headers(request.secrets)
        except (_SecretUnavailable, OSError, UnicodeDecodeError):
            self._fail(error_code("configuration-error"))
            return
        headers += values
        redact = tuple(v for _, v in values if len(v) >= 4) + tuple(
            v[len(s.prefix.encode()) :]
            for s, (_, v) in zip(request.secrets, values, strict=True)
            if len(v) - len(s.prefix.encode()) >= 4
        )
        if content or request.method in ("POST", "PUT", "PATCH"):
            headers.append((b"Content-Length", str(len(content)).encode()))
        extensions: dict[str, Any] = {
            "timeout": {
                "connect": request.connect_timeout,
                "read": request.read_timeout,
                "write": request.read_timeout,
                "pool": request.connect_timeout,
            },
            "sni_hostname": request.host,
        }
        _CURRENT.exchange = self
        try:
            self._stream(request, headers, content, extensions, redact, deadline)
        finally:
            _CURRENT.exchange = None

    def _stream(
        self,
        request: PreparedRequest,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        extensions: dict[str, Any],
        redact: tuple[bytes, ...],
        deadline: float,
    ) -> None:
        with _pool(request.allow_private).stream(
            request.method.encode(),
            httpcore.URL(
                scheme=request.scheme.encode(),
                host=request.host.encode(),
                port=request.port,
                target=request.target.encode(),
            ),
            headers=headers,
            content=content,
            extensions=extensions,
        ) as response:
            headers = [(bytes(k), bytes(v)) for k, v in response.headers]
            if sum(len(k) + len(v) + 4 for k, v in headers) > self.limits.max_header_bytes:
                self._fail(error_code("HTTP-response-header-section-size", None))
                return
            self._set_head(response.status, _redacted(headers, redact))
            limit = self.limits.max_response_bytes
            for chunk in response.iter_stream():
                if self.cancelled:
                    return
                self.received += len(chunk)
                if self.received > limit:
                    self._fail(error_code("HTTP-response-body-size", self.received))
                    return
                if time.monotonic() > deadline:
                    self._fail(error_code("HTTP-response-timeout"))
                    return
                if chunk and not self._push(bytes(chunk), deadline):
                    if not self.cancelled:
                        self._fail(error_code("HTTP-response-timeout"))
                    return
            self._end()


def _secret_headers(secrets: tuple[Secret, ...]) -> list[tuple[bytes, bytes]]:
    """Each secret's header with its value, read from its source now."""
    out = []
    for secret in secrets:
        if secret.env is not None:
            value = os.environ.get(secret.env)
            if value is None:
                raise _SecretUnavailable(f"environment variable {secret.env} is not set")
        else:
            assert secret.file is not None
            value = Path(secret.file).read_text(encoding="utf-8").strip()
        raw = (secret.prefix + value).encode("utf-8")
        if any((c < 0x20 and c != 0x09) or c == 0x7F for c in raw):
            raise _SecretUnavailable(f"secret header {secret.header}'s value holds a control byte")
        out.append((secret.header.encode(), raw))
    return out


_REDACTED = b"[redacted by mighty]"


def _redacted(
    headers: list[tuple[bytes, bytes]], secrets: tuple[bytes, ...]
) -> list[tuple[bytes, bytes]]:
    """``headers`` with every value that holds an injected secret replaced by a marker."""
    if not secrets:
        return headers
    return [(k, _REDACTED if any(s in v for s in secrets) else v) for k, v in headers]


def _translate(exc: Exception, request: PreparedRequest) -> Variant:
    """A failure of the worker as the ``error-code`` the guest sees."""
    if isinstance(exc, _Prohibited):
        return error_code("destination-IP-prohibited")
    if isinstance(exc, socket.gaierror):
        if exc.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", -5)):
            return error_code("DNS-error", {"rcode": "NXDOMAIN", "info-code": None})
        return error_code("DNS-error", {"rcode": None, "info-code": None})
    if isinstance(exc, httpcore.ConnectTimeout):
        return error_code("connection-timeout")
    if isinstance(exc, httpcore.PoolTimeout):
        return error_code("connection-limit-reached")
    if isinstance(exc, httpcore.ConnectError):
        text = str(exc).lower()
        if "refused" in text:
            return error_code("connection-refused")
        if "certificate" in text:
            return error_code("TLS-certificate-error")
        if "ssl" in text or "tls" in text:
            return error_code("TLS-protocol-error")
        return error_code("destination-unavailable")
    if isinstance(exc, httpcore.ReadTimeout):
        return error_code("connection-read-timeout")
    if isinstance(exc, httpcore.WriteTimeout):
        return error_code("connection-write-timeout")
    if isinstance(exc, httpcore.RemoteProtocolError):
        text = str(exc).lower()
        if "disconnect" in text or "incomplete" in text or "peer closed" in text:
            return error_code("HTTP-response-incomplete")
        return error_code("HTTP-protocol-error")
    if isinstance(exc, httpcore.ReadError | httpcore.WriteError):
        return error_code("connection-terminated")
    if isinstance(exc, httpcore.LocalProtocolError):
        return (
            error_code("HTTP-request-header-section-size", None)
            if "header" in str(exc).lower()
            else error_code("HTTP-protocol-error")
        )
    return error_code("internal-error", f"{type(exc).__name__}: {exc}"[:200] or None)


def start(
    request: PreparedRequest,
    limits: HttpLimits,
    wake: threading.Event,
    respond: Responder | None = None,
) -> Exchange:
    """Start ``request`` on a worker thread; its :class:`Exchange`. ``respond(exchange, body)``
    answers it instead of the network (called on the worker once the body is finished)."""
    exchange = Exchange(request, limits, wake, respond)
    _WORKERS.run(exchange.run)
    return exchange


class _Workers:
    """Threads for exchanges, kept a while after their exchange so the next one need not
    start a thread (0.1-0.8 ms a start on a busy machine, measured by bench_http).

    Every job gets a thread at once: an idle one if there is one, else a new one. Rejected: a
    fixed pool, whose threads a guest that never reads its bodies would hold, starving every
    other instance's requests.
    """

    IDLE_SECONDS = 30.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: deque[Callable[[], None]] = deque()
        self._idle = 0
        self._ready = threading.Condition(self._lock)

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            if self._idle > len(self._jobs):
                self._jobs.append(job)
                self._ready.notify()
                return
        threading.Thread(target=self._work, args=(job,), name="mty-http", daemon=True).start()

    def _work(self, job: Callable[[], None]) -> None:
        while True:
            job()
            with self._lock:
                self._idle += 1
                try:
                    if not self._jobs:
                        self._ready.wait(self.IDLE_SECONDS)
                    if not self._jobs:
                        return
                    job = self._jobs.popleft()
                finally:
                    self._idle -= 1


_WORKERS = _Workers()
