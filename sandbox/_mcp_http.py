"""Code mode over MCP on Streamable HTTP: the SDK's own app, served by uvicorn.

``mty sandbox serve --http HOST:PORT [--token-file F]`` serves the same ``MCPServer`` as stdio,
through ``MCPServer.streamable_http_app`` (the SDK's session manager: one MCP session per
client, each request's progress and reply on that request's own stream). Around it:

- a bearer token (:class:`BearerAuth`): with one, every HTTP request without
  ``Authorization: Bearer <token>`` is answered 401 before the SDK sees it, compared in constant
  time (SHA-256 of both sides through ``hmac.compare_digest``, so not even the length leaks).
  Without one only a loopback address may be bound (:func:`check_bind`): a public bind without
  a token is refused, not warned about;
- bounds on what clients can make the server hold: request bodies (the SDK answers 413 past
  :data:`MAX_REQUEST_BYTES`), open MCP sessions (503 past :data:`MAX_SESSIONS`), idle sessions
  closed after :data:`SESSION_IDLE` seconds, connections and tasks at once (uvicorn answers
  503 past :data:`MAX_CONNECTIONS`), header size (uvicorn's h11 limit), and calls running or
  waiting at once (``build_sandbox_server``'s admission: a ``busy`` result past it);
- DNS-rebinding protection on loopback binds (the SDK's own: Host and Origin must be loopback).

Rejected: the SDK's OAuth machinery (``AuthSettings``/``TokenVerifier``) for one static token:
it needs an issuer URL and resource metadata a local tool server does not have.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import socket
from collections.abc import Callable
from typing import Any

from mighty._errors import BadInput
from mighty._files import read_regular_file

__all__ = [
    "MAX_CONNECTIONS",
    "MAX_REQUEST_BYTES",
    "MAX_SESSIONS",
    "SESSION_IDLE",
    "BearerAuth",
    "check_bind",
    "http_app",
    "is_loopback",
    "parse_bind",
    "read_token",
    "serve_http",
]

MAX_REQUEST_BYTES = 4 << 20
"""Largest request body (code and inputs; inputs are at most ``Limits.output`` anyway)."""
MAX_SESSIONS = 256
"""MCP sessions open at once; one more is answered 503 until one ends or idles out."""
SESSION_IDLE = 600.0
"""Seconds without a request after which a session is closed (the client re-initializes)."""
MAX_CONNECTIONS = 256
"""Connections and tasks uvicorn serves at once; past it, 503 at once."""
_MIN_TOKEN = 16
_MAX_TOKEN = 4096
_LOCALHOST = "localhost"

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]
ASGIApp = Callable[[Scope, Receive, Send], Any]


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host, port); port 0 picks a free one."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise BadInput(f"--http {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8765")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise BadInput(f"--http {text!r}: port must be in 0..65535")
    return host, port


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``); names are not resolved."""
    if host.lower() == _LOCALHOST:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve anywhere but loopback without a token."""
    if token is None and not is_loopback(host):
        raise BadInput(
            f"refusing to serve on {host} without a bearer token: anyone who can reach it could "
            "run code; bind 127.0.0.1 or pass --token-file"
        )


def read_token(path: str | os.PathLike[str]) -> str:
    """The bearer token in ``path``: one line of 16 to 4096 visible ASCII characters."""
    data = read_regular_file(path, _MAX_TOKEN + 2, limit_text="a token file's size limit")
    try:
        token = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise BadInput(f"token file {os.fsdecode(path)}: not ASCII") from None
    if not _MIN_TOKEN <= len(token) <= _MAX_TOKEN or not all(33 <= ord(c) <= 126 for c in token):
        raise BadInput(
            f"token file {os.fsdecode(path)}: the token must be one line of {_MIN_TOKEN} to "
            f"{_MAX_TOKEN} visible ASCII characters (e.g. from `openssl rand -hex 32`)"
        )
    return token


class BearerAuth:
    """ASGI middleware: an HTTP request passes only with ``Authorization: Bearer <token>``.

    Anything else (no header, another scheme, a wrong token, the header twice) is 401 with
    ``WWW-Authenticate: Bearer``, before the request reaches the MCP app (a websocket without it
    is closed; any other scope is dropped). Lifespan events pass.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = hashlib.sha256(b"Bearer " + token.encode("ascii")).digest()

    def allows(self, headers: list[tuple[bytes, bytes]]) -> bool:
        given = [value for name, value in headers if name.lower() == b"authorization"]
        presented = given[0] if len(given) == 1 else b""
        return hmac.compare_digest(hashlib.sha256(presented).digest(), self._expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan" or self.allows(list(scope.get("headers") or [])):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":  # the app serves none, but no unchecked scope gets through
            await send({"type": "websocket.close", "code": 1008})
            return
        if kind == "http":
            body = b"missing or wrong bearer token\n"
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", b'Bearer realm="mighty-sandbox"'),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})


def http_app(server: Any, *, host: str, token: str | None) -> ASGIApp:
    """The ASGI app: the SDK's Streamable HTTP app at ``/mcp``, behind the token if any."""
    app: ASGIApp = server.streamable_http_app(
        host=host,
        max_request_body_size=MAX_REQUEST_BYTES,
        max_sessions=MAX_SESSIONS,
        session_idle_timeout=SESSION_IDLE,
    )
    return app if token is None else BearerAuth(app, token)


def serve_http(
    server: Any,
    *,
    host: str,
    port: int,
    token: str | None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Bind ``host:port`` (refused off loopback without a token), tell ``on_ready`` the URL, and
    serve until SIGINT or SIGTERM."""
    try:
        import uvicorn
    except ImportError as exc:
        raise BadInput(
            f"serving HTTP needs uvicorn ({exc}); pip install 'mighty-host[mcp]'"
        ) from None

    check_bind(host, token)
    app = http_app(server, host=host, token=token)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise BadInput(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=2,
        server_header=False,
    )
    if on_ready is not None:
        on_ready(f"http://{shown}:{bound}/mcp")
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
