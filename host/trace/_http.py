"""The HTTP exchanges of a recorded instance, and answering a member's requests from them.

A trace holds what the guest saw of each request, as import records: the fields it built, the
request's method, scheme, authority and path, the body it wrote, ``handle``'s future, the
response's status and headers, and the body chunks it read. :func:`recorded_exchanges` puts
those records back together into one :class:`RecordedExchange` per request, following the
resources from call to call (fields into the request, the body's stream, the future, the
response, its body stream).

:class:`RecordedHttp` answers a member's requests from them **by request key** (method, URL and
a hash of the body): the n-th identical request gets the n-th recorded response, so a new build
that builds its requests differently (other chunk sizes, headers in another order, one more
clock read between them) still meets the recorded world. It plugs in as the instance's
``HTTP_RESPONDER``: the member's own ``wasi:http`` imports run for real (the grants and limits
checked as ever), and only the network is replaced.

Rejected: answering the individual ``wasi:http`` imports by their recorded arguments (what
``TraceAnswers`` does for the rest): a member that writes its body in other chunks, or reads the
response in other sizes, would diverge on an identical exchange.

A response is as complete as the baseline read it: headers the baseline never listed are
absent, and a body it did not read to the end ends where it stopped.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mighty.abi import Err, Ok, Variant
from mighty.trace._values import HandleRef
from mighty.wasi import Exchange, error_code

__all__ = [
    "HTTP_INTERFACES",
    "RecordedExchange",
    "RecordedHttp",
    "Unmatched",
    "recorded_exchanges",
    "request_key",
]

_TYPES = "wasi:http/types"
_HANDLER = "wasi:http/outgoing-handler"
_STREAMS = "wasi:io/streams"
HTTP_INTERFACES = frozenset({_TYPES, _HANDLER})


def request_key(method: str, url: str, body: bytes) -> tuple[str, str, str]:
    """What makes two requests the same question: method, URL and the body's SHA-256."""
    return (method.upper(), url, hashlib.sha256(body).hexdigest())


@dataclass(slots=True)
class RecordedExchange:
    """One request of the baseline and what it got (as far as the baseline read it)."""

    method: str = "GET"
    url: str = ""
    body: bytearray = field(default_factory=bytearray)
    status: int | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    error: Variant | None = None
    """The request's error-code (``handle`` or the future failed)."""
    body_error: Variant | None = None
    ended: bool = False
    """A read of the response body met its end (``closed``)."""

    @property
    def key(self) -> tuple[str, str, str]:
        return request_key(self.method, self.url, bytes(self.body))

    @property
    def complete(self) -> bool:
        """The guest saw how the exchange ended: an error, or the response's body to its end
        (or to its error). An exchange a crash cut short is not: no response yet, or a body
        read part way (a durable agent's recovery makes that request again, live)."""
        if self.error is not None or self.body_error is not None:
            return True
        return self.status is not None and self.ended


@dataclass(slots=True)
class _Request:
    headers: int | None = None
    method: str = "GET"
    scheme: str = "https"
    authority: str = ""
    path: str = "/"
    body: bytearray = field(default_factory=bytearray)


def _rep(value: Any) -> int | None:
    return value.rep if isinstance(value, HandleRef) else None


def _ok_rep(value: Any) -> int | None:
    return _rep(value.value) if isinstance(value, Ok) else None


def _method(value: Any) -> str:
    if isinstance(value, Variant):
        return str(value.value) if value.case == "other" else value.case.upper()
    return "GET"


def recorded_exchanges(records: Sequence[dict[str, Any]]) -> list[RecordedExchange]:
    """The HTTP exchanges in one instance's import records, in the order they were handed to
    ``handle`` (a refused ``handle`` is an exchange with its ``error``)."""
    rebuild = _Rebuild()
    for record in records:
        if record.get("k") != "import" or record.get("out") != "ok":
            continue
        args = record.get("args")
        args = args if isinstance(args, list) else [args]
        first = _rep(args[0]) if args else None
        if first is None:
            continue
        interface, fn, res = str(record.get("if")), str(record.get("fn")), record.get("res")
        if interface == _TYPES:
            rebuild.types(fn, first, args, res)
        elif interface == _HANDLER and fn == "handle":
            rebuild.handle(first, res)
        elif interface == _STREAMS:
            rebuild.streams(fn, first, args, res)
    return rebuild.exchanges


class _Rebuild:
    """Follows the resources of one instance's HTTP imports from call to call."""

    def __init__(self) -> None:
        self.requests: dict[int, _Request] = {}
        self.writers: dict[int, _Request] = {}  # outgoing-body and output-stream reps
        self.exchanges: list[RecordedExchange] = []
        self.owner: dict[int, RecordedExchange] = {}  # future, response, body, stream reps
        self.header_owner: dict[int, RecordedExchange] = {}
        self.failed_reads: dict[int, RecordedExchange] = {}  # io-error reps

    def types(self, fn: str, first: int, args: list[Any], res: Any) -> None:
        if fn == "[constructor]outgoing-request":
            rep = _rep(res)
            if rep is not None:
                self.requests[rep] = _Request(headers=first)
        elif fn.startswith("[method]outgoing-request.set-") and first in self.requests:
            self._set(fn, self.requests[first], args[1] if len(args) > 1 else None)
        elif fn in ("[method]outgoing-request.body", "[method]outgoing-body.write"):
            rep = _ok_rep(res)
            if rep is not None and first in (self.requests if "request" in fn else self.writers):
                self.writers[rep] = (self.requests if "request" in fn else self.writers)[first]
        elif fn == "[method]future-incoming-response.get" and first in self.owner:
            if isinstance(res, Ok) and isinstance(res.value, Ok):
                rep = _rep(res.value.value)
                if rep is not None:
                    self.owner[rep] = self.owner[first]
            elif isinstance(res, Ok) and isinstance(res.value, Err):
                self.owner[first].error = res.value.value
        elif fn == "[method]incoming-response.status" and first in self.owner:
            self.owner[first].status = res if isinstance(res, int) else None
        elif fn == "[method]incoming-response.headers" and first in self.owner:
            rep = _rep(res)
            if rep is not None:
                self.header_owner[rep] = self.owner[first]
        elif fn == "[method]fields.entries" and first in self.header_owner:
            self.header_owner[first].headers = [
                (str(k).encode("latin-1", "replace"), bytes(v)) for k, v in res or []
            ]
        elif fn in ("[method]incoming-response.consume", "[method]incoming-body.stream"):
            rep = _ok_rep(res)
            if rep is not None and first in self.owner:
                self.owner[rep] = self.owner[first]
        elif fn == "http-error-code" and first in self.failed_reads and isinstance(res, Variant):
            self.failed_reads[first].body_error = res

    @staticmethod
    def _set(fn: str, request: _Request, value: Any) -> None:
        if fn.endswith("set-method"):
            request.method = _method(value)
        elif fn.endswith("set-scheme") and isinstance(value, Variant):
            scheme = str(value.value) if value.case == "other" else value.case
            request.scheme = scheme.lower()
        elif fn.endswith("set-authority") and isinstance(value, str):
            request.authority = value
        elif fn.endswith("set-path-with-query") and isinstance(value, str):
            request.path = value

    def handle(self, first: int, res: Any) -> None:
        request = self.requests.get(first)
        if request is None:
            return
        exchange = RecordedExchange(
            method=request.method,
            url=f"{request.scheme}://{request.authority}{request.path}",
            body=request.body,
        )
        self.exchanges.append(exchange)
        rep = _ok_rep(res)
        if rep is not None:
            self.owner[rep] = exchange
        elif isinstance(res, Err):
            exchange.error = res.value

    def streams(self, fn: str, first: int, args: list[Any], res: Any) -> None:
        writes = ("[method]output-stream.write", "[method]output-stream.blocking-write-and-flush")
        reads = ("[method]input-stream.read", "[method]input-stream.blocking-read")
        if first in self.writers and fn in writes:
            if isinstance(res, Ok) and len(args) > 1 and isinstance(args[1], bytes):
                self.writers[first].body += args[1]
        elif first in self.owner and fn in reads:
            exchange = self.owner[first]
            if isinstance(res, Ok) and isinstance(res.value, bytes):
                exchange.chunks.append(res.value)
            elif isinstance(res, Err) and res.value == Variant("closed"):
                exchange.ended = True
            elif isinstance(res, Err) and isinstance(res.value, Variant):
                rep = _rep(res.value.value)
                if rep is not None:
                    self.failed_reads[rep] = exchange
                    exchange.body_error = exchange.body_error or error_code(
                        "HTTP-response-incomplete"
                    )


@dataclass(frozen=True, slots=True)
class Unmatched:
    """A member's request the recording has no answer for."""

    method: str
    url: str
    body: bytes

    def describe(self) -> str:
        size = f", a {len(self.body)}-byte body" if self.body else ""
        return f"HTTP {self.method} {self.url}{size}"


class RecordedHttp:
    """An ``HTTP_RESPONDER`` answering requests from recorded exchanges, by request key.

    ``unmatched(request)`` decides what happens to a request the recording cannot answer: it
    returns True to send it to the network (``live``), or False to refuse it
    (``HTTP-request-denied``, after it has noted the divergence).
    """

    def __init__(
        self,
        exchanges: Sequence[RecordedExchange],
        unmatched: Callable[[Unmatched], bool],
    ) -> None:
        self._unmatched = unmatched
        self._lock = threading.Lock()
        self._by_key: dict[tuple[str, str, str], deque[RecordedExchange]] = {}
        for exchange in exchanges:
            self._by_key.setdefault(exchange.key, deque()).append(exchange)
        self.answered: list[RecordedExchange] = []

    def __call__(self, exchange: Exchange, body: bytes) -> None:
        request = exchange.request
        key = request_key(request.method, request.url, body)
        with self._lock:
            queue = self._by_key.get(key)
            recorded = queue.popleft() if queue else None
        if recorded is None:
            if self._unmatched(Unmatched(request.method, request.url, body)):
                exchange.network(body)
            else:
                exchange.fail(error_code("HTTP-request-denied"))
            return
        self.answered.append(recorded)
        if recorded.error is not None or recorded.status is None:
            exchange.fail(recorded.error or error_code("HTTP-response-incomplete"))
            return
        exchange.answer(recorded.status, recorded.headers, recorded.chunks, recorded.body_error)
