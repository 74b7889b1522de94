"""``mty serve``: components that export ``wasi:http/incoming-handler`` behind an HTTP server,
one fresh instance per request under a per-request budget; and agents behind routes of the
same server (``[http]`` in mighty.toml, :class:`AgentFront`) (docs/serve.md)."""

from mighty.serve._http import HttpServer, Running, ServeStats
from mighty.serve._limits import ServeLimits
from mighty.serve._server import Server, handler_export

__all__ = ["HttpServer", "Running", "ServeLimits", "ServeStats", "Server", "handler_export"]
