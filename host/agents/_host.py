"""The host side of ``mighty:agent/host``: what an agent's guest calls (send, ask, spawn,
log, emit, its own address), each checked against its type's grants.

One provider serves every agent of a runtime; the agent an instance serves is in its
:data:`AGENT_PROCESS` slot. A guest's ``ask`` is an :class:`~mighty.agents.Ask` given to
``Runtime.request``, the same path a host ask takes, with the asking call's scope as what it
waits through (so the asker's deadline, cancel and signals apply while it waits; its run
context reaches the target through the current context, see mighty.budget).

Rejected: the closure the guest's ask used to hand the runtime to wait with (a second ask path
that had drifted: it checked the asker's scope where the host's did not), and keeping this
module inside ``_runtime.py`` (1,950 lines holding the process, the turn, the ask and this).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import cbor2

from mighty._cbor import loads_untrusted
from mighty._errors import HostError
from mighty.abi import Err, Ok, Variant
from mighty.agents._introspect import INSPECT
from mighty.agents._timers import TIMERS, BadTimer
from mighty.agents._types import AgentError, Ask, AskTimeout
from mighty.budget import CallScope
from mighty.gate import Binding, GuestContext, ResourceKind, Scope, Slot

if TYPE_CHECKING:
    from mighty.agents._process import AgentProcess
    from mighty.agents._runtime import Runtime

__all__ = ["AGENT_PROCESS", "AgentHostProvider"]

_INTERFACE = "mighty:agent/host"

AGENT_PROCESS: Slot[AgentProcess] = Slot("agent.process")
"""The agent an instance serves (``AgentProcess.seed`` fills it)."""


def _process(ctx: GuestContext) -> AgentProcess:
    process = ctx.find(AGENT_PROCESS)
    if process is None:
        raise HostError("mighty:agent/host called by an instance that is not an agent")
    return process


_HERE_GRACE = 0.5
"""How far past the asker's own deadline the target's turn may end when a guest's ask without
a timeout of its own runs it in place (so that equal budgets qualify)."""


def _guest_ask_wait(scope: Scope, requested: float) -> tuple[float, float]:
    """(how long a guest's ask waits, how long the target's turn may take in place).

    An asking agent waits no longer than its own deadline (its wait stops there anyway): a
    ``timeout`` at or beyond it (the SDK's default, none, sends the most ``timeout-ms`` holds)
    is cut to it, and the target's turn may then run in place if its budget ends within
    :data:`_HERE_GRACE` of that deadline (the asker stops when the turn returns, its deadline
    passed). A shorter ``timeout`` is the asker's own: the turn runs in place only when it ends
    within it, otherwise a worker runs it and the asker stops waiting at its timeout.
    """
    # ``type() is``, not isinstance: Scope is an ABC, whose isinstance is a Python frame. A
    # paused scope's deadline is where it stood when the pause began: the wait is shorter then.
    if type(scope) is not CallScope:
        return requested, requested
    left = max(0.0, scope.deadline - time.monotonic())
    if requested < left:
        return requested, requested
    return left, left + _HERE_GRACE


_ANY = frozenset({"*"})


def _listed(names: frozenset[str]) -> str:
    return ", ".join(sorted(names)) or "none"


def _target(runtime: Runtime, to: str) -> tuple[str | None, str | None]:
    """The agent type and registered name behind address ``to`` (None where not known)."""
    address = runtime.whereis(to)
    name = to if address is not None else None
    address = address or to
    parts = address.split(":")
    if len(parts) >= 2 and parts[-1].isdigit():
        return parts[-2], name
    return None, name


def _may_message(runtime: Runtime, process: AgentProcess, to: str, message: str) -> Err | None:
    """None when ``process`` may send ``message`` to ``to``; the refusal otherwise."""
    grants = process.type.grants
    agent_type, name = _target(runtime, to)
    if not grants.may_message(agent_type, name if name is not None else to):
        return Err(
            Variant(
                "refused",
                f"{process.address} may not message {to[:200]!r} (its type "
                f"{process.type.name!r} is granted messages to: {_listed(grants.message)})",
            )
        )
    if message == INSPECT and not (runtime.introspect is False or grants.may_inspect(agent_type)):
        return Err(
            Variant(
                "refused",
                f"{process.address} may not inspect {to[:200]!r} (its type "
                f"{process.type.name!r} is granted inspect of: {_listed(grants.inspect)})",
            )
        )
    return None


def _agent_error(exc: AgentError) -> Err:
    if isinstance(exc, AskTimeout):
        return Err(Variant("timeout"))
    return Err(Variant(exc.code, exc.message))


_MAX_NAME = 1024


def _refused(why: str) -> Err:
    return Err(Variant("refused", why))


def _timer_ask(runtime: Runtime, process: AgentProcess, name: str, body: bytes) -> Any:
    """A guest's ask to the host's :data:`TIMERS` address: ``after`` sets a timer
    (``{delay, to, name, body, every}``; the reply is its id), ``cancel`` one of its own
    (``{id}``; the reply says whether it was pending). Checked as the send it schedules is."""
    try:
        request = loads_untrusted(body) if body else None
    except (ValueError, cbor2.CBORDecodeError) as exc:
        return _refused(f"a timer request must be a CBOR map: {exc}")
    if not isinstance(request, dict):
        return _refused("a timer request must be a CBOR map")
    if name == "cancel":
        timer_id = request.get("id")
        if isinstance(timer_id, bool) or not isinstance(timer_id, int):
            return _refused("cancel takes {id: int}")
        cancelled = runtime.cancel_timer_of(timer_id, process.address)
        return Ok({"name": "reply", "body": cbor2.dumps(cancelled)})
    if name != "after":
        return _refused(f"{TIMERS} takes 'after' and 'cancel', not {name[:100]!r}")
    to, message, payload = request.get("to"), request.get("name"), request.get("body", b"")
    if not (isinstance(to, str) and 0 < len(to) <= _MAX_NAME):
        return _refused("after: 'to' must be an address or a name")
    if not (isinstance(message, str) and 0 < len(message) <= _MAX_NAME):
        return _refused("after: 'name' must be a message name")
    if not isinstance(payload, bytes):
        return _refused("after: 'body' must be the message's CBOR bytes")
    denied = _may_message(runtime, process, to, message)
    if denied is not None:
        return denied
    try:
        timer_id = runtime.set_timer(
            request.get("delay"),
            to,
            message,
            payload,
            sender=process.address,
            every=request.get("every"),
        )
    except BadTimer as exc:
        return _refused(exc.message)
    return Ok({"name": "reply", "body": cbor2.dumps(timer_id)})


class AgentHostProvider:
    """The host side of ``mighty:agent/host``, bound to one runtime."""

    name = "agent"
    type_interfaces = ("mighty:agent/types",)

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def resources(self) -> list[ResourceKind]:
        return []

    def setup(self, ctx: GuestContext) -> None:
        return None

    def bindings(self) -> list[Binding]:
        runtime = self.runtime

        def self_address(ctx: GuestContext) -> str:
            return _process(ctx).address

        def send_raw(ctx: GuestContext, to: str, msg: dict[str, Any]) -> Any:
            process = _process(ctx)
            denied = _may_message(runtime, process, to, msg["name"])
            if denied is not None:
                return denied
            try:
                runtime.send_raw(to, msg["name"], bytes(msg["body"]), sender=process.address)
            except AgentError as exc:
                return _agent_error(exc)
            return Ok(None)

        request = runtime.request

        def ask(ctx: GuestContext, to: str, msg: dict[str, Any], timeout_ms: int) -> Any:
            process = ctx.find(AGENT_PROCESS)  # _process, inline: a frame less a guest's ask
            if process is None:
                return _process(ctx)  # raises
            if to == TIMERS:
                return _timer_ask(runtime, process, msg["name"], bytes(msg["body"]))
            grants = process.type.grants
            if grants.message != _ANY or msg["name"] == INSPECT:
                denied = _may_message(runtime, process, to, msg["name"])
                if denied is not None:
                    return denied
            current = process.current
            chain = (*(current.asker_chain if current is not None else ()), process.address)
            scope = ctx.scope
            timeout, within = _guest_ask_wait(scope, timeout_ms / 1000)
            try:
                # Waits through the call's scope: the asking agent's own deadline and
                # cancellation apply while it waits.
                reply = request(
                    Ask(
                        to,
                        msg["name"],
                        bytes(msg["body"]),
                        process.address,
                        timeout,
                        chain,
                        scope,
                        within,
                    )
                )
            except AgentError as exc:
                if isinstance(exc, AskTimeout):
                    scope.checkpoint()  # the asker's own deadline passed: that is what stops it
                return _agent_error(exc)
            return Ok({"name": "reply", "body": reply or b""})

        def spawn(ctx: GuestContext, agent_type: str, init: bytes) -> Any:
            process = _process(ctx)
            if not process.type.grants.may_spawn(agent_type):
                return Err(
                    Variant(
                        "refused",
                        f"{process.address} may not spawn agents of type {agent_type[:100]!r}"
                        f" (its type {process.type.name!r} is granted spawn of: "
                        f"{_listed(process.type.grants.spawn)})",
                    )
                )
            try:
                return Ok(
                    runtime.spawn_process(agent_type, bytes(init), parent=process.address).address
                )
            except AgentError as exc:
                return _agent_error(exc)

        def log(ctx: GuestContext, level: str, text: str) -> None:
            process = _process(ctx)
            level, text = level[:16], text[:8192]
            runtime.emit("log", process.address, {"level": level, "text": text})
            runtime.output(process, "log", text, level)

        def emit(ctx: GuestContext, name: str, body: bytes) -> None:
            try:
                raw = bytes(body)
                data = loads_untrusted(raw) if raw else None
            except (ValueError, cbor2.CBORDecodeError):
                data = bytes(body)
            runtime.emit(f"agent.{name[:64]}", _process(ctx).address, {"body": data})

        return [
            Binding(_INTERFACE, "self-address", self_address),
            Binding(_INTERFACE, "send", send_raw),
            Binding(_INTERFACE, "ask", ask),
            Binding(_INTERFACE, "spawn", spawn),
            Binding(_INTERFACE, "log", log),
            Binding(_INTERFACE, "emit", emit),
        ]
