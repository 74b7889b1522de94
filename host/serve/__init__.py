"""``mty serve``: components that export ``wasi:http/incoming-handler`` behind an HTTP server,
one fresh instance per request under a per-request budget (docs/serve.md)."""

from mighty.serve._limits import ServeLimits
from mighty.serve._server import Running, Server, ServeStats, handler_export

__all__ = ["Running", "ServeLimits", "ServeStats", "Server", "handler_export"]
