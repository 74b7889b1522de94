"""What a run produced, baseline or member, in one shape the comparators read.

Both sides are read the same way: the baseline from the trace's records (export results, the
close record's output, the recorded imports), the member from its run (its results, its
captured output, the imports :class:`mighty.trace.TraceAnswers` saw). Tool calls are the
imports that ask the world something: code mode's ``mighty:sandbox/tools#call`` and an agent's
``send`` / ``ask``, each named and with canonical arguments so that equal calls compare equal
however they were spelled (``search("x")`` and ``search(query="x")``; JSON key order).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mighty._cbor import loads_untrusted

__all__ = ["Outcome", "ToolCall", "canonical_tool_args", "tool_calls_of"]

TOOLS = "mighty:sandbox/tools"
AGENT_HOST = "mighty:agent/host"
_MAX_BODY = 64 << 10
"""Largest message body decoded for display and canonical comparison (larger: compared raw)."""


@dataclass(frozen=True, slots=True, order=True)
class ToolCall:
    """One call to a tool: its name (``ask kv:1`` for an agent's ask) and canonical arguments
    (JSON text with sorted keys)."""

    name: str
    args: str

    def __str__(self) -> str:
        return f"{self.name}({self.args})"


@dataclass
class Outcome:
    """What one side of a cell produced.

    ``results``: one entry per export call, ``{"fn", "ok", "value"}`` or ``{"fn", "ok",
    "error"}``; ``stdout`` / ``stderr`` as text; ``messages``: what an agent sent, in order
    (``{"op", "to", "name", "body"}``); ``tool_calls`` in the order made; ``fuel`` and
    ``wall_time`` are figures only, never judged.
    """

    results: list[dict[str, Any]] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    fuel: int | None = None
    wall_time: float | None = None

    def value(self) -> Any:
        """The result value(s): the one call's value, or a list of every call's."""
        values = [
            r.get("value") if r.get("ok") else {"error": r.get("error")} for r in self.results
        ]
        return values[0] if len(values) == 1 else values

    def text(self, on: str) -> str:
        """``on``'s output as text, for text comparators (``result``: a string value as it is,
        anything else as canonical JSON)."""
        if on == "stdout":
            return self.stdout
        if on == "stderr":
            return self.stderr
        value = self.value()
        return value if isinstance(value, str) else dumps(value)


def dumps(value: Any) -> str:
    """Canonical JSON text of plain data (bytes as ``{"bytes": hex}``)."""
    return json.dumps(jsonable(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def jsonable(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON data: bytes as hex, tuples as lists, other objects by ``repr``."""
    if depth > 64:
        return "..."
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, bytes | bytearray):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, list | tuple):
        return [jsonable(v, depth + 1) for v in value]
    if isinstance(value, Mapping):
        if set(value) == {"name", "body"} and isinstance(value["body"], bytes | bytearray):
            # An agent message: its CBOR body shown decoded, so diffs read as data.
            return {"name": jsonable(value["name"], depth + 1), "body": _body(value["body"])}
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    case = getattr(value, "case", None)
    if isinstance(case, str):
        return {case: jsonable(getattr(value, "value", None), depth + 1)}
    kind = type(value).__name__
    if kind in ("Ok", "Err", "Some"):
        return {kind.lower(): jsonable(getattr(value, "value", None), depth + 1)}
    return repr(value)[:1000]


def canonical_tool_args(payload: Any, params: list[dict[str, Any]] | None = None) -> str:
    """Canonical arguments of a code-mode tool call from its JSON payload
    (``{"args": [...], "kwargs": {...}}``): positional arguments bound to their parameter names
    when the tool's parameters are known, then JSON with sorted keys. A payload that is not
    that JSON is kept as its text."""
    try:
        data = json.loads(bytes(payload)) if isinstance(payload, bytes | bytearray) else payload
    except (ValueError, UnicodeDecodeError, RecursionError):
        return repr(payload)[:4096]
    if not isinstance(data, dict):
        return dumps(data)
    args = data.get("args")
    kwargs = data.get("kwargs")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return dumps(data)
    bound = dict(kwargs)
    rest: list[Any] = []
    named = [
        p.get("name")
        for p in params or []
        if isinstance(p, dict) and p.get("kind") in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")
    ]
    for position, value in enumerate(args):
        if position < len(named) and isinstance(named[position], str):
            bound[str(named[position])] = value
        else:
            rest.append(value)
    return dumps({"args": rest, **bound} if rest else bound)


def tool_specs(list_tools_answer: Any) -> dict[str, list[dict[str, Any]]]:
    """Each tool's parameters from a ``list-tools`` answer (JSON text); {} when unreadable."""
    try:
        specs = json.loads(list_tools_answer) if isinstance(list_tools_answer, str) else None
    except (ValueError, RecursionError):
        return {}
    if not isinstance(specs, list):
        return {}
    out: dict[str, list[dict[str, Any]]] = {}
    for spec in specs:
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            params = spec.get("params")
            out[spec["name"]] = params if isinstance(params, list) else []
    return out


def _body(body: Any) -> Any:
    if isinstance(body, bytes | bytearray) and len(body) <= _MAX_BODY:
        try:
            return jsonable(loads_untrusted(bytes(body)))
        except Exception:  # noqa: BLE001 - a body that is not CBOR is compared as bytes
            return jsonable(body)
    return jsonable(body)


def _message(value: Any) -> tuple[str, Any]:
    if isinstance(value, Mapping):
        return str(value.get("name")), _body(value.get("body"))
    return repr(value)[:200], None


def tool_calls_of(
    imports: Iterable[tuple[str, str, Any]], specs: Mapping[str, list[dict[str, Any]]]
) -> tuple[list[ToolCall], list[dict[str, Any]]]:
    """The tool calls and the messages sent among ``(interface, function, args)`` imports."""
    calls: list[ToolCall] = []
    messages: list[dict[str, Any]] = []
    for interface, function, args in imports:
        if not isinstance(args, list | tuple):
            continue
        if interface == TOOLS and function == "call" and len(args) == 2:
            name = str(args[0])
            calls.append(ToolCall(name, canonical_tool_args(args[1], specs.get(name))))
        elif interface == AGENT_HOST and function in ("send", "ask") and len(args) >= 2:
            name, body = _message(args[1])
            to = str(args[0])
            messages.append({"op": function, "to": to, "name": name, "body": body})
            calls.append(ToolCall(f"{function} {to}", dumps({"name": name, "body": body})))
    return calls, messages
