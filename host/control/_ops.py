"""The ops a running system serves on the control socket: ``inspect``, ``top``, ``send``,
``ask`` (every runtime: `mty run` and `mty node`), ``status``, ``reload``.

``send`` and ``ask`` put one message into an agent's mailbox from outside (`mty send`, `mty ask`:
try a swapped version on a running system without restarting it); the sender is the host, as
for a manifest's ``[[start]]`` messages, and a body is JSON (CBOR-encoded for the agent as the
start messages' are). An ask's reply comes back as JSON (bytes as ``{"bytes": base64}``).
Rejected: a separate socket or HTTP port for messages (one socket, one permission model: the
control socket is the owner's, mode 0600).

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

__all__ = ["MAX_ADDRESS", "MAX_ASK_TIMEOUT", "UnknownAgent", "application_ops", "runtime_ops"]

MAX_ADDRESS = 256
"""Longest agent address or name (or message name) a request may carry."""

MAX_ASK_TIMEOUT = 3600.0
"""Longest an ``ask`` (or a ``send`` waiting for mailbox room) may be told to wait, seconds."""


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

    def send(args: dict[str, Any]) -> Any:
        to, name, body, timeout = _message(args, "send")
        from mighty.agents import NoProc

        try:
            runtime.send(to, name, body, timeout=5.0 if timeout is None else timeout)
        except NoProc as exc:
            raise UnknownAgent(exc.message) from None
        return {"to": to, "message": name, "sent": True}

    def ask(args: dict[str, Any]) -> Any:
        to, name, body, timeout = _message(args, "ask")
        from mighty.agents import NoProc

        try:
            reply = runtime.ask(to, name, body, timeout=timeout)
        except NoProc as exc:
            raise UnknownAgent(exc.message) from None
        # Imported here: the control layer loads no runtime itself.
        from mighty.agents.hosting import jsonable

        return {"to": to, "message": name, "reply": jsonable(reply)}

    return {"inspect": inspect, "top": top, "send": send, "ask": ask}


def _message(args: dict[str, Any], op: str) -> tuple[str, str, Any, float | None]:
    """``send``/``ask`` arguments checked: ``to`` and ``message`` (1..MAX_ADDRESS chars),
    ``body`` (any JSON, default null), ``timeout`` (seconds, optional)."""
    unknown = set(args) - {"to", "message", "body", "timeout"}
    if unknown:
        raise BadInput(f"{op} takes to, message, body and timeout, not {sorted(unknown)}")
    to, name = args.get("to"), args.get("message")
    for field, value in (("to", to), ("message", name)):
        if not isinstance(value, str) or not value or len(value) > MAX_ADDRESS:
            raise BadInput(f"{op} {field!r} must be a string of 1..{MAX_ADDRESS} chars")
    timeout = args.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not 0 < timeout <= MAX_ASK_TIMEOUT
    ):
        raise BadInput(f"{op} 'timeout' must be a number of seconds in (0, {MAX_ASK_TIMEOUT:g}]")
    assert isinstance(to, str)
    assert isinstance(name, str)
    return to, name, args.get("body"), None if timeout is None else float(timeout)


def application_ops(app: Application) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """What `mty run` serves for ``app``: ``inspect`` and ``top`` (see :func:`runtime_ops`;
    with the ``[http]`` front serving, under ``http`` its requests in flight and per-route
    counts), ``status`` (the run summary so far) and ``reload`` (a hot swap, for
    `mty reload`)."""
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

    ops = runtime_ops(runtime)
    inspect, top = ops["inspect"], ops["top"]

    def with_http(op: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], Any]:
        # The [http] front's requests in flight and per-route counts, beside the agents.
        def answer(args: dict[str, Any]) -> Any:
            result = op(args)
            front = app.http
            if front is not None and "agent" not in args:
                result = {**result, "http": front.snapshot()}
            return result

        return answer

    return {
        **ops,
        "reload": reload,
        "status": status,
        "inspect": with_http(inspect),
        "top": with_http(top),
    }
