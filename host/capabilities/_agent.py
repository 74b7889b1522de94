"""``mighty:agent/tools``: an agent calls the tools it was granted, through the gate.

The call takes code mode's path (:class:`mighty.sandbox.ToolHost`): the arguments are bounded
JSON bound to the tool's signature and validated, a sync tool runs on the bounded pool of tool
threads and an async one (every MCP tool) on the capability loop, each under its timeout, and
the result comes back as size-capped JSON. What differs is only what an agent may do that code
mode may not: a name it was not granted is an ``Err`` (``not_granted``) it can handle, not the
end of its message, since an agent outlives one mistake; and the call counters start again with
each guest call (each message) instead of each run.

The gate records every call (the name, the argument bytes, the result or error), so replay and
``mty eval`` answer tool calls from the trace with no tool or server running.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from mighty.abi import Err, Ok
from mighty.capabilities._mcp_client import McpUnavailable, _Loop
from mighty.capabilities._registry import CapabilityBroker
from mighty.gate import Binding, GuestContext, ResourceKind, Scope, Slot
from mighty.sandbox import Tool, ToolHost
from mighty.wasi import IDEMPOTENCY_KEYS

__all__ = ["AGENT_TOOLS", "MAX_TOOL_CALLS", "AgentTools", "AgentToolsProvider"]

INTERFACE = "mighty:agent/tools"
_MAX_KEYED = 1 << 20  # the tool host's own bound on a call's arguments
MAX_TOOL_CALLS = 1000
"""Most tool calls one message of an agent may make (past it the message fails)."""


@dataclass(eq=False)
class AgentTools:
    """One agent instance's tools: what it was granted, and the host that runs its calls."""

    broker: CapabilityBroker
    grants: frozenset[str]
    timeout: float = 60.0
    resolved: dict[str, Tool] = field(default_factory=dict)
    host: ToolHost | None = None
    scope: Scope | None = None

    def tool_host(self, scope: Scope) -> ToolHost:
        host = self.host
        if host is None:
            host = self.host = ToolHost(
                self.resolved,
                max_calls=MAX_TOOL_CALLS,
                timeout=self.timeout,
                background_loop=_Loop.get,
            )
        if scope is not self.scope:
            host.begin(None)  # a new guest call (message): its own counters
            self.scope = scope
        return host

    def close(self) -> None:
        if self.host is not None:
            self.host.close()
            self.host = None


AGENT_TOOLS: Slot[AgentTools] = Slot("agent.tools")
"""Filled by the runtime for each agent instance with the tools its type was granted."""


def _err(kind: str, message: str) -> Err:
    return Err({"kind": kind, "message": message[:16384]})


def _list(ctx: GuestContext) -> str:
    tools = ctx.find(AGENT_TOOLS)
    if tools is None:
        return "[]"
    return json.dumps(tools.broker.listing(tools.grants))


def _call(ctx: GuestContext, name: str, payload: bytes) -> Ok | Err:
    tools = ctx.find(AGENT_TOOLS)
    if len(name) > 256:
        return _err("not_granted", f"no tool is named by {len(name)} characters")
    if tools is None or not tools.broker.granted(tools.grants, name):
        return _err("not_granted", f"this agent was not granted a tool named {name!r}")
    tool = tools.resolved.get(name)
    if tool is None:
        try:
            # Waiting for a server's first start is host time, not the agent's (as a call is).
            with ctx.scope.paused():
                tool = tools.broker.resolve(name)
        except McpUnavailable as exc:
            return _err("unavailable", str(exc))
        tools.resolved[name] = tool
    payload = bytes(payload)
    keys = ctx.find(IDEMPOTENCY_KEYS)
    if keys is not None and "idempotency_key" in tool.signature.parameters:
        payload = _with_key(payload, keys.key())
    return tools.tool_host(ctx.scope).call(ctx, name, payload)


def _with_key(payload: bytes, key: str) -> bytes:
    """The call's arguments with ``idempotency_key`` set by the host (a durable agent's call
    to a tool that declares the parameter); arguments that do not decode go as they came (the
    tool host refuses them)."""
    if len(payload) > _MAX_KEYED:
        return payload
    try:
        decoded = json.loads(payload)
    except (ValueError, RecursionError):
        return payload
    if not isinstance(decoded, dict) or not isinstance(decoded.get("kwargs", {}), dict):
        return payload
    decoded.setdefault("kwargs", {})["idempotency_key"] = key
    return json.dumps(decoded).encode()


class AgentToolsProvider:
    """``mighty:agent/tools`` for the gate; each instance's grants are in :data:`AGENT_TOOLS`."""

    name = "agent.tools"

    def resources(self) -> Iterable[ResourceKind]:
        return ()

    def bindings(self) -> Iterable[Binding]:
        yield Binding(INTERFACE, "list-tools", _list)
        yield Binding(INTERFACE, "call", _call)

    def setup(self, ctx: GuestContext) -> None:
        return None

    def teardown(self, ctx: GuestContext) -> None:
        tools = ctx.find(AGENT_TOOLS)
        if tools is not None:
            tools.close()
