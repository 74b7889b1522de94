"""Agents behind HTTP routes: each request matched to a route becomes one ask, its reply the
JSON response (the ``[http]`` block of mighty.toml; ``mty run --http``; docs/serve.md).

A route (``POST /kv/{key}`` -> agent ``kv``, message ``put``) says where the ask goes and how
its body is built from the path parameters and the request's JSON body (:func:`build_body`).
The ask runs on one of the server's worker threads (``Runtime.ask`` blocks; the loop must
not), at most ``max_concurrent`` at once (503 past it, as for a component). The reply, made
JSON (``to_json``: bytes as base64...), is answered 200. An ask that fails answers the
status of its kind with ``{"error": KIND}``: ``noproc`` 503 (the named agent is down or
restarting; 404 when the agent's name came from the path), ``mailbox_full`` 429,
``timeout`` 504, ``refused`` 400 (not in the type's protocol), ``failed`` 500 (the handler's
error, whose text is the agent's own and is passed on as ``message``; a crash says only
``failed``), ``circuit_open`` 503. Anything else is 500 ``internal`` and goes to the log.

Per route the front counts requests, those in flight and responses by status
(:meth:`AgentFront.snapshot`, which ``mty top`` and ``mty inspect`` show through the control
socket). With telemetry on, each routed request is an OpenTelemetry ``http.server`` span
(``http.request.method``, ``url.path``, ``http.route``, ``http.response.status_code``,
``server.address``/``server.port``), the child of the request's ``traceparent`` header when
it has one, made current on the thread that asks, so the ``agent.ask`` span and the
handler's ``agent.handle`` are its children: one trace from the client to the handler.

The front knows the runtime only as an ``ask`` callable and the agent errors only by their
``code`` (the WIT ``agent-error`` case): ``mighty.serve`` sits below ``mighty.agents``,
which starts it (``Application.serve_http``). Rejected: a second HTTP server for agents (one
server keeps the limits, timeouts and token right once); the whole request as the ask's body
(the agent would parse HTTP; a route states the mapping once, checked when the manifest
loads); 200 with an error object for failed asks (a client, a proxy and a retry policy all
read the status, not the body).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11

from mighty._errors import BadInput
from mighty.serve._http import HttpServer
from mighty.serve._limits import ServeLimits
from mighty.serve._routes import Route, RouteTable

__all__ = [
    "AgentFront",
    "AgentRoute",
    "BodyConflict",
    "RouteStats",
    "build_body",
    "check_body_template",
    "is_loopback",
    "parse_listen",
    "read_token",
    "serve_application",
]

_STATUS = {
    "noproc": 503,
    "mailbox-full": 429,
    "timeout": 504,
    "refused": 400,
    "failed": 500,
    "circuit-open": 503,
    "cycle": 500,
    "bad-spawn": 500,
}
_BODY = "$body"
_ABSENT = object()


@dataclass(frozen=True, slots=True)
class AgentRoute:
    """One route: requests matching ``route`` ask ``to`` (an agent's name or address, or
    ``{param}``: the path parameter's value) the message ``message``, with the body built by
    :func:`build_body` from ``body`` (None: the default), within ``timeout`` seconds (None:
    the target's budget and a grace, as ``Runtime.ask``)."""

    route: Route
    to: str
    message: str
    body: Any = None
    timeout: float | None = None

    def __post_init__(self) -> None:
        target = _param(self.to)
        if target is not None and target not in self.route.params:
            raise BadInput(f"route {self.route}: to {self.to!r} names no parameter of the path")
        if self.body is not None:
            check_body_template(self.body, self.route)

    def target(self, params: dict[str, str | int]) -> str:
        """The agent this request asks."""
        name = _param(self.to)
        return self.to if name is None else str(params[name])


def _param(text: Any) -> str | None:
    if isinstance(text, str) and len(text) > 2 and text[0] == "{" and text[-1] == "}":
        return text[1:-1]
    return None


def check_body_template(template: Any, route: Route, depth: int = 0) -> None:
    """:class:`BadInput` unless every ``"{name}"`` in ``template`` is a parameter of ``route``
    (``"$body"`` and ``"$body.FIELD"`` stand for the request's JSON body and one field)."""
    if depth > 16:
        raise BadInput(f"route {route}: the body template nests deeper than 16")
    if isinstance(template, str):
        name = _param(template)
        if name is not None and name not in route.params:
            known = ", ".join(route.params) or "none"
            raise BadInput(
                f"route {route}: the body names {template!r}, which is no parameter of the "
                f"path (its parameters: {known})"
            )
        if template.startswith(_BODY) and template != _BODY and not template.startswith("$body."):
            raise BadInput(f"route {route}: {template!r}: write $body or $body.FIELD")
    elif isinstance(template, list):
        for item in template:
            check_body_template(item, route, depth + 1)
    elif isinstance(template, dict):
        for value in template.values():
            check_body_template(value, route, depth + 1)


class BodyConflict(BadInput):
    """The request's JSON body cannot be combined with the path parameters (400)."""

    kind = "bad_body"


def build_body(template: Any, params: dict[str, str | int], payload: Any = _ABSENT) -> Any:
    """The ask's body. With no template (None): the path parameters merged into the JSON
    object body (a key in both is a :class:`BodyConflict`); the JSON body alone when the path
    has no parameters; the parameters alone when there is no body. With a template: a copy
    where ``"{name}"`` is the parameter, ``"$body"`` the JSON body (null when none) and
    ``"$body.FIELD"`` that field of it (null when missing)."""
    if template is None:
        if payload is _ABSENT:
            return dict(params) if params else None
        if not params:
            return payload
        if not isinstance(payload, dict):
            raise BodyConflict("a route with path parameters takes a JSON object body")
        clash = sorted(set(payload) & set(params))
        if clash:
            raise BodyConflict(f"the body repeats path parameter(s) {', '.join(clash)}")
        return {**payload, **params}
    return _fill(template, params, None if payload is _ABSENT else payload)


def _fill(template: Any, params: dict[str, str | int], payload: Any) -> Any:
    if isinstance(template, str):
        name = _param(template)
        if name is not None and name in params:
            return params[name]
        if template == _BODY:
            return payload
        if template.startswith("$body."):
            return payload.get(template[6:]) if isinstance(payload, dict) else None
        return template
    if isinstance(template, list):
        return [_fill(item, params, payload) for item in template]
    if isinstance(template, dict):
        return {key: _fill(value, params, payload) for key, value in template.items()}
    return template


@dataclass
class RouteStats:
    """One route's counts (only grow, but ``in_flight``)."""

    requests: int = 0
    in_flight: int = 0
    statuses: Counter[int] = field(default_factory=Counter)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "in_flight": self.in_flight,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
        }


@dataclass(slots=True)
class _Answer:
    status: int
    data: bytes
    kind: str | None = None
    close: bool = False
    """Answered by ``_refuse`` with the connection closed (the body was not read whole)."""


class AgentFront(HttpServer):
    """HTTP routes to agents' asks, on :class:`~mighty.serve.HttpServer`.

    ``ask(to, message, body, timeout)`` is ``Runtime.ask``; ``to_json`` turns a reply into
    JSON values (``mighty.agents.hosting.jsonable``); ``telemetry``, a
    ``mighty.telemetry.Telemetry``, makes one ``http.server`` span per routed request.
    ``limits``, ``token`` and ``log`` are :class:`~mighty.serve.HttpServer`'s.
    """

    def __init__(
        self,
        routes: Sequence[AgentRoute],
        ask: Callable[[str, str, Any, float | None], Any],
        *,
        to_json: Callable[[Any], Any] = lambda value: value,
        telemetry: Any = None,
        limits: ServeLimits | None = None,
        token: str | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(limits=limits, token=token, log=log)
        self.table = RouteTable([r.route for r in routes])
        self._routes = {r.route: r for r in routes}
        self._ask = ask
        self._to_json = to_json
        self.telemetry = telemetry
        self.route_stats = {str(r.route): RouteStats() for r in routes}
        self._count_lock = threading.Lock()
        self.address: tuple[str, int] | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 8080) -> tuple[str, int]:
        self.address = await super().start(host, port)
        return self.address

    def snapshot(self) -> dict[str, Any]:
        """What ``mty top``/``mty inspect`` show: the address, requests and those in flight,
        responses by status, and per route the same."""
        stats = self.stats
        with self._count_lock:
            routes = {name: s.to_json() for name, s in self.route_stats.items()}
        host, port = self.address or ("", 0)
        return {
            "listen": f"{host}:{port}" if self.address else None,
            "connections": stats.connections,
            "requests": stats.requests,
            "in_flight": stats.in_flight,
            "statuses": {str(k): v for k, v in sorted(stats.statuses.items())},
            "routes": routes,
        }

    async def _answer(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        head: h11.Request,
    ) -> int:
        method = head.method.decode("ascii", "replace")
        target = head.target.decode("ascii", "replace")
        found = self.table.match(method, target)
        if found.route is None:
            if found.allowed:
                allow = ", ".join(found.allowed).encode()
                return await self._error(
                    conn, writer, 405, "method_not_allowed", allow=allow, head_only=method == "HEAD"
                )
            return await self._refuse(conn, writer, 404, "no_route")
        agent_route = self._routes[found.route]
        counts = self.route_stats[str(found.route)]
        span = None
        if self.telemetry is not None:
            span = self._span_begin(method, target, found.route, head.headers)
        if not self._admit():
            with self._count_lock:
                counts.requests += 1
                counts.statuses[503] += 1
            if span is not None:
                self.telemetry.http_end(span, 503, "busy")
            return await self._refuse(conn, writer, 503, "busy", close=True)
        with self._count_lock:
            counts.requests += 1
            counts.in_flight += 1
        self.stats.in_flight += 1
        answer: _Answer | None = None
        try:
            answer = await self._work(conn, reader, writer, agent_route, found.params, span)
        finally:
            # Counted before the client can see the answer (a client reading the counts
            # after its response sees its request done).
            self._leave()
            self.stats.in_flight -= 1
            with self._count_lock:
                counts.in_flight -= 1
                if answer is not None:
                    counts.statuses[answer.status] += 1
            if span is not None:
                self._span_end(span, answer)
        if answer.close:
            return await self._refuse(conn, writer, answer.status, answer.kind or "", close=True)
        if answer.kind is not None:
            self.stats.failures[answer.kind] += 1
        return await self._reply(conn, writer, answer.status, answer.data)

    async def _work(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        route: AgentRoute,
        params: dict[str, str | int],
        span: Any,
    ) -> _Answer:
        raw = await self._read_body(conn, reader, writer)
        if isinstance(raw, str):
            answer = _error_answer(413 if raw == "too_large" else 408, raw)
            answer.close = True
            return answer
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._workers, self._call, route, params, raw, span)
        self._guests.add(work)
        work.add_done_callback(self._guests.discard)
        return await work

    async def _error(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        status: int,
        kind: str,
        *,
        allow: bytes,
        head_only: bool = False,
    ) -> int:
        self.stats.failures[kind] += 1
        data = json.dumps({"error": kind}).encode() + b"\n"
        headers = [(b"allow", allow)]
        if conn.their_state not in (h11.DONE, h11.IDLE):
            headers.append((b"connection", b"close"))  # the body was not read
        return await self._reply(conn, writer, status, data, headers, head_only=head_only)

    # -- on a worker thread -------------------------------------------------------------------

    def _call(
        self, route: AgentRoute, params: dict[str, str | int], raw: bytes, span: Any
    ) -> _Answer:
        if raw.strip():
            try:
                payload = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                return _error_answer(400, "bad_json")
        else:
            payload = _ABSENT
        try:
            body = build_body(route.body, params, payload)
        except BodyConflict as exc:
            return _error_answer(400, "bad_body", exc.message)
        to = route.target(params)
        scope: AbstractContextManager[Any] = (
            nullcontext() if span is None else self.telemetry.http_current(span)
        )
        try:
            with scope:
                reply = self._ask(to, route.message, body, route.timeout)
        except Exception as exc:  # noqa: BLE001 - every failure is a status, none is raised
            return self._failed(route, to, exc)
        try:
            data = json.dumps(self._to_json(reply), allow_nan=False).encode() + b"\n"
        except (TypeError, ValueError) as exc:
            self.log(f"  {route.route}: the reply is not JSON: {exc}")
            return _error_answer(500, "bad_reply")
        if len(data) > self.limits.max_response_bytes:
            self.log(f"  {route.route}: the reply is {len(data)} bytes, past max_response_bytes")
            return _error_answer(500, "too_large")
        return _Answer(200, data)

    def _failed(self, route: AgentRoute, to: str, exc: Exception) -> _Answer:
        code = getattr(exc, "code", None)
        if not isinstance(code, str) or code not in _STATUS:
            self.log(f"  {route.route}: ask {to} {route.message}: {type(exc).__name__}: {exc}")
            return _error_answer(500, "internal")
        status = _STATUS[code]
        if code == "noproc" and _param(route.to) is not None:
            status = 404  # the client named the agent: it is not there
        message = None
        if code == "failed" and type(exc).__name__ == "HandlerFailed":
            message = str(getattr(exc, "message", exc))  # the handler's own error text
        self.log(f"  {route.route}: ask {to} {route.message}: {code}")
        return _error_answer(status, code.replace("-", "_"), message)

    # -- telemetry ----------------------------------------------------------------------------

    def _span_begin(self, method: str, target: str, route: Route, headers: Any) -> Any:
        host, port = self.address or ("", 0)
        parent = next((v.decode("latin-1") for k, v in headers if k == b"traceparent"), None)
        return self.telemetry.http_begin(
            method,
            str(route.template),
            {
                "url.path": target.split("?", 1)[0],
                "url.scheme": "http",
                "server.address": host,
                "server.port": port,
                "network.protocol.version": "1.1",
            },
            parent,
        )

    def _span_end(self, span: Any, answer: _Answer | None) -> None:
        if answer is None:  # the client went away before an answer
            self.telemetry.http_end(span, None, "gone")
        else:
            self.telemetry.http_end(span, answer.status, answer.kind)


def _error_answer(status: int, kind: str, message: str | None = None) -> _Answer:
    payload: dict[str, str] = {"error": kind}
    if message is not None:
        payload["message"] = message[:1000]
    return _Answer(status, json.dumps(payload).encode() + b"\n", kind)


def parse_listen(text: str, what: str = "--listen") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) as (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) >= 65536:
        raise BadInput(f"{what} takes HOST:PORT (port 0: any free one), got {text!r}")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(path: Path, what: str = "--token-file") -> str:
    """The bearer token in the file at ``path``: 16+ characters, no spaces."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{what} {path}: {exc}") from None
    if len(token) < 16 or any(c.isspace() for c in token):
        raise BadInput(f"{what} {path}: the token must be 16+ characters without spaces")
    return token


def serve_application(
    settings: Any,
    routes: Sequence[AgentRoute],
    runtime: Any,
    base: Path,
    *,
    listen: str | None = None,
    to_json: Callable[[Any], Any] = lambda value: value,
    log: Callable[[str], None] | None = None,
) -> tuple[AgentFront, Callable[[], None]]:
    """An :class:`AgentFront` for a manifest's ``[http]`` block (``settings``) asking
    ``runtime``, serving on a thread of its own; (the front, a function that stops it
    gracefully). ``listen`` overrides the block's; a token file is relative to ``base``."""
    where = listen if listen is not None else settings.listen
    if where is None:
        raise BadInput("[http] has no listen address: set [http] listen or give --http HOST:PORT")
    host, port = parse_listen(where, "[http] listen" if listen is None else "--http")
    token = None
    if settings.token_file is not None:
        token = read_token(base / settings.token_file, "[http] token_file")
    if token is None and not is_loopback(host):
        raise BadInput(f"[http] on {where} is off loopback: set [http] token_file")
    sizes = {
        name: value if isinstance(value, int) else _size(value)
        for name, value in (
            ("max_request_bytes", settings.max_request_bytes),
            ("max_response_bytes", settings.max_response_bytes),
        )
    }
    limits = ServeLimits(
        max_concurrent=settings.max_concurrent,
        max_connections=settings.max_connections,
        **sizes,
        header_timeout=settings.header_timeout,
        body_timeout=settings.body_timeout,
        idle_timeout=settings.idle_timeout,
        shutdown_timeout=settings.shutdown_timeout,
    )

    def ask(to: str, message: str, body: Any, timeout: float | None) -> Any:
        return runtime.ask(to, message, body, timeout=timeout)

    front = AgentFront(
        routes,
        ask,
        to_json=to_json,
        telemetry=runtime.telemetry,
        limits=limits,
        token=token,
        log=log,
    )
    serving = ExitStack()
    try:
        serving.enter_context(front.background(host, port))
    except OSError as exc:  # the address is taken, or not this machine's
        raise BadInput(f"[http] cannot listen on {where}: {exc.strerror or exc}") from None
    return front, serving.close


def _size(text: str) -> int:
    units = {"": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 10**6, "mb": 10**6, "mib": 1 << 20}
    value = text.strip().lower()
    digits = value.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = value[len(digits) :].strip()
    if not digits.strip().isdigit() or unit not in units:
        raise BadInput(f"{text!r} is not a size (examples: 1048576, 1MiB)")
    return int(digits) * units[unit]
