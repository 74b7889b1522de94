"""The runtime's introspection ops on the control socket: ``inspect`` and ``top``.

Each op validates its arguments (a control request is untrusted input: bounded, typed) and
calls the Python API (``Runtime.inspect``, ``Runtime.top``); the control layer does no work the
API cannot do. Replies are the snapshots themselves, which carry ``version``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mighty._errors import BadInput

if TYPE_CHECKING:
    from mighty.agents import Runtime

__all__ = ["MAX_ADDRESS", "UnknownAgent", "runtime_ops"]

MAX_ADDRESS = 256
"""Longest agent address or name an ``inspect`` request may carry."""


class UnknownAgent(BadInput):
    """``inspect`` named no live agent (unknown, or dead)."""

    kind = "noproc"


def runtime_ops(runtime: Runtime) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """The ``inspect`` and ``top`` handlers for a ControlServer serving ``runtime``."""

    def inspect(args: dict[str, Any]) -> Any:
        unknown = set(args) - {"agent"}
        if unknown:
            raise BadInput(f"inspect takes only 'agent', not {sorted(unknown)}")
        agent = args.get("agent")
        if agent is None:
            return runtime.inspect()
        if not isinstance(agent, str) or not agent or len(agent) > MAX_ADDRESS:
            raise BadInput(f"inspect 'agent' must be an address or name of 1..{MAX_ADDRESS} chars")
        from mighty.agents import NoProc

        try:
            return runtime.inspect(agent)
        except NoProc as exc:
            raise UnknownAgent(exc.message) from None

    def top(args: dict[str, Any]) -> Any:
        if args:
            raise BadInput(f"top takes no arguments, not {sorted(args)}")
        return runtime.top()

    return {"inspect": inspect, "top": top}
