"""The ops a running system serves on the control socket: ``inspect``, ``top``, ``status``,
``reload``.

Each op validates its arguments (a control request is untrusted input: bounded, typed) and
calls the Python API (``Runtime.inspect``, ``Runtime.top``); the control layer does no work the
API cannot do. Replies are the snapshots themselves, which carry ``version``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mighty._errors import BadInput

if TYPE_CHECKING:
    from mighty.agents import Application, Runtime

__all__ = ["MAX_ADDRESS", "UnknownAgent", "application_ops", "runtime_ops"]

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
        # Here, not at the top: the control client (`mty inspect`, `mty top`) imports this
        # package and must not load the runtime and wasmtime to send one request.
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


def application_ops(app: Application) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """What `mty run` serves for ``app``: ``inspect`` and ``top`` (see :func:`runtime_ops`),
    ``status`` (the run summary so far) and ``reload`` (a hot swap, for `mty reload`)."""
    runtime = app.runtime

    def reload(args: dict[str, Any]) -> Any:
        agent_type, component = args.get("agent_type"), args.get("component")
        if not isinstance(agent_type, str) or not isinstance(component, str):
            raise BadInput("reload takes {agent_type: str, component: path}")
        timeout = args.get("drain_timeout", 5.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
            raise BadInput("reload's drain_timeout must be a number of seconds >= 0")
        return runtime.reload(agent_type, component, drain_timeout=float(timeout)).to_json()

    def status(_args: dict[str, Any]) -> Any:
        return app.summary()

    return {"reload": reload, "status": status, **runtime_ops(runtime)}
