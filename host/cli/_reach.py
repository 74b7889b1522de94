"""`mty node`'s first step: is a NATS server there at all, before a minute of builds?

`mty node` used to build and compile every agent type (about a minute) and only then connect,
to find NATS down: ten connect errors from the client and a message whose reason was empty.
Now each configured server gets a TCP connect and must send the NATS greeting (an ``INFO``
line, which a NATS server sends first on every connection, TLS or not); when none does, the
command stops at once naming each server and what happened there.

Rejected: connecting the real client first (nats-py retries and logs each failure itself, and
its error for a refused connection has an empty text: the message this replaces); checking
only the TCP port (a wrong port held by another service would pass and fail later).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

__all__ = ["check_nats_reachable"]

_DEFAULT_PORT = 4222
_GREETING = b"INFO "


def _probe(url: str, timeout: float) -> str | None:
    """None when a NATS server answers at ``url``, else why not (one short phrase)."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    try:
        port = parts.port or _DEFAULT_PORT
    except ValueError:
        return "the port is not a number"
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            head = b""
            while len(head) < len(_GREETING):
                chunk = conn.recv(len(_GREETING) - len(head))
                if not chunk:
                    break
                head += chunk
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except socket.gaierror as exc:
        return f"cannot resolve {host}: {exc.strerror or exc}"
    except OSError as exc:
        return exc.strerror.lower() if exc.strerror else type(exc).__name__
    if head != _GREETING:
        return "something answered, but not a NATS server (no INFO greeting)"
    return None


def check_nats_reachable(servers: Sequence[str], timeout: float = 5.0) -> None:
    """Return when at least one of ``servers`` is a NATS server that answers; else raise
    :class:`ClusterError` naming each server and why it did not."""
    from mighty.cluster import ClusterError  # lazily: `mty --version` need not import NATS

    reasons: list[str] = []
    for url in servers:
        reason = _probe(url, timeout)
        if reason is None:
            return
        reasons.append(f"{url}: {reason}")
    raise ClusterError(
        "cannot join the cluster: no NATS server answered ("
        + "; ".join(reasons)
        + "). Start one (nats-server -js) or pass --server nats://HOST:PORT"
    )
