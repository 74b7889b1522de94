"""``mighty:agent/debug``: the guest's source positions, served by every gate and seen by no hook.

The agent SDK asks ``positions()`` once per instance; when it answers true, the SDK calls
``at(file, line, function)`` with its caller's Python frame before each import it makes, and
the recorder writes that position into the next import record as a side field the replayer
does not compare (docs/debugging.md, host/trace/_recorder.py).

Both bindings are ``hooked=False``: no recorder, replayer or journal sees them, so they take no
step of a trace and replay needs no record of them. What they answer comes from the context's
hooks (the :class:`~mighty.gate.CallHook` protocol's optional members):

- ``positions()`` is true when the instance has hooks and every one says ``keeps_positions``
  (a recorder asked to keep them; a replayer of a trace recorded with them). The guest's
  work differs with the answer (it looks up frames and calls ``at``), and fuel with it, so a
  replay must answer what the recording answered: it does, from the trace's instance record.
  A hook that does not say (a durable agent's journal, an evaluation's answering hook) makes
  it false, whatever the others say, so no such pair can disagree.
- ``at`` hands the position to every hook with ``take_position(file, line, function)``, after
  cutting it to ``MAX_FILE``/``MAX_FUNCTION`` characters (a hostile guest passes what it likes;
  the recorder bounds the total as well).

Rejected: recording ``at`` as an ordinary import (replay would then compare the positions, and
a trace recorded with them would not replay on an instance that asks differently); carrying
positions in existing imports' arguments (they are compared); a provider registered by each
runtime (every gate that runs an agent component would have to know of it, replay's and
evaluation's too: an import nobody provides fails the link).
"""

from __future__ import annotations

from typing import Any

from mighty.gate._context import Binding, GuestContext, ResourceKind

__all__ = ["INTERFACE", "MAX_FILE", "MAX_FUNCTION", "SourceProvider", "bounded_position"]

INTERFACE = "mighty:agent/debug"
MAX_FILE = 160
"""Most characters of a file name kept (its end: the base name matters most)."""
MAX_FUNCTION = 80
"""Most characters of a function name kept."""
_MAX_LINE = 0xFFFFFFFF


def bounded_position(file: Any, line: Any, function: Any) -> tuple[str, int, str] | None:
    """``(file, line, function)`` cut to the bounds, or None when it is not that shape."""
    if type(file) is not str or type(line) is not int or type(function) is not str:
        return None
    if len(file) > MAX_FILE:
        file = "..." + file[-(MAX_FILE - 3) :]
    if len(function) > MAX_FUNCTION:
        function = function[: MAX_FUNCTION - 3] + "..."
    return file, min(max(line, 0), _MAX_LINE), function


def _positions(ctx: GuestContext) -> bool:
    hooks = ctx.hooks
    return bool(hooks) and all(getattr(hook, "keeps_positions", False) for hook in hooks)


def _at(ctx: GuestContext, file: str, line: int, function: str) -> None:
    position = None
    for hook in ctx.hooks:
        take = getattr(hook, "take_position", None)
        if take is not None:
            if position is None:
                position = bounded_position(file, line, function)
                if position is None:
                    return
            take(*position)


class SourceProvider:
    """The host side of ``mighty:agent/debug`` (every :class:`~mighty.gate.Gate` has one)."""

    name = "debug"

    def resources(self) -> list[ResourceKind]:
        return []

    def bindings(self) -> list[Binding]:
        return [
            Binding(INTERFACE, "positions", _positions, hooked=False),
            Binding(INTERFACE, "at", _at, hooked=False),
        ]

    def setup(self, ctx: GuestContext) -> None:
        return None
