"""The tools this agent was granted, as Python functions.

    from mighty_agent import tools

    tools.lookup(city="Oslo")                 # a host tool granted as `lookup`
    tools.files.read(path="notes.txt")        # tool `read` of MCP server `files`
    tools.call("files.read", path="notes.txt")
    tools.names()                             # what the host can describe now

A failed call raises :class:`ToolError` (``kind``: ``not_granted``, ``unavailable``,
``invalid_arguments``, ``timeout``, ``too_large``, ``busy``, or the tool's exception type name;
``message``). Arguments and results are JSON data. Every call goes through the host's gate: it
is recorded with the run, and a replay answers it from the trace.
"""

import json

from mighty_agent._source import here as _here

try:
    from wit_world.imports import tools as _tools
except ImportError:  # built against a world without mighty:agent/tools
    _tools = None

__all__ = ["ToolError", "call", "describe", "names"]


class ToolError(Exception):
    """A tool call failed: ``tool``, ``kind`` and ``message`` say which, how and why."""

    def __init__(self, tool, kind, message):
        super().__init__(f"{tool}: {kind}: {message}")
        self.tool = tool
        self.kind = kind
        self.message = message


def call(name, /, *args, **kwargs):
    """Call the granted tool ``name`` (``lookup`` or ``server.tool``); its result."""
    return _call(name, args, kwargs)


def _call(name, args, kwargs):
    # Three frames below the caller's, from call(...) and from tools.lookup(...) alike.
    if _tools is None:
        raise ToolError(name, "not_granted", "this component's world has no mighty:agent/tools")
    from componentize_py_types import Err

    payload = json.dumps({"args": list(args), "kwargs": kwargs}).encode()
    _here(3)
    try:
        result = _tools.call(name, payload)
    except Err as err:
        raise ToolError(name, err.value.kind, err.value.message) from None
    return json.loads(result)


def describe():
    """The granted tools the host can describe now: ``[{"name", "params", "doc"}]``."""
    if _tools is None:
        return []
    _here()
    return json.loads(_tools.list_tools())


def names():
    """The names of :func:`describe`'s tools."""
    return [spec["name"] for spec in describe()]


class _Server:
    """``tools.files`` in ``tools.files.read(...)``: the tools of one MCP server."""

    def __init__(self, prefix):
        self._prefix = prefix

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        full = f"{self._prefix}.{name}"

        def tool(*args, **kwargs):
            return _call(full, args, kwargs)

        tool.__name__ = name
        return tool


class _Tool(_Server):
    """``tools.lookup``: callable (a host tool) and a namespace (an MCP server's tools)."""

    def __call__(self, *args, **kwargs):
        return _call(self._prefix, args, kwargs)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Tool(name)
