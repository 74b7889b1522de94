"""Code mode for pydantic-ai: a ``run_code`` tool that runs the model's Python in mighty's sandbox.

Targets the released ``pydantic-ai-slim`` 2.68.0 (extra ``pydantic-ai``). That release has no
code-execution runtime hook (its ``CodeExecutionTool`` is a provider-side native tool; the
``CodeExecutionToolset(runtime=...)`` of pydantic-ai's repository is not released, and the
released pydantic-ai-harness 0.62's ``CodeMode`` runs on Monty only and pins pydantic-ai-slim
2.62). So this module is a toolset of its own: :class:`MightyCodeToolset` wraps a toolset,
hides its tools from the model and offers ``run_code(code)`` instead, in which every wrapped
tool is a keyword-only ``async`` function (also callable without ``await`` outside async
code). Each call the code makes goes back through pydantic-ai's own tool pipeline (a
``ToolManager`` over the wrapped toolset: argument validation, the tool's retries, capability
hooks), concurrently when the code gathers them. The value of the code's last expression is the
tool's return value (with what it printed, when it printed anything); any failure (an
exception, a limit, a tool error) is a ``ModelRetry`` carrying the message and the traceback,
so the model can correct its code. Each ``run_code`` call is recorded to ``record_dir`` when it
is given, for ``mty replay``.

Rejected: a ``Sandbox`` per ``run_code`` call (its tools are fixed when it is made, but making
one per call costs its pool); the sandbox is made once per set of tool definitions, and the
tool functions find the current call's ``ToolManager`` through a context variable.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import keyword
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any, cast

from pydantic import TypeAdapter
from pydantic_ai import ModelRetry, RunContext
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import ToolsetTool, WrapperToolset
from typing_extensions import TypedDict

from mighty._errors import Misuse
from mighty.sandbox import Limits, RunResult, Sandbox, Tool

__all__ = ["MAX_RETRY_OUTPUT", "RUN_CODE_DESCRIPTION", "MightyCodeToolset"]

MAX_RETRY_OUTPUT = 8 << 10
"""Most characters of stdout, and of stderr, a failed run's retry prompt shows (the end)."""

RUN_CODE_DESCRIPTION = """\
Run Python code (CPython 3.14, standard library, no network, no files) and return the value of \
its last expression. The functions below are available as globals; they are async: call them \
with keyword arguments and `await` them, or run several at once with \
`await asyncio.gather(...)`. Top-level `await` works. A failing function raises `ToolError` \
(attributes: tool, kind, message).
"""


class _RunCodeArgs(TypedDict):
    code: str


_ARGS: TypeAdapter[_RunCodeArgs] = TypeAdapter(_RunCodeArgs)
_CURRENT: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "mighty_pydantic_ai_call", default=None
)


@dataclass
class _Call:
    """What the tool functions of one ``run_code`` call route to."""

    manager: ToolManager[Any]
    parent_id: str
    numbers: count[int] = field(default_factory=lambda: count(1))


@dataclass
class _Shared:
    """State shared by every copy ``for_run`` makes: one sandbox per set of tool definitions."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    key: str = ""
    sandbox: Sandbox | None = None
    names: dict[str, str] = field(default_factory=dict)  # sandbox name -> pydantic-ai name

    def close(self) -> None:
        with self.lock:
            if self.sandbox is not None:
                self.sandbox.close()
                self.sandbox = None
                self.key = ""


@dataclass
class MightyCodeToolset(WrapperToolset[Any]):
    """Wrap ``wrapped`` so the model calls its tools from Python code in mighty's sandbox.

    ``limits`` apply to each ``run_code`` call (fuel, memory, time, output, tool calls, tool
    concurrency); ``record_dir`` keeps a trace of each call (``run_code-<call id>.bin``);
    ``max_retries`` is how often the model may retry failed code; ``pool`` is the sandbox's
    pool of ready interpreters.
    """

    limits: Limits = field(default_factory=Limits)
    record_dir: Path | None = None
    max_retries: int = 3
    pool: int = 2
    tool_name: str = "run_code"
    _shared: _Shared = field(default_factory=_Shared, repr=False)

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        wrapped = await self.wrapped.get_tools(ctx)
        sandbox = self._sandbox([t.tool_def for t in wrapped.values()])
        description = RUN_CODE_DESCRIPTION + "\n```python\n" + _stubs(sandbox) + "```\n"
        definition = ToolDefinition(
            name=self.tool_name,
            description=description,
            parameters_json_schema={
                "type": "object",
                "properties": {"code": {"type": "string", "description": "Python code to run"}},
                "required": ["code"],
                "additionalProperties": False,
            },
        )
        return {
            self.tool_name: ToolsetTool(
                toolset=self,
                tool_def=definition,
                max_retries=self.max_retries,
                args_validator=cast(Any, _ARGS.validator),
            )
        }

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        code = tool_args["code"]
        wrapped = await self.wrapped.get_tools(ctx)
        sandbox = self._sandbox([t.tool_def for t in wrapped.values()])
        parent = ctx.tool_manager
        manager = ToolManager(
            toolset=self.wrapped,
            root_capability=parent.root_capability if parent is not None else None,
            ctx=ctx,
            tools=wrapped,
        )
        call_id = ctx.tool_call_id or "call"
        record = None
        if self.record_dir is not None:
            self.record_dir.mkdir(parents=True, exist_ok=True)
            record = self.record_dir / f"{self.tool_name}-{_safe_file(call_id)}.bin"
        token = _CURRENT.set(_Call(manager, call_id))
        try:
            result = await sandbox.run_async(code, record=record)
        finally:
            _CURRENT.reset(token)
        return _answer(result)

    def close(self) -> None:
        """Free the sandbox (its pool of interpreters). Idempotent."""
        self._shared.close()

    def _sandbox(self, definitions: Sequence[ToolDefinition]) -> Sandbox:
        key = json.dumps(
            [[d.name, d.description, d.parameters_json_schema] for d in definitions],
            sort_keys=True,
            default=str,
        )
        shared = self._shared
        with shared.lock:
            if shared.sandbox is not None and shared.key == key:
                return shared.sandbox
            tools: list[Tool] = []
            names: dict[str, str] = {}
            for definition in definitions:
                local = _python_name(definition.name, names)
                names[local] = definition.name
                tools.append(Tool(_tool_function(local, definition), name=local))
            old = shared.sandbox
            shared.sandbox = Sandbox(tools=tools, limits=self.limits, pool=self.pool)
            shared.key = key
            shared.names = names
        if old is not None:
            old.close()
        return shared.sandbox


def _python_name(name: str, taken: dict[str, str]) -> str:
    """A Python identifier for tool ``name`` (the sandbox's tool names must be identifiers)."""
    local = "".join(c if c.isalnum() or c == "_" else "_" for c in name).lstrip("_") or "tool"
    if local[0].isdigit() or keyword.iskeyword(local):
        local = f"tool_{local}"
    base, n = local, 2
    while local in taken:
        local, n = f"{base}_{n}", n + 1
    return local


def _tool_function(local: str, definition: ToolDefinition) -> Callable[..., Any]:
    """An async host function with keyword-only parameters from the tool's JSON schema."""
    schema = definition.parameters_json_schema or {}
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    params = []
    for pname in properties:
        if not (pname.isidentifier() and not keyword.iskeyword(pname)):
            continue  # not expressible as a keyword argument: pydantic-ai's validation decides
        default = inspect.Parameter.empty if pname in required else None
        params.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, default=default))
    if schema.get("additionalProperties", True) is not False or len(params) < len(properties):
        params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    target = definition.name

    async def call(**kwargs: Any) -> Any:
        current = _CURRENT.get()
        if current is None:
            raise Misuse("a code-mode tool was called outside a run_code call")
        # Arguments left at their default are not sent: pydantic-ai fills in the real default.
        args = {k: v for k, v in kwargs.items() if v is not None or k in required}
        part = ToolCallPart(
            tool_name=target,
            args=args,
            tool_call_id=f"{current.parent_id}:{next(current.numbers)}",
        )
        return await current.manager.handle_call(part, wrap_validation_errors=False)

    call.__name__ = local
    call.__doc__ = definition.description or ""
    call.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return call


def _stubs(sandbox: Sandbox) -> str:
    lines = []
    for tool in sandbox.tools.values():
        doc = (inspect.getdoc(tool.fn) or "").strip()
        lines.append(f"async def {tool.name}{tool.signature}: ...")
        if doc:
            lines.extend(f"    # {line}" for line in doc.splitlines()[:20])
    return "\n".join(lines) + "\n"


def _safe_file(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)[:100] or "call"


def _answer(result: RunResult) -> Any:
    """The tool's return value, or a ModelRetry the model sees (message, traceback, output)."""
    if result.ok:
        if result.stdout:
            return {"result": result.value, "stdout": result.stdout}
        return result.value
    assert result.error is not None
    parts = [f"{result.error.kind}: {result.error.message}"]
    if result.error.traceback:
        parts.append(result.error.traceback.rstrip())
    # The model reads this: the ends of long output (where the failure shows) within a bound.
    if result.stdout:
        parts.append(f"stdout:\n{_tail(result.stdout.rstrip())}")
    if result.stderr:
        parts.append(f"stderr:\n{_tail(result.stderr.rstrip())}")
    raise ModelRetry("\n".join(parts))


def _tail(text: str) -> str:
    if len(text) <= MAX_RETRY_OUTPUT:
        return text
    return f"[... {len(text) - MAX_RETRY_OUTPUT} characters cut]\n" + text[-MAX_RETRY_OUTPUT:]
