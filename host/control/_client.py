"""The control client: one request per connection, for ``mty`` subcommands and scripts."""

from __future__ import annotations

import itertools
import os
import socket
import time
from pathlib import Path
from typing import Any

from mighty.control._protocol import (
    ENV_VAR,
    MAX_REPLY,
    ControlError,
    LineBuffer,
    LineTooLong,
    decode_reply,
    encode_request,
)

__all__ = ["request"]

# Ids only need to be unique per connection; a process-wide counter also makes them unique
# in a server's log.
_ids = itertools.count(1)


def request(
    path: str | Path, op: str, args: dict[str, Any] | None = None, timeout: float = 30.0
) -> Any:
    """Send ``op`` with ``args`` to the control socket at ``path``; return the result.

    Raises :class:`ControlError`: the server's ``kind`` and message for an error reply;
    ``unavailable`` when there is no socket, nothing listens, or we may not connect;
    ``timeout`` when no reply comes within ``timeout`` seconds; ``protocol`` for a reply that is
    not one.
    """
    request_id = next(_ids)
    line = encode_request(request_id, op, args)
    deadline = time.monotonic() + timeout
    with _connect(Path(path), timeout) as sock:
        try:
            sock.sendall(line)
            reply_line = _read_line(sock, deadline)
        except TimeoutError:
            raise ControlError(
                "timeout", f"no reply to {op!r} from {path} within {timeout} seconds"
            ) from None
        except OSError as exc:
            raise ControlError(
                "unavailable", f"control connection to {path} failed: {exc}"
            ) from exc
    reply = decode_reply(reply_line)
    if not reply.ok:
        raise ControlError(reply.kind, reply.message)
    if reply.id != request_id:
        raise ControlError("protocol", f"reply id {reply.id} does not match request {request_id}")
    return reply.result


def _connect(path: Path, timeout: float) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(os.fspath(path))
    except FileNotFoundError:
        sock.close()
        raise ControlError(
            "unavailable",
            f"no control socket at {path}; is `mty run` running with {ENV_VAR} set to it?",
        ) from None
    except ConnectionRefusedError:
        sock.close()
        raise ControlError(
            "unavailable",
            f"nothing is listening on {path}; the run that made it has stopped",
        ) from None
    except PermissionError:
        sock.close()
        raise ControlError(
            "unavailable", f"not permitted to connect to {path}; it belongs to another user"
        ) from None
    except TimeoutError:
        sock.close()
        raise ControlError("timeout", f"connecting to {path} timed out") from None
    except OSError as exc:
        sock.close()
        raise ControlError("unavailable", f"cannot connect to {path}: {exc}") from exc
    return sock


def _read_line(sock: socket.socket, deadline: float) -> bytes:
    buffer = LineBuffer(MAX_REPLY)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        sock.settimeout(remaining)
        data = sock.recv(65536)
        if not data:
            raise ControlError(
                "protocol", "the server closed the connection without a complete reply"
            )
        try:
            lines = buffer.feed(data)
        except LineTooLong:
            raise ControlError("protocol", f"reply is longer than {MAX_REPLY} bytes") from None
        for line in lines:
            if line.strip():
                return line
