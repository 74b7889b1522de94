"""What one ``mty serve`` server allows: connections, requests in flight, sizes, timeouts.

Every bound has a safe default and is checked when made (``BadInput``), so a server never runs
with a limit of zero or a negative timeout. Rejected: unbounded defaults "for speed" (the
client is hostile: each unbounded quantity is a way to hold the server's memory or slots).
"""

from __future__ import annotations

from dataclasses import dataclass

from mighty._errors import BadInput

__all__ = ["ServeLimits"]


@dataclass(frozen=True, slots=True)
class ServeLimits:
    """Bounds on one server. Every one has a safe default."""

    max_connections: int = 1024
    """Open connections; a connection past it is closed at once, unread."""
    max_concurrent: int = 32
    """Requests being handled at once (each holds an instance and a worker thread); a request
    past it is answered 503 at once."""
    max_header_bytes: int = 32 << 10
    """Bytes of a request line and header section; past it 431."""
    max_request_bytes: int = 16 << 20
    """Bytes of one request body; past it 413 (the guest's read fails
    ``HTTP-request-body-size``)."""
    max_response_bytes: int = 64 << 20
    """Bytes of one response body; the guest's write past it fails ``HTTP-response-body-size``."""
    header_timeout: float = 10.0
    """Seconds from a request's first byte to the end of its header section (slow headers)."""
    idle_timeout: float = 5.0
    """Seconds a kept-alive connection may wait for its next request's first byte."""
    body_timeout: float = 30.0
    """Seconds between two reads of a request body (a client that stops sending)."""
    write_timeout: float = 30.0
    """Seconds a response write may wait for the client to read (a client that stops reading)."""
    shutdown_timeout: float = 30.0
    """Seconds a graceful shutdown waits for requests in flight before it stops them."""

    def __post_init__(self) -> None:
        for name in (
            "max_connections",
            "max_concurrent",
            "max_header_bytes",
            "max_request_bytes",
            "max_response_bytes",
        ):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise BadInput(f"ServeLimits.{name} must be a positive int, got {value!r}")
        for name in (
            "header_timeout",
            "idle_timeout",
            "body_timeout",
            "write_timeout",
            "shutdown_timeout",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadInput(f"ServeLimits.{name} must be a number of seconds, got {value!r}")
            if not 0 < value <= 86_400:
                raise BadInput(f"ServeLimits.{name} must be in (0, 86400] seconds, got {value!r}")
