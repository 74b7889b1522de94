"""The control protocol, apart from any socket: newline-delimited JSON, one object per line.

Request::

    {"version": 1, "id": 7, "op": "status", "args": {}}

Reply (always carrying ``version`` and the request's ``id``, ``null`` when it could not be read)::

    {"version": 1, "id": 7, "ok": true, "result": ...}
    {"version": 1, "id": 7, "ok": false, "error": {"kind": "...", "message": "..."}}

Everything here is pure (bytes in, values or bytes out) so the server and client are thin I/O
adapters and the protocol is testable without sockets.

Rejected: a length-prefixed binary framing (JSON lines can be typed by hand with ``socat``, which
matters for a debugging socket) and HTTP over the Unix socket (a dependency and a parser for two
dozen lines of value).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from mighty._errors import HostError

__all__ = [
    "ENV_VAR",
    "MAX_LINE",
    "MAX_REPLY",
    "PROTOCOL_VERSION",
    "ControlError",
    "LineBuffer",
    "LineTooLong",
    "ProtocolError",
    "Reply",
    "Request",
    "decode_reply",
    "decode_request",
    "encode_error",
    "encode_ok",
    "encode_request",
]

PROTOCOL_VERSION = 1
ENV_VAR = "RUNTIME_CONTROL_SOCK"
MAX_LINE = 1024 * 1024
"""Longest request line the server reads; longer gets a ``too_large`` reply and a close."""
MAX_REPLY = 64 * 1024 * 1024
"""Longest reply line the client reads (status of a large tree can be big, but not unbounded)."""


class ControlError(HostError):
    """A control request failed; ``kind`` says how (the server's error kind, or a local one).

    Local kinds: ``unavailable`` (no socket, nothing listening, or not permitted), ``timeout``,
    ``protocol`` (the reply was not a valid reply to our request).
    """

    kind = "control_error"

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class ProtocolError(Exception):
    """A request line that cannot be served; becomes an error reply (``id`` when known)."""

    def __init__(self, kind: str, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.request_id = request_id


class LineTooLong(ProtocolError):
    """A line grew past the limit before its newline arrived."""

    def __init__(self, limit: int) -> None:
        super().__init__("too_large", f"request line is longer than the limit of {limit} bytes")
        self.limit = limit


@dataclass(frozen=True)
class Request:
    """One decoded request."""

    id: int
    op: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Reply:
    """One decoded reply: ``result`` when ``ok``, else ``kind`` and ``message``."""

    id: int | None
    ok: bool
    result: Any = None
    kind: str = ""
    message: str = ""


class LineBuffer:
    """Splits a byte stream into lines, refusing any line longer than ``limit``."""

    def __init__(self, limit: int = MAX_LINE) -> None:
        self._limit = limit
        self._buffer = bytearray()
        # Bytes of _buffer already searched for a newline, so a slow trickle stays linear.
        self._scanned = 0

    def feed(self, data: bytes) -> list[bytes]:
        """Add ``data``; return the complete lines (without newline). Raises LineTooLong."""
        self._buffer += data
        lines: list[bytes] = []
        start = 0
        while True:
            end = self._buffer.find(b"\n", max(start, self._scanned))
            if end < 0:
                break
            if end - start > self._limit:
                raise LineTooLong(self._limit)
            lines.append(bytes(self._buffer[start:end]))
            start = end + 1
        del self._buffer[:start]
        self._scanned = len(self._buffer)
        if len(self._buffer) > self._limit:
            raise LineTooLong(self._limit)
        return lines

    @property
    def pending(self) -> int:
        """Bytes received after the last complete line."""
        return len(self._buffer)


def _loads(line: bytes) -> Any:
    """JSON from one line, or ProtocolError: bad UTF-8, bad JSON, nesting too deep."""
    try:
        return json.loads(line.decode("utf-8"))
    except RecursionError:
        raise ProtocolError("bad_request", "request is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are both ValueErrors
        raise ProtocolError("bad_request", f"request is not valid JSON: {exc}") from None


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def decode_request(line: bytes) -> Request:
    """Decode one request line; ProtocolError (with the id when readable) if it is not one."""
    data = _loads(line)
    if not isinstance(data, dict):
        raise ProtocolError("bad_request", "request must be a JSON object")
    request_id = data.get("id")
    if not _is_int(request_id):
        raise ProtocolError("bad_request", "request has no integer 'id'")
    version = data.get("version")
    if not _is_int(version):
        raise ProtocolError("bad_request", "request has no integer 'version'", request_id)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            "version_mismatch",
            f"request uses protocol version {version}, this server speaks version"
            f" {PROTOCOL_VERSION}",
            request_id,
        )
    op = data.get("op")
    if not isinstance(op, str) or not op:
        raise ProtocolError("bad_request", "request has no 'op' string", request_id)
    args = data.get("args", {})
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ProtocolError("bad_request", "request 'args' must be a JSON object", request_id)
    return Request(request_id, op, args)


def _dumps(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def encode_request(request_id: int, op: str, args: dict[str, Any] | None = None) -> bytes:
    """One request line, newline included."""
    return _dumps({"version": PROTOCOL_VERSION, "id": request_id, "op": op, "args": args or {}})


def encode_ok(request_id: int | None, result: Any) -> bytes:
    """A success reply line; TypeError or ValueError if ``result`` is not JSON."""
    return _dumps({"version": PROTOCOL_VERSION, "id": request_id, "ok": True, "result": result})


def encode_error(request_id: int | None, kind: str, message: str) -> bytes:
    """An error reply line."""
    return _dumps(
        {
            "version": PROTOCOL_VERSION,
            "id": request_id,
            "ok": False,
            "error": {"kind": kind, "message": message},
        }
    )


def decode_reply(line: bytes) -> Reply:
    """Decode one reply line; ControlError(kind="protocol" or "version_mismatch") if malformed."""
    try:
        data = _loads(line)
    except ProtocolError as exc:
        raise ControlError("protocol", f"reply: {exc.message}") from None
    if not isinstance(data, dict):
        raise ControlError("protocol", "reply is not a JSON object")
    version = data.get("version")
    if version != PROTOCOL_VERSION:
        raise ControlError(
            "version_mismatch",
            f"server replied with protocol version {version}, this client speaks version"
            f" {PROTOCOL_VERSION}",
        )
    reply_id = data.get("id")
    if reply_id is not None and not _is_int(reply_id):
        raise ControlError("protocol", "reply 'id' is not an integer")
    ok = data.get("ok")
    if ok is True:
        return Reply(reply_id, True, result=data.get("result"))
    if ok is not False:
        raise ControlError("protocol", "reply has no boolean 'ok'")
    error = data.get("error")
    if not isinstance(error, dict):
        raise ControlError("protocol", "error reply has no 'error' object")
    kind, message = error.get("kind"), error.get("message")
    if not isinstance(kind, str) or not isinstance(message, str):
        raise ControlError("protocol", "error reply lacks 'kind' or 'message' strings")
    return Reply(reply_id, False, kind=kind, message=message)
