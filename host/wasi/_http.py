"""``wasi:http`` 0.2: ``types`` and ``outgoing-handler``, under the policy's :class:`HttpPolicy`.

The guest builds a request out of resources (``fields``, ``outgoing-request``, its
``outgoing-body`` written through a ``wasi:io`` output stream), hands it to
``outgoing-handler.handle`` and gets a ``future-incoming-response``. Here:

- ``handle`` checks the request against the grants (origin and method: else
  ``HTTP-request-denied``) and the limits (requests in flight and per call: else
  ``connection-limit-reached``), adds the grant's secret headers, and starts an
  :class:`~mighty.wasi._http_client.Exchange` on a worker thread; it never blocks;
- the future, the response and its body read what the worker left, and their pollables carry
  the instance's wake event, so ``poll`` sleeps until something arrives (several requests in
  flight at once, a body read chunk by chunk as it comes);
- everything the guest sees passes the gate as import results, so a recorded run replays from
  the trace with no network and no secret, byte for byte.

A request body is buffered in the host (bounded by ``max_request_bytes``) and sent when the
guest finishes it, so ``handle`` may come before or after ``outgoing-body.finish``. Trailers
are not sent (HTTP/1.1 through httpcore has no request trailers); response trailers are always
none. Header names and values are checked as RFC 9110 asks, and the hop-by-hop headers the host
owns (``host``, ``connection``, ``transfer-encoding``, ...) are ``forbidden`` to the guest, as
wasmtime forbids them.

The server side (``incoming-request``, ``response-outparam``, ``outgoing-response``) is what
``mty serve`` (:mod:`mighty.serve`) hands an instance: :func:`incoming_handler_args` puts a
:class:`ServedRequest` and a :class:`ServedResponse` in the instance's tables, and the host calls
``wasi:http/incoming-handler.handle`` with them. The server feeds the request body from its
connection (:class:`RequestBody`, bounded and read by the guest through the same
``incoming-body`` and reader as a client's response body: one implementation of the type), and
reads the response as the guest writes it: the head when the guest calls
``response-outparam.set``, then the body chunk by chunk through a window of ``window`` bytes,
so a guest writing faster than the client reads waits in ``check-write`` (its pollable wakes
when the server drains), and a client that goes away fails the guest's next write ``closed``.
An ``outgoing-response`` made outside a server is data the guest may build and drop.

Rejected for the server side: buffering the whole response before sending it (a streaming
handler would hold its whole output in the host, and the client would see nothing until the
end); a blocking write that sleeps in the host until the client reads (a wait outside the
poll machinery would not see the call's deadline and cancel scope).

Rejected: making the request synchronously inside ``handle`` (one request at a time, and a
slow server would stall the guest's other work); following redirects in the host (each hop
must pass the policy, and the guest should see what happened).
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mighty.abi import Err, Ok, Variant
from mighty.gate import Binding, GuestContext, GuestViolation, ResourceKind, Slot
from mighty.wasi._http_client import (
    BodyBuffer,
    Exchange,
    PreparedRequest,
    Responder,
    error_code,
    start,
)
from mighty.wasi._http_policy import HttpPolicy
from mighty.wasi._idempotency import IDEMPOTENCY_KEYS
from mighty.wasi._io import ReadyPollable
from mighty.wasi._policy import Policy
from mighty.wasi._streams import (
    INPUT_STREAM,
    OUTPUT_STREAM,
    POLLABLE,
    InputStream,
    OutputStream,
    Pollable,
    StreamClosed,
    StreamFailed,
)

__all__ = [
    "HTTP_RESPONDER",
    "RequestBody",
    "ServedRequest",
    "ServedResponse",
    "bindings",
    "close_all",
    "incoming_handler_args",
    "resources",
    "setup",
]

_TYPES = "wasi:http/types"
_HANDLER = "wasi:http/outgoing-handler"
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_FORBIDDEN = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "transfer-encoding",
        "upgrade",
        "host",
        "http2-settings",
        "te",
        "trailer",
    }
)
_MAX_TARGET = 8 << 10
_MAX_AUTHORITY = 300
_NS = 1e-9


# -- per-instance state -----------------------------------------------------------------------


@dataclass(slots=True)
class _HttpState:
    policy: HttpPolicy
    wake: threading.Event = field(default_factory=threading.Event)
    exchanges: list[Exchange] = field(default_factory=list)
    held_header_bytes: int = 0
    scope: object = None
    calls: int = 0


_STATE: Slot[_HttpState] = Slot("wasi.http")

HTTP_RESPONDER: Slot[Responder] = Slot("wasi.http.responder")
"""Seed it to answer an instance's requests without the network (evaluation answers them from
a recording); the grants and limits are checked as ever before it is asked."""


def setup(ctx: GuestContext, policy: Policy) -> None:
    """Remember the HTTP policy; nothing is in flight yet."""
    ctx.put(_STATE, _HttpState(policy.http))


def close_all(ctx: GuestContext) -> None:
    """Cancel every exchange of the instance (at close): no worker outlives it by more than
    one read of its connection."""
    state = ctx.find(_STATE)
    if state is None:
        return
    for exchange in state.exchanges:
        exchange.cancel()
    state.exchanges.clear()


# -- fields -----------------------------------------------------------------------------------


class _Fields:
    """A header map: entries in order, names as given (compared lower-case)."""

    __slots__ = ("entries", "immutable", "state", "weight")

    def __init__(self, state: _HttpState | None, entries: list[tuple[str, bytes]], immutable: bool):
        self.state = state
        self.entries = entries
        self.immutable = immutable
        self.weight = 0
        if state is not None:
            self._charge(sum(len(k) + len(v) for k, v in entries))

    def _charge(self, delta: int) -> None:
        if self.state is None:
            return
        self.state.held_header_bytes += delta
        self.weight += delta

    def would_exceed(self, delta: int) -> bool:
        if self.state is None:
            return False
        return self.state.held_header_bytes + delta > self.state.policy.limits.max_held_header_bytes

    def release(self) -> None:
        self._charge(-self.weight)

    def lowered(self) -> list[tuple[bytes, bytes]]:
        return [(k.encode(), v) for k, v in self.entries]


def _drop_fields(_ctx: GuestContext, fields: object) -> None:
    # Every drop checks what it got: a replayer's stand-ins come here too.
    if isinstance(fields, _Fields):
        fields.release()


def _header_error(name: str, value: bytes | None = None) -> str | None:
    """The header-error case for this name and value, or None if they are acceptable."""
    raw = name.encode("utf-8", "surrogateescape")
    if not _TOKEN.match(raw):
        return "invalid-syntax"
    if value is not None and _BAD_VALUE.search(bytes(value)):
        return "invalid-syntax"
    if name.lower() in _FORBIDDEN:
        return "forbidden"
    return None


def _fields_new(ctx: GuestContext) -> Any:
    return ctx.new(FIELDS, _Fields(ctx.slot(_STATE), [], immutable=False))


def _fields_from_list(ctx: GuestContext, entries: Sequence[tuple[str, bytes]]) -> Ok | Err:
    state = ctx.slot(_STATE)
    checked: list[tuple[str, bytes]] = []
    size = 0
    for name, value in entries:
        problem = _header_error(name, value)
        if problem is not None:
            return Err(Variant(problem))
        checked.append((name, bytes(value)))
        size += len(name) + len(value)
    if state.held_header_bytes + size > state.policy.limits.max_held_header_bytes:
        return Err(Variant("forbidden"))
    return Ok(ctx.new(FIELDS, _Fields(state, checked, immutable=False)))


def _fields_get(_ctx: GuestContext, fields: _Fields, name: str) -> list[bytes]:
    key = name.lower()
    return [v for k, v in fields.entries if k.lower() == key]


def _fields_has(_ctx: GuestContext, fields: _Fields, name: str) -> bool:
    key = name.lower()
    return any(k.lower() == key for k, _ in fields.entries)


def _mutable(fields: _Fields, name: str, values: Sequence[bytes]) -> str | None:
    if fields.immutable:
        return "immutable"
    for value in values or [None]:  # type: ignore[list-item]
        problem = _header_error(name, value)
        if problem is not None:
            return problem
    if fields.would_exceed(len(name) * len(values) + sum(len(v) for v in values)):
        return "forbidden"
    return None


def _fields_set(_ctx: GuestContext, fields: _Fields, name: str, values: list[bytes]) -> Ok | Err:
    problem = _mutable(fields, name, values)
    if problem is not None:
        return Err(Variant(problem))
    key = name.lower()
    kept = [(k, v) for k, v in fields.entries if k.lower() != key]
    removed = sum(len(k) + len(v) for k, v in fields.entries if k.lower() == key)
    fields.entries = kept + [(name, bytes(v)) for v in values]
    fields._charge(sum(len(name) + len(v) for v in values) - removed)
    return Ok(None)


def _fields_delete(_ctx: GuestContext, fields: _Fields, name: str) -> Ok | Err:
    problem = _mutable(fields, name, [])
    if problem is not None:
        return Err(Variant(problem))
    key = name.lower()
    removed = sum(len(k) + len(v) for k, v in fields.entries if k.lower() == key)
    fields.entries = [(k, v) for k, v in fields.entries if k.lower() != key]
    fields._charge(-removed)
    return Ok(None)


def _fields_append(_ctx: GuestContext, fields: _Fields, name: str, value: bytes) -> Ok | Err:
    problem = _mutable(fields, name, [value])
    if problem is not None:
        return Err(Variant(problem))
    fields.entries.append((name, bytes(value)))
    fields._charge(len(name) + len(value))
    return Ok(None)


def _fields_entries(_ctx: GuestContext, fields: _Fields) -> list[tuple[str, bytes]]:
    return list(fields.entries)


def _fields_clone(ctx: GuestContext, fields: _Fields) -> Any:
    # The copy is the guest's own, charged to the instance whatever the original (a response's
    # headers are charged to nobody). The WIT gives clone no error case: over the cap, a trap.
    state = ctx.slot(_STATE)
    size = sum(len(k) + len(v) for k, v in fields.entries)
    if state.held_header_bytes + size > state.policy.limits.max_held_header_bytes:
        raise GuestViolation(
            "wasi:http fields.clone: the guest holds more header bytes than "
            "HttpLimits.max_held_header_bytes allows"
        )
    return ctx.new(FIELDS, _Fields(state, list(fields.entries), immutable=False))


# -- outgoing requests ------------------------------------------------------------------------


class _BodyWriter(OutputStream):
    """The output stream of an outgoing body: appends to its buffer, within its limit."""

    def __init__(self, body: BodyBuffer) -> None:
        self.body = body
        self.closed = False

    def check_write(self) -> int:
        if self.closed or self.body.done.is_set():
            raise StreamClosed
        return 1 << 20

    def write(self, data: bytes) -> None:
        size = len(self.body.data) + len(data)
        if size > self.body.limit:
            raise StreamFailed(
                f"request body over its limit of {self.body.limit} bytes",
                error_code("HTTP-request-body-size", size),
            )
        self.body.data += data

    def close(self) -> None:
        self.closed = True


class _OutgoingBody:
    """The guest's handle on a body it writes: a request's (``BodyBuffer``, sent whole) or a
    response's (``_ResponseBody``, streamed to a server's client); its stream is taken once;
    finish or drop ends it."""

    def __init__(self, target: BodyBuffer | _ResponseBody) -> None:
        self.target = target
        self.stream_taken = False
        self.finished = False


def _drop_outgoing_body(_ctx: GuestContext, body: object) -> None:
    if isinstance(body, _OutgoingBody) and not body.finished:
        body.target.abort()


class _OutgoingRequest:
    def __init__(self, headers: _Fields, limit: int) -> None:
        headers.immutable = True
        self.headers = headers
        self.method: Variant = Variant("get")
        self.path: str | None = None
        self.scheme: Variant | None = None
        self.authority: str | None = None
        self.body = BodyBuffer(limit)
        self.body_taken = False


def _request_new(ctx: GuestContext, headers: _Fields) -> Any:
    return ctx.new(OUTGOING_REQUEST, _OutgoingRequest(headers, _limits(ctx).max_request_bytes))


def _request_body(ctx: GuestContext, request: _OutgoingRequest) -> Ok | Err:
    if request.body_taken:
        return Err(None)
    request.body_taken = True
    return Ok(ctx.new(OUTGOING_BODY, _OutgoingBody(request.body)))


def _request_method(_ctx: GuestContext, request: _OutgoingRequest) -> Variant:
    return request.method


def _request_set_method(_ctx: GuestContext, request: _OutgoingRequest, method: Variant) -> Ok | Err:
    if method.case == "other" and not _TOKEN.match(str(method.value).encode("utf-8", "replace")):
        return Err(None)
    request.method = method
    return Ok(None)


def _request_path(_ctx: GuestContext, request: _OutgoingRequest) -> str | None:
    return request.path


def _request_set_path(_ctx: GuestContext, request: _OutgoingRequest, path: str | None) -> Ok | Err:
    if path is not None and (len(path) > _MAX_TARGET or not _valid_target(path)):
        return Err(None)
    request.path = path
    return Ok(None)


def _request_scheme(_ctx: GuestContext, request: _OutgoingRequest) -> Variant | None:
    return request.scheme


def _request_set_scheme(
    _ctx: GuestContext, request: _OutgoingRequest, scheme: Variant | None
) -> Ok | Err:
    if scheme is not None and scheme.case == "other":
        text = str(scheme.value)
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,31}", text):
            return Err(None)
    request.scheme = scheme
    return Ok(None)


def _request_authority(_ctx: GuestContext, request: _OutgoingRequest) -> str | None:
    return request.authority


def _request_set_authority(
    _ctx: GuestContext, request: _OutgoingRequest, authority: str | None
) -> Ok | Err:
    if authority is not None and _split_authority(authority, 80) is None:
        return Err(None)
    request.authority = authority
    return Ok(None)


def _request_headers(ctx: GuestContext, request: _OutgoingRequest) -> Any:
    # A child view: immutable, and it holds no bytes of its own against the guest's quota.
    return ctx.new(FIELDS, _Fields(None, request.headers.entries, immutable=True))


def _valid_target(path: str) -> bool:
    if not path.startswith("/") or not path.isascii():
        return False
    return not any(c <= " " or c == "\x7f" for c in path)


def _split_authority(authority: str, default_port: int) -> tuple[str, int] | None:
    """``host[:port]`` (IPv6 in brackets) as (lower-case host, port), or None if malformed."""
    if not authority or len(authority) > _MAX_AUTHORITY or not authority.isascii():
        return None
    if "@" in authority or any(c <= " " or c in "/?#\\" for c in authority):
        return None
    if authority.startswith("["):
        host, bracket, rest = authority[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = authority.partition(":")
        if ":" in port_text:
            return None
    if not host:
        return None
    if port_text == "":
        return host.lower(), default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        return None
    return host.lower(), int(port_text)


# -- request options --------------------------------------------------------------------------


@dataclass(slots=True)
class _Options:
    connect: int | None = None
    first_byte: int | None = None
    between_bytes: int | None = None


def _options_new(ctx: GuestContext) -> Any:
    return ctx.new(REQUEST_OPTIONS, _Options())


def _getter(name: str) -> Any:
    def get(_ctx: GuestContext, options: _Options) -> int | None:
        value: int | None = getattr(options, name)
        return value

    return get


def _setter(name: str) -> Any:
    def set_(_ctx: GuestContext, options: _Options, duration: int | None) -> Ok:
        setattr(options, name, duration)
        return Ok(None)

    return set_


# -- outgoing-handler.handle ------------------------------------------------------------------


def _limits(ctx: GuestContext) -> Any:
    return ctx.slot(_STATE).policy.limits


def _handle(ctx: GuestContext, request: _OutgoingRequest, options: _Options | None) -> Ok | Err:
    state = ctx.slot(_STATE)
    limits = state.policy.limits
    if state.scope is not ctx.scope:
        state.scope, state.calls = ctx.scope, 0
    state.calls += 1
    if state.calls > limits.max_requests_per_call:
        return Err(error_code("connection-limit-reached"))
    # Only running exchanges are kept (to count them and to cancel them at close): a finished
    # one's data lives in the guest's resources, so an agent's millionth request costs no more.
    state.exchanges = [e for e in state.exchanges if e.running]
    if len(state.exchanges) >= limits.max_in_flight:
        return Err(error_code("connection-limit-reached"))

    scheme_case = request.scheme.case if request.scheme is not None else "HTTPS"
    if scheme_case not in ("HTTP", "HTTPS"):
        return Err(error_code("HTTP-protocol-error"))
    scheme = scheme_case.lower()
    if request.authority is None:
        return Err(error_code("HTTP-request-URI-invalid"))
    split = _split_authority(request.authority, 443 if scheme == "https" else 80)
    if split is None:
        return Err(error_code("HTTP-request-URI-invalid"))
    host, port = split
    method = (
        str(request.method.value) if request.method.case == "other" else request.method.case.upper()
    )
    grant = state.policy.grant_for(scheme, host, port)
    if grant is None or (grant.methods is not None and method not in grant.methods):
        return Err(error_code("HTTP-request-denied"))

    # The grant's secret headers replace the guest's of the same name; their values are read
    # only when the request goes to the network (an answer from a recording needs none).
    owned = {s.header.lower() for s in grant.secrets} | {"content-length"}
    headers = [(k.encode(), v) for k, v in request.headers.entries if k.lower() not in owned]
    if not request.body_taken:
        request.body.finish()  # never asked for: an empty body, as wasmtime sends
    headers.insert(0, (b"Host", request.authority.encode()))
    keys = ctx.find(IDEMPOTENCY_KEYS)
    if keys is not None and not any(k.lower() == b"idempotency-key" for k, _ in headers):
        headers.append((b"Idempotency-Key", keys.key().encode()))  # a durable agent's request
    if sum(len(k) + len(v) + 4 for k, v in headers) > limits.max_header_bytes:
        return Err(error_code("HTTP-request-header-section-size", None))

    opts = options or _Options()

    def seconds(asked: int | None, most: float) -> float:
        return most if asked is None else max(0.001, min(asked * _NS, most))

    prepared = PreparedRequest(
        method=method,
        scheme=scheme,
        host=host.strip("[]"),
        port=port,
        authority=request.authority,
        target=request.path or "/",
        headers=tuple(headers),
        body=request.body,
        allow_private=grant.private_ok,
        secrets=grant.secrets,
        connect_timeout=seconds(opts.connect, limits.connect_timeout),
        read_timeout=min(
            seconds(opts.first_byte, limits.first_byte_timeout),
            seconds(opts.between_bytes, limits.between_bytes_timeout),
        ),
        total_timeout=limits.total_timeout,
    )
    exchange = start(prepared, limits, state.wake, ctx.find(HTTP_RESPONDER))
    state.exchanges.append(exchange)
    return Ok(ctx.new(FUTURE_INCOMING_RESPONSE, _Future(exchange)))


# -- outgoing bodies --------------------------------------------------------------------------


def _body_write(ctx: GuestContext, body: _OutgoingBody) -> Ok | Err:
    if body.stream_taken:
        return Err(None)
    body.stream_taken = True
    target = body.target
    writer = _BodyWriter(target) if isinstance(target, BodyBuffer) else _ResponseWriter(target)
    return Ok(ctx.new(OUTPUT_STREAM, writer))


def _body_finish(_ctx: GuestContext, body: _OutgoingBody, trailers: _Fields | None) -> Ok | Err:
    body.finished = True
    if trailers is not None:
        trailers.release()
        if trailers.entries:
            body.target.abort()
            return Err(error_code("internal-error", "trailers are not supported"))
    body.target.finish()
    return Ok(None)


# -- the response side ------------------------------------------------------------------------


class _ExchangePollable(Pollable):
    """Ready when the exchange's head (``body=False``) or next body bytes (``True``) are."""

    def __init__(self, exchange: Exchange, body: bool) -> None:
        self.exchange = exchange
        self.body = body

    def ready(self) -> bool:
        return self.exchange.body_ready() if self.body else self.exchange.head_ready()

    def waker(self) -> threading.Event | None:
        return self.exchange.wake


class _Future:
    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange


def _drop_future(_ctx: GuestContext, future: object) -> None:
    if isinstance(future, _Future) and not future.exchange.response_taken:
        future.exchange.cancel()


def _future_subscribe(ctx: GuestContext, future: _Future) -> Any:
    return ctx.new(POLLABLE, _ExchangePollable(future.exchange, body=False))


def _future_get(ctx: GuestContext, future: _Future) -> Ok | Err | None:
    exchange = future.exchange
    if not exchange.head_ready():
        return None
    if exchange.response_taken:
        return Err(None)
    exchange.response_taken = True
    if exchange.error is not None:
        return Ok(Err(exchange.error))
    headers = [(k.decode("latin-1"), v) for k, v in exchange.headers]
    response = _IncomingResponse(exchange, _Fields(None, headers, immutable=True))
    return Ok(Ok(ctx.new(INCOMING_RESPONSE, response)))


class _IncomingResponse:
    def __init__(self, exchange: Exchange, headers: _Fields) -> None:
        self.exchange = exchange
        self.headers = headers


def _drop_response(_ctx: GuestContext, response: object) -> None:
    if isinstance(response, _IncomingResponse) and not response.exchange.body_taken:
        response.exchange.cancel()


def _response_status(_ctx: GuestContext, response: _IncomingResponse) -> int:
    return response.exchange.status


def _response_headers(ctx: GuestContext, response: _IncomingResponse) -> Any:
    return ctx.new(FIELDS, response.headers)


def _response_consume(ctx: GuestContext, response: _IncomingResponse) -> Ok | Err:
    if response.exchange.body_taken:
        return Err(None)
    response.exchange.body_taken = True
    return Ok(ctx.new(INCOMING_BODY, _IncomingBody(response.exchange)))


class _BodySource(Protocol):
    """What an ``incoming-body`` reads: a client's response (:class:`Exchange`, fed by its
    worker) or a served request (:class:`RequestBody`, fed by the server)."""

    stream_taken: bool
    cancelled: bool
    wake: threading.Event

    def read(self, limit: int) -> tuple[bytes, bool, Variant | None]: ...

    def body_ready(self) -> bool: ...

    def cancel(self) -> None: ...


class _IncomingBody:
    def __init__(self, source: _BodySource) -> None:
        self.source = source


def _drop_incoming_body(_ctx: GuestContext, body: object) -> None:
    if isinstance(body, _IncomingBody) and not body.source.stream_taken:
        body.source.cancel()


class _BodyReader(InputStream):
    """A body as the guest reads it: what the worker or the server buffered, then the end."""

    def __init__(self, source: _BodySource) -> None:
        self.source = source

    def read(self, limit: int) -> bytes:
        data, ended, error = self.source.read(limit)
        if data:
            return data
        if error is not None:
            raise StreamFailed(f"body failed: {error.case}", error)
        if ended:
            raise StreamClosed
        if self.source.cancelled:
            raise StreamFailed("the body was cancelled", error_code("connection-terminated"))
        return b""

    def ready(self) -> bool:
        return self.source.body_ready() or self.source.cancelled

    def waker(self) -> threading.Event | None:
        return self.source.wake

    def close(self) -> None:
        self.source.cancel()


def _incoming_body_stream(ctx: GuestContext, body: _IncomingBody) -> Ok | Err:
    if body.source.stream_taken:
        return Err(None)
    body.source.stream_taken = True
    return Ok(ctx.new(INPUT_STREAM, _BodyReader(body.source)))


def _incoming_body_finish(ctx: GuestContext, body: _IncomingBody) -> Any:
    if not body.source.stream_taken:
        body.source.cancel()
    return ctx.new(FUTURE_TRAILERS, _Trailers())


class _Trailers:
    taken = False


def _trailers_subscribe(ctx: GuestContext, _trailers: _Trailers) -> Any:
    return ctx.new(POLLABLE, ReadyPollable())


def _trailers_get(_ctx: GuestContext, trailers: _Trailers) -> Ok | Err:
    if trailers.taken:
        return Err(None)
    trailers.taken = True
    return Ok(Ok(None))


def _http_error_code(_ctx: GuestContext, error: object) -> Variant | None:
    code = getattr(error, "code", None)
    return code if isinstance(code, Variant) else None


# -- the server side: incoming requests, response outparams, outgoing responses ---------------

_METHODS = frozenset(
    {"get", "head", "post", "put", "delete", "connect", "options", "trace", "patch"}
)


class RequestBody:
    """A served request's body: the server feeds it from its connection (any thread), the
    guest reads it through ``incoming-body``. The server bounds it: it stops reading its
    socket while :attr:`buffered` is over its window and resumes when ``on_read`` says the
    guest took some."""

    def __init__(self, on_read: Callable[[], None] | None = None) -> None:
        self.lock = threading.Lock()
        self.wake = threading.Event()
        """Set after each change; :func:`incoming_handler_args` makes it the instance's own."""
        self.on_read = on_read
        self._chunks: deque[bytes] = deque()
        self.buffered = 0
        self.received = 0
        self.eof = False
        self.error: Variant | None = None
        self.cancelled = False
        self.stream_taken = False
        self.body_taken = False

    # -- the server's side -----------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Bytes from the connection (dropped if the guest cancelled the body)."""
        with self.lock:
            if self.cancelled or self.eof or self.error is not None:
                return
            self._chunks.append(bytes(data))
            self.buffered += len(data)
            self.received += len(data)
        self.wake.set()

    def end(self) -> None:
        """The whole body has arrived."""
        with self.lock:
            self.eof = True
        self.wake.set()

    def fail(self, code: Variant) -> None:
        """The body cannot be completed (too large, the client stalled or went away): the
        guest's next read fails with ``code`` once it has read what arrived."""
        with self.lock:
            if not self.eof and self.error is None:
                self.error = code
        self.wake.set()

    # -- the guest's side (the _BodySource protocol) ----------------------------------------

    def body_ready(self) -> bool:
        with self.lock:
            return bool(self._chunks) or self.eof or self.error is not None

    def read(self, limit: int) -> tuple[bytes, bool, Variant | None]:
        with self.lock:
            out = bytearray()
            while self._chunks and len(out) < limit:
                chunk = self._chunks.popleft()
                room = limit - len(out)
                if len(chunk) > room:
                    self._chunks.appendleft(chunk[room:])
                    chunk = chunk[:room]
                out += chunk
            self.buffered -= len(out)
            ended = not self._chunks and (self.eof or self.error is not None)
            error = self.error if ended else None
        if out and self.on_read is not None:
            self.on_read()
        return bytes(out), ended, error

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True
            self._chunks.clear()
            self.buffered = 0
        if self.on_read is not None:
            self.on_read()


@dataclass(slots=True)
class ServedRequest:
    """An HTTP request a server hands to an instance's ``incoming-handler.handle``."""

    method: str
    """As sent (``GET``; any token)."""
    path_with_query: str
    scheme: str | None
    """``http``, ``https`` or None."""
    authority: str | None
    headers: list[tuple[str, bytes]]
    body: RequestBody


class _ResponseBody:
    """The body of an ``outgoing-response``: what the guest wrote and the server has not
    taken yet, at most ``window`` bytes of it; ``limit`` bytes in all."""

    def __init__(self, limit: int, wake: threading.Event, window: int = 1 << 20) -> None:
        self.lock = threading.Lock()
        self.limit = limit
        self.wake = wake
        self.window = window
        self._chunks: deque[bytes] = deque()
        self.pending = 0
        self.written = 0
        self.finished = False
        self.aborted = False
        self.closed = False
        self.notify: Callable[[], None] | None = None
        """Set when the response reaches a server: called after each write, finish, abort."""

    # -- the guest's side -------------------------------------------------------------------

    def room(self) -> int:
        with self.lock:
            if self.closed or self.finished or self.aborted:
                raise StreamClosed
            return max(0, self.window - self.pending)

    def write(self, data: bytes) -> None:
        with self.lock:
            size = self.written + len(data)
            if size > self.limit:
                raise StreamFailed(
                    f"response body over its limit of {self.limit} bytes",
                    error_code("HTTP-response-body-size", size),
                )
            self._chunks.append(data)
            self.pending += len(data)
            self.written = size
            notify = self.notify
        if notify is not None:
            notify()

    def finish(self) -> None:
        with self.lock:
            self.finished = True
            notify = self.notify
        if notify is not None:
            notify()

    def abort(self) -> None:
        with self.lock:
            if self.finished:
                return
            self.aborted = True
            notify = self.notify
        if notify is not None:
            notify()

    # -- the server's side ------------------------------------------------------------------

    def take(self, limit: int) -> tuple[bytes, bool, bool]:
        """Up to ``limit`` written bytes; whether the body is complete (finished and all
        taken); whether the guest abandoned it unfinished."""
        with self.lock:
            out = bytearray()
            while self._chunks and len(out) < limit:
                chunk = self._chunks.popleft()
                room = limit - len(out)
                if len(chunk) > room:
                    self._chunks.appendleft(chunk[room:])
                    chunk = chunk[:room]
                out += chunk
            self.pending -= len(out)
            done = self.finished and not self._chunks
            aborted = self.aborted
        if out:
            self.wake.set()
        return bytes(out), done, aborted

    def close(self) -> None:
        """The client is gone: the guest's next write fails ``closed``."""
        with self.lock:
            self.closed = True
            self._chunks.clear()
            self.pending = 0
        self.wake.set()


class _ResponseWriter(OutputStream):
    """The output stream of a response body: as much as the window has room for."""

    def __init__(self, body: _ResponseBody) -> None:
        self.body = body

    def check_write(self) -> int:
        return self.body.room()

    def write(self, data: bytes) -> None:
        self.body.write(bytes(data))

    def ready(self) -> bool:
        try:
            return self.body.room() > 0
        except StreamClosed:
            return True

    def waker(self) -> threading.Event | None:
        return self.body.wake


class ServedResponse:
    """The host side of a ``response-outparam``: what the guest answered, for the server.

    ``notify`` is called (on the guest's thread) whenever something changed: the head was
    set, body bytes were written, the body was finished or abandoned, the outparam dropped.
    """

    def __init__(
        self, notify: Callable[[], None] | None = None, *, limit: int | None = None
    ) -> None:
        self.notify = notify
        self.limit = limit
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: _ResponseBody | None = None
        self.error: Variant | None = None
        """The ``error-code`` the guest answered instead of a response."""
        self.dropped = False

    @property
    def answered(self) -> bool:
        """Whether the guest set a response or an error."""
        return self.status is not None or self.error is not None

    def _changed(self) -> None:
        if self.notify is not None:
            self.notify()


def _drop_outparam(_ctx: GuestContext, out: object) -> None:
    if isinstance(out, ServedResponse):
        out.dropped = True
        out._changed()


class _IncomingRequest:
    def __init__(self, request: ServedRequest) -> None:
        self.request = request
        self.method = _method_variant(request.method)
        self.scheme = _scheme_variant(request.scheme)
        self.headers = [(k.lower(), bytes(v)) for k, v in request.headers]


def _method_variant(method: str) -> Variant:
    lower = method.lower()
    if lower in _METHODS and method == method.upper():
        return Variant(lower)
    return Variant("other", method)


def _scheme_variant(scheme: str | None) -> Variant | None:
    if scheme is None:
        return None
    if scheme.lower() in ("http", "https"):
        return Variant(scheme.upper())
    return Variant("other", scheme)


def _drop_incoming_request(_ctx: GuestContext, request: object) -> None:
    if isinstance(request, _IncomingRequest) and not request.request.body.body_taken:
        request.request.body.cancel()


def _incoming_method(_ctx: GuestContext, request: _IncomingRequest) -> Variant:
    return request.method


def _incoming_path(_ctx: GuestContext, request: _IncomingRequest) -> str | None:
    return request.request.path_with_query


def _incoming_scheme(_ctx: GuestContext, request: _IncomingRequest) -> Variant | None:
    return request.scheme


def _incoming_authority(_ctx: GuestContext, request: _IncomingRequest) -> str | None:
    return request.request.authority


def _incoming_headers(ctx: GuestContext, request: _IncomingRequest) -> Any:
    # A child view, as the response's: immutable, charged to nobody (the server bounded it).
    return ctx.new(FIELDS, _Fields(None, request.headers, immutable=True))


def _incoming_consume(ctx: GuestContext, request: _IncomingRequest) -> Ok | Err:
    body = request.request.body
    if body.body_taken:
        return Err(None)
    body.body_taken = True
    return Ok(ctx.new(INCOMING_BODY, _IncomingBody(body)))


def _outparam_set(ctx: GuestContext, out: ServedResponse, response: Ok | Err) -> None:
    if isinstance(response, Err):
        code = response.value
        out.error = code if isinstance(code, Variant) else error_code("internal-error", None)
        out._changed()
        return
    outgoing = response.value
    if not isinstance(outgoing, _OutgoingResponse):
        raise GuestViolation("wasi:http response-outparam.set: not an outgoing-response")
    body = outgoing.body
    with body.lock:
        if out.limit is not None:
            body.limit = min(body.limit, out.limit)
        body.notify = out._changed
    out.headers = outgoing.headers.lowered()
    out.body = body
    out.status = outgoing.status
    out._changed()


def incoming_handler_args(
    ctx: GuestContext, request: ServedRequest, response: ServedResponse
) -> tuple[Any, Any]:
    """The two arguments of ``wasi:http/incoming-handler.handle`` for this instance:
    ``request`` as its ``incoming-request`` and ``response`` as its ``response-outparam``
    (handles the guest owns once the call is made)."""
    state = ctx.slot(_STATE)
    request.body.wake = state.wake
    return (
        ctx.new(INCOMING_REQUEST, _IncomingRequest(request)),
        ctx.new(RESPONSE_OUTPARAM, response),
    )


class _OutgoingResponse:
    def __init__(self, headers: _Fields, limit: int, wake: threading.Event) -> None:
        headers.immutable = True
        self.headers = headers
        self.status = 200
        self.body = _ResponseBody(limit, wake)
        self.body_taken = False


def _outgoing_response_new(ctx: GuestContext, headers: _Fields) -> Any:
    state = ctx.slot(_STATE)
    response = _OutgoingResponse(headers, state.policy.limits.max_response_bytes, state.wake)
    return ctx.new(OUTGOING_RESPONSE, response)


def _outgoing_response_status(_ctx: GuestContext, response: _OutgoingResponse) -> int:
    return response.status


def _outgoing_response_set_status(
    _ctx: GuestContext, response: _OutgoingResponse, status: int
) -> Ok | Err:
    if not 100 <= status <= 999:
        return Err(None)
    response.status = status
    return Ok(None)


def _outgoing_response_headers(ctx: GuestContext, response: _OutgoingResponse) -> Any:
    return ctx.new(FIELDS, _Fields(None, response.headers.entries, immutable=True))


def _outgoing_response_body(ctx: GuestContext, response: _OutgoingResponse) -> Ok | Err:
    if response.body_taken:
        return Err(None)
    response.body_taken = True
    return Ok(ctx.new(OUTGOING_BODY, _OutgoingBody(response.body)))


# -- the interface ----------------------------------------------------------------------------

FIELDS = ResourceKind(_TYPES, "fields", on_drop=_drop_fields)
OUTGOING_REQUEST = ResourceKind(_TYPES, "outgoing-request")
OUTGOING_BODY = ResourceKind(_TYPES, "outgoing-body", on_drop=_drop_outgoing_body)
REQUEST_OPTIONS = ResourceKind(_TYPES, "request-options")
FUTURE_INCOMING_RESPONSE = ResourceKind(_TYPES, "future-incoming-response", on_drop=_drop_future)
INCOMING_RESPONSE = ResourceKind(_TYPES, "incoming-response", on_drop=_drop_response)
INCOMING_BODY = ResourceKind(_TYPES, "incoming-body", on_drop=_drop_incoming_body)
FUTURE_TRAILERS = ResourceKind(_TYPES, "future-trailers")
OUTGOING_RESPONSE = ResourceKind(_TYPES, "outgoing-response")
INCOMING_REQUEST = ResourceKind(_TYPES, "incoming-request", on_drop=_drop_incoming_request)
RESPONSE_OUTPARAM = ResourceKind(_TYPES, "response-outparam", on_drop=_drop_outparam)


def resources() -> list[ResourceKind]:
    """Every wasi:http/types resource."""
    return [
        FIELDS,
        OUTGOING_REQUEST,
        OUTGOING_BODY,
        REQUEST_OPTIONS,
        FUTURE_INCOMING_RESPONSE,
        INCOMING_RESPONSE,
        INCOMING_BODY,
        FUTURE_TRAILERS,
        OUTGOING_RESPONSE,
        INCOMING_REQUEST,
        RESPONSE_OUTPARAM,
    ]


def bindings() -> list[Binding]:
    """Every function of wasi:http/types and wasi:http/outgoing-handler 0.2 (the server side
    of the types included: ``incoming-handler`` is an export, called by the host)."""
    t = _TYPES
    out = [
        Binding(t, "[constructor]fields", _fields_new),
        Binding(t, "[static]fields.from-list", _fields_from_list),
        Binding(t, "[method]fields.get", _fields_get),
        Binding(t, "[method]fields.has", _fields_has),
        Binding(t, "[method]fields.set", _fields_set),
        Binding(t, "[method]fields.delete", _fields_delete),
        Binding(t, "[method]fields.append", _fields_append),
        Binding(t, "[method]fields.entries", _fields_entries),
        Binding(t, "[method]fields.clone", _fields_clone),
        Binding(t, "[constructor]outgoing-request", _request_new),
        Binding(t, "[method]outgoing-request.body", _request_body),
        Binding(t, "[method]outgoing-request.method", _request_method),
        Binding(t, "[method]outgoing-request.set-method", _request_set_method),
        Binding(t, "[method]outgoing-request.path-with-query", _request_path),
        Binding(t, "[method]outgoing-request.set-path-with-query", _request_set_path),
        Binding(t, "[method]outgoing-request.scheme", _request_scheme),
        Binding(t, "[method]outgoing-request.set-scheme", _request_set_scheme),
        Binding(t, "[method]outgoing-request.authority", _request_authority),
        Binding(t, "[method]outgoing-request.set-authority", _request_set_authority),
        Binding(t, "[method]outgoing-request.headers", _request_headers),
        Binding(t, "[method]outgoing-body.write", _body_write),
        Binding(t, "[static]outgoing-body.finish", _body_finish),
        Binding(t, "[constructor]request-options", _options_new),
        Binding(t, "[method]future-incoming-response.subscribe", _future_subscribe),
        Binding(t, "[method]future-incoming-response.get", _future_get),
        Binding(t, "[method]incoming-response.status", _response_status),
        Binding(t, "[method]incoming-response.headers", _response_headers),
        Binding(t, "[method]incoming-response.consume", _response_consume),
        Binding(t, "[method]incoming-body.stream", _incoming_body_stream),
        Binding(t, "[static]incoming-body.finish", _incoming_body_finish),
        Binding(t, "[method]future-trailers.subscribe", _trailers_subscribe),
        Binding(t, "[method]future-trailers.get", _trailers_get),
        Binding(t, "[constructor]outgoing-response", _outgoing_response_new),
        Binding(t, "[method]outgoing-response.status-code", _outgoing_response_status),
        Binding(t, "[method]outgoing-response.set-status-code", _outgoing_response_set_status),
        Binding(t, "[method]outgoing-response.headers", _outgoing_response_headers),
        Binding(t, "[method]outgoing-response.body", _outgoing_response_body),
        Binding(t, "http-error-code", _http_error_code),
        Binding(_HANDLER, "handle", _handle),
    ]
    for which in ("connect-timeout", "first-byte-timeout", "between-bytes-timeout"):
        attr = {"connect-timeout": "connect", "first-byte-timeout": "first_byte"}.get(
            which, "between_bytes"
        )
        out.append(Binding(t, f"[method]request-options.{which}", _getter(attr)))
        out.append(Binding(t, f"[method]request-options.set-{which}", _setter(attr)))
    out += [
        Binding(t, "[method]incoming-request.method", _incoming_method),
        Binding(t, "[method]incoming-request.path-with-query", _incoming_path),
        Binding(t, "[method]incoming-request.scheme", _incoming_scheme),
        Binding(t, "[method]incoming-request.authority", _incoming_authority),
        Binding(t, "[method]incoming-request.headers", _incoming_headers),
        Binding(t, "[method]incoming-request.consume", _incoming_consume),
        Binding(t, "[static]response-outparam.set", _outparam_set),
    ]
    return out
