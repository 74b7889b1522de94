"""The capability registry: named host tools, MCP servers and HTTP grants, declared as data and
granted to agent types by name; and the broker that turns a grant into callable tools.

Three kinds, one shape. A capability has a name and a kind:

- a **host tool** (:class:`HostTool`): a Python callable, or ``"module:function"`` imported
  when the registry is loaded; its signature and docstring are what the agent sees, and its
  arguments are validated against its type hints (code mode's :class:`mighty.sandbox.Tool`);
- an **MCP server** (:class:`McpServer`): every tool it lists, or those named in its ``tools``;
- **HTTP grants** (:class:`HttpCapability`): origins with their methods and secrets, merged into
  the agent's WASI HTTP policy (the same grants ``Policy.with_http`` makes).

A grant names capabilities: ``"lookup"`` (a host tool), ``"files"`` (all the tools of MCP
server ``files`` the registry offers), ``"files.read"`` (one of them), ``"github"`` (HTTP).
Nothing is granted by default. The names a guest calls are the grant's: ``lookup``,
``files.read``.

Rejected:
- Grants as objects in each agent type (a tool function inside ``AgentType``): a manifest
  could not name them, ``mty capabilities`` could not list them, and two agent types granted one
  MCP server would start it twice. The registry holds one of each; types hold names.
- Letting an agent call any tool of a granted MCP server by default when only some are named:
  ``files.read`` grants reading, not writing, of the same server.
"""

from __future__ import annotations

import importlib
import inspect
import keyword
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mighty._errors import BadInput
from mighty.capabilities._mcp_client import (
    McpClient,
    McpServer,
    McpToolInfo,
    McpUnavailable,
)
from mighty.sandbox import Tool
from mighty.wasi import HttpGrant

__all__ = [
    "Capabilities",
    "CapabilityBroker",
    "HostTool",
    "HttpCapability",
    "InvalidMcpArguments",
    "mcp_tool",
    "mcp_tools",
]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


@dataclass(frozen=True)
class HostTool:
    """A Python callable offered as a tool: ``target`` is the callable or ``"module:function"``
    (imported from ``base``, the manifest's directory, first)."""

    name: str
    target: Callable[..., Any] | str
    timeout: float | None = None

    def load(self, base: Path | None = None) -> Tool:
        """The :class:`Tool` (imports the target when it is a ``module:function`` string)."""
        fn = self.target
        if isinstance(fn, str):
            fn = _import_target(fn, base, f"capability {self.name}")
        if not _identifier(self.name):
            raise BadInput(f"host tool name {self.name!r} is not a Python identifier")
        return Tool(fn, self.name, self.timeout)


@dataclass(frozen=True)
class HttpCapability:
    """Named HTTP grants: granting ``name`` adds them to the agent's HTTP policy."""

    name: str
    grants: tuple[HttpGrant, ...]


Capability = HostTool | McpServer | HttpCapability


def _identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")


_IMPORT_LOCK = threading.Lock()


def _import_target(spec: str, base: Path | None, what: str) -> Callable[..., Any]:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise BadInput(f"{what}: {spec!r} is not module:function")
    with _IMPORT_LOCK:
        added = base is not None and str(base) not in sys.path
        if added:
            sys.path.insert(0, str(base))
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise BadInput(f"{what}: cannot import {module_name!r}: {exc}") from None
        finally:
            if added:
                sys.path.remove(str(base))
    fn: Any = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise BadInput(f"{what}: {module_name!r} has no {attr!r}")
    if not callable(fn):
        raise BadInput(f"{what}: {spec!r} is not callable")
    return fn  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Capabilities:
    """What exists, by name (see the module). Frozen: each ``with_*`` returns a copy."""

    declared: Mapping[str, Capability] = field(default_factory=dict)

    def _with(self, name: str, capability: Capability) -> Capabilities:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise BadInput(
                f"capability name {name!r}: letters, digits, '_' and '-', at most 64,"
                " not starting with a digit or '-'"
            )
        if name in self.declared:
            raise BadInput(f"two capabilities are named {name!r}")
        return Capabilities({**self.declared, name: capability})

    def with_tool(
        self, name: str, target: Callable[..., Any] | str, *, timeout: float | None = None
    ) -> Capabilities:
        """Add a host tool."""
        tool = HostTool(name, target, timeout)
        if not _identifier(name):
            raise BadInput(f"host tool name {name!r} is not a Python identifier")
        return self._with(name, tool)

    def with_mcp(self, server: McpServer) -> Capabilities:
        """Add an MCP server (named by ``server.name``)."""
        return self._with(server.name, server)

    def with_http(self, name: str, *grants: HttpGrant) -> Capabilities:
        """Add named HTTP grants."""
        if not grants:
            raise BadInput(f"HTTP capability {name!r} grants no origin")
        return self._with(name, HttpCapability(name, tuple(grants)))

    def check(self, granted: Iterable[str], who: str) -> frozenset[str]:
        """``granted`` as a frozenset, every name checked against the registry."""
        names = frozenset(granted)
        for name in names:
            self.kind_of(name, who)
        return names

    def kind_of(self, name: str, who: str = "a grant") -> str:
        """``tool``, ``mcp``, ``mcp-tool`` or ``http``; BadInput for a name not declared."""
        if not isinstance(name, str):
            raise BadInput(f"{who}: capability names are strings, got {type(name).__name__}")
        capability = self.declared.get(name)
        if isinstance(capability, HostTool):
            return "tool"
        if isinstance(capability, McpServer):
            return "mcp"
        if isinstance(capability, HttpCapability):
            return "http"
        server, dot, tool = name.partition(".")
        found = self.declared.get(server)
        if dot and isinstance(found, McpServer):
            if found.tools is not None and tool not in found.tools:
                raise BadInput(f"{who}: MCP server {server} does not offer {tool!r}")
            return "mcp-tool"
        known = ", ".join(sorted(self.declared)) or "none are declared"
        raise BadInput(f"{who}: no capability named {name!r} (declared: {known})")

    def http_grants(self, granted: Iterable[str]) -> tuple[HttpGrant, ...]:
        """The HTTP grants among ``granted``, in a stable order."""
        found: list[HttpGrant] = []
        for name in sorted(granted):
            capability = self.declared.get(name)
            if isinstance(capability, HttpCapability):
                found.extend(capability.grants)
        return tuple(found)

    def describe(self) -> list[dict[str, Any]]:
        """Each capability as plain data (for ``mty capabilities``): never a secret's value."""
        out: list[dict[str, Any]] = []
        for name, capability in sorted(self.declared.items()):
            if isinstance(capability, HostTool):
                target = capability.target
                shown = target if isinstance(target, str) else _qualname(target)
                out.append({"name": name, "kind": "tool", "target": shown})
            elif isinstance(capability, McpServer):
                item: dict[str, Any] = {"name": name, "kind": "mcp"}
                if capability.command:
                    item["command"] = list(capability.command)
                else:
                    item["url"] = capability.url
                if capability.tools is not None:
                    item["tools"] = sorted(capability.tools)
                out.append(item)
            else:
                origins = [str(g.origin) for g in capability.grants]
                out.append({"name": name, "kind": "http", "origins": origins})
        return out


def _qualname(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", "?")
    return f"{module}:{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}"


# -- MCP tools as Tools ---------------------------------------------------------------------

_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


def _python_name(name: str) -> str:
    text = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not text or text[0].isdigit() or keyword.iskeyword(text):
        text = f"t_{text}"
    return text.lstrip("_") or "tool"


def mcp_tool(client: McpClient, info: McpToolInfo, name: str | None = None) -> Tool:
    """An MCP server's tool as a :class:`mighty.sandbox.Tool`: a Python signature made from
    its input schema (keyword parameters, required ones without a default), validated against
    the schema with ``jsonschema`` before the server is called."""
    from jsonschema.validators import validator_for  # type: ignore[import-untyped]

    schema = dict(info.input_schema)
    validator = validator_for(schema)(schema)
    found = schema.get("properties")
    properties: dict[str, Any] = found if isinstance(found, dict) else {}
    required = set(schema.get("required") or ())
    params: list[inspect.Parameter] = []
    renamed: dict[str, str] = {}
    for prop, spec in properties.items():
        pname = _python_name(prop) if not _identifier(prop) else prop
        if pname in renamed:
            continue
        renamed[pname] = prop
        declared = spec.get("type") if isinstance(spec, dict) else None
        kind = _JSON_TYPES.get(declared) if isinstance(declared, str) else None
        annotation = kind if kind is not None else Any
        default = inspect.Parameter.empty if prop in required else None
        params.append(
            inspect.Parameter(
                pname,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=default,
                annotation=annotation,
            )
        )
    params.sort(key=lambda p: p.default is not inspect.Parameter.empty)
    tool_name = name or _python_name(info.name)

    async def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        arguments = {renamed[k]: v for k, v in bound.arguments.items() if v is not None}
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            raise InvalidMcpArguments(f"{info.name}: {errors[0].message}"[:2048])
        return await client.acall(info.name, arguments)

    signature = inspect.Signature(params)
    call.__signature__ = signature  # type: ignore[attr-defined]
    call.__name__ = tool_name
    call.__qualname__ = tool_name
    call.__doc__ = info.description or f"{info.name} of MCP server {client.server.name}"
    # No type hints: the schema validates (a hint of `float` would turn 1 into 1.0 first).
    call.__annotations__ = {}
    return Tool(call, tool_name, client.server.timeout)


class InvalidMcpArguments(BadInput):
    """The arguments do not match the MCP tool's input schema (checked before the call)."""


def mcp_tools(
    client: McpClient | McpServer,
    *,
    only: Iterable[str] | None = None,
    prefix: str = "",
    timeout: float | None = None,
) -> list[Tool]:
    """The tools of an MCP server as :class:`mighty.sandbox.Tool` objects, for
    ``Sandbox(tools=...)``: each a Python function named like the MCP tool (``-`` and ``.`` made
    ``_``, after ``prefix``). ``only``: just these (an unknown name is an error). Connects
    first (``client.start()``), waiting at most ``timeout`` (default: the server's
    ``connect_timeout``). A server given as :class:`McpServer` gets a client of its own, which
    lives as long as the process (pass a client to close it yourself)."""
    if isinstance(client, McpServer):
        client = McpClient(client)
    offered = client.start().wait_ready(timeout)
    names = list(offered) if only is None else list(only)
    missing = [n for n in names if n not in offered]
    if missing:
        raise McpUnavailable(
            f"MCP server {client.server.name} offers no tool {', '.join(map(repr, missing))}"
        )
    return [mcp_tool(client, offered[n], _python_name(prefix + n)) for n in names]


class CapabilityBroker:
    """The live side of a registry: one :class:`McpClient` per declared server (started on
    :meth:`start`), and granted names resolved to tools. Thread-safe."""

    def __init__(self, capabilities: Capabilities, base: Path | None = None) -> None:
        self.capabilities = capabilities
        self.base = base
        self.clients: dict[str, McpClient] = {
            name: McpClient(cap)
            for name, cap in capabilities.declared.items()
            if isinstance(cap, McpServer)
        }
        self._host_tools: dict[str, Tool] = {}
        self._mcp_tools: dict[str, Tool] = {}
        self._lock = threading.Lock()
        for name, cap in capabilities.declared.items():
            if isinstance(cap, HostTool):
                self._host_tools[name] = cap.load(base)

    def start(self) -> None:
        """Start (stdio) or connect to (HTTP) every declared MCP server; returns at once."""
        for client in self.clients.values():
            client.start()

    def close(self) -> None:
        """Stop every MCP server."""
        for client in self.clients.values():
            client.close()

    def granted(self, grants: frozenset[str], name: str) -> bool:
        """Whether ``name`` (as a guest calls it) is within ``grants``."""
        if name in grants:
            return name in self._host_tools or "." in name
        server, dot, _tool = name.partition(".")
        return bool(dot) and server in grants and server in self.clients

    def resolve(self, name: str) -> Tool:
        """The tool a granted ``name`` calls; McpUnavailable when its server is not up (the
        wait is bounded by the server's ``connect_timeout``)."""
        tool = self._host_tools.get(name)
        if tool is not None:
            return tool
        with self._lock:
            tool = self._mcp_tools.get(name)
        if tool is not None:
            return tool
        server, _dot, tool_name = name.partition(".")
        client = self.clients[server]
        offered = client.start().wait_ready(fail_fast=True)
        info = offered.get(tool_name)
        if info is None:
            raise McpUnavailable(f"MCP server {server} offers no tool {tool_name!r}")
        made = mcp_tool(client, info, _python_name(tool_name))
        with self._lock:
            return self._mcp_tools.setdefault(name, made)

    def listing(self, grants: frozenset[str]) -> list[dict[str, Any]]:
        """What the guest's ``list-tools`` returns: the spec of every granted tool it can see
        now (an MCP server not connected lists nothing), each named as the guest calls it."""
        specs: list[dict[str, Any]] = []
        for name in sorted(grants):
            if name in self._host_tools:
                specs.append(self._host_tools[name].spec())
                continue
            server, dot, one = name.partition(".")
            client = self.clients.get(server)
            if client is None or not client.connected:
                continue
            try:
                offered = client.wait_ready(0)
            except McpUnavailable:
                continue
            for tool_name in sorted(offered) if not dot else [one]:
                if tool_name not in offered:
                    continue
                spec = self.resolve(f"{server}.{tool_name}").spec()
                spec["name"] = f"{server}.{tool_name}"
                specs.append(spec)
        return specs
