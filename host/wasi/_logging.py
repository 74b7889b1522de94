"""``wasi:logging/logging``: ``log(level, context, message)``, through the gate like every import
(so recorded and replayed like every import).

Where a line goes: to the sink the embedder put in the instance's slot
:data:`LOG_SINK` (the agent runtime routes it to the agent's log: ``mty run``'s stderr, the
agent's output tail, and OpenTelemetry log records when telemetry is on); without one, to the
Python logger ``mighty.guest`` as one structured line, ``[level] context: message`` (warn and
above reach stderr through logging's default handler). Context and message are bounded
(``MAX_CONTEXT``, ``MAX_MESSAGE`` characters) before anything sees them.

Rejected: writing the line into the guest's stderr capture. Those bytes are the guest's own
output, which replay rebuilds from recorded stream writes only; a host-made line there would
make a trace replay differently from how it ran.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mighty.gate import Binding, GuestContext, ResourceKind, Slot
from mighty.wasi._policy import Policy

__all__ = ["LEVELS", "LOG_SINK", "MAX_CONTEXT", "MAX_MESSAGE", "LogSink", "bindings"]

LEVELS = ("trace", "debug", "info", "warn", "error", "critical")
MAX_CONTEXT = 256
MAX_MESSAGE = 8192

_guest_log = logging.getLogger("mighty.guest")
_PY_LEVEL = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

LogSink = Callable[[str, str, str], None]
"""``sink(level, context, message)``: one wasi:logging line (already bounded)."""
LOG_SINK: Slot[LogSink] = Slot("wasi.logging.sink")
"""The slot of an instance's ``LogSink`` (seed it: ``Instance(slots=[LOG_SINK.of(sink)])``)."""


def resources() -> list[ResourceKind]:
    """None: wasi:logging has no resources."""
    return []


def setup(ctx: GuestContext, policy: Policy) -> None:
    """Nothing per instance: the sink, if any, was seeded into its slot."""


def _log(ctx: GuestContext, level: str, context: str, message: str) -> None:
    level = level if level in LEVELS else "info"
    context, message = context[:MAX_CONTEXT], message[:MAX_MESSAGE]
    sink = ctx.find(LOG_SINK)
    if sink is not None:
        sink(level, context, message)
        return
    if context:
        _guest_log.log(_PY_LEVEL[level], "[%s] %s: %s", level, context, message)
    else:
        _guest_log.log(_PY_LEVEL[level], "[%s] %s", level, message)


def bindings() -> list[Binding]:
    """The one function of wasi:logging/logging."""
    return [Binding("wasi:logging/logging", "log", _log)]
