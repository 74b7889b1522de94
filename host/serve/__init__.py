"""``mty serve``: components that export ``wasi:http/incoming-handler`` behind an HTTP server,
one fresh instance per request under a per-request budget; and agents behind routes of the
same server (``[http]`` in mighty.toml, :class:`AgentFront`) (docs/serve.md)."""

from mighty.serve._front import (
    AgentFront,
    AgentRoute,
    BodyConflict,
    RouteStats,
    build_body,
    is_loopback,
    parse_listen,
    read_token,
    serve_application,
)
from mighty.serve._http import HttpServer, Running, ServeStats
from mighty.serve._limits import ServeLimits
from mighty.serve._routes import Route, RouteTable, parse_route
from mighty.serve._server import Server, handler_export

__all__ = [
    "AgentFront",
    "AgentRoute",
    "BodyConflict",
    "HttpServer",
    "Route",
    "RouteStats",
    "RouteTable",
    "Running",
    "ServeLimits",
    "ServeStats",
    "Server",
    "build_body",
    "handler_export",
    "is_loopback",
    "parse_listen",
    "parse_route",
    "read_token",
    "serve_application",
]
