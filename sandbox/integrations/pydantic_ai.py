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

The ``run_code`` description lists each wrapped tool as a typed stub, as
``Sandbox.describe_tools()`` does for Python tools: parameter and return types are read from the
tool's JSON schemas (``string`` -> ``str``, ``anyOf`` -> ``A | B``, ``$ref`` -> the model's
name...) and a parameter's default is its schema's ``default`` (``= ...`` when the schema gives
none); an argument the code leaves out is not sent, so pydantic-ai fills in the real default.
Settings are checked when the toolset is made (``record_dir`` may be a ``str``: it is made a
``Path``), not at the first ``run_code`` inside the user's agent run.

Rejected: a ``Sandbox`` per ``run_code`` call (its tools are fixed when it is made, but making
one per call costs its pool); the sandbox is made once per set of tool definitions, and the
tool functions find the current call's ``ToolManager`` through a context variable.
"""

from __future__ import annotations

import contextvars
import inspect
import json
import keyword
import os
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

from mighty._errors import BadInput, Misuse, WrongType
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
    record_dir: str | os.PathLike[str] | None = None
    max_retries: int = 3
    pool: int = 2
    tool_name: str = "run_code"
    _shared: _Shared = field(default_factory=_Shared, repr=False)

    def __post_init__(self) -> None:
        # Checked here, not at the first run_code call inside the user's agent run.
        if not isinstance(self.limits, Limits):
            raise WrongType(f"limits must be a mighty.sandbox.Limits, got {type(self.limits)}")
        if self.record_dir is not None:
            if not isinstance(self.record_dir, str | os.PathLike):
                raise WrongType(
                    f"record_dir must be a path (str or Path), got {type(self.record_dir)}"
                )
            self.record_dir = Path(self.record_dir)
            if self.record_dir.exists() and not self.record_dir.is_dir():
                raise BadInput(f"record_dir {self.record_dir} exists and is not a directory")
        for name, value in (("max_retries", self.max_retries), ("pool", self.pool)):
            if type(value) is not int or value < 0:
                raise BadInput(f"{name} must be an int >= 0, got {value!r}")
        if not self.tool_name.isidentifier():
            raise BadInput(f"tool_name must be an identifier, got {self.tool_name!r}")

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
            directory = Path(self.record_dir)
            directory.mkdir(parents=True, exist_ok=True)
            record = directory / f"{self.tool_name}-{_safe_file(call_id)}.bin"
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


class _Shown:
    """A parameter default as the stub shows it (the schema's default, or ``...``); the code
    never receives it: a left-out argument is not sent (the guest's stub omits it)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


_JSON_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "null": "None",
}


def _annotation(schema: Any, depth: int = 0) -> str:
    """The Python type a JSON schema describes, as stub text (``Any`` when it cannot tell)."""
    if not isinstance(schema, dict) or depth > 8:
        return "Any"
    if isinstance(schema.get("$ref"), str):
        return schema["$ref"].rsplit("/", 1)[-1] or "Any"
    for union in ("anyOf", "oneOf"):
        if isinstance(schema.get(union), list) and schema[union]:
            parts = list(dict.fromkeys(_annotation(s, depth + 1) for s in schema[union]))
            return "Any" if "Any" in parts else " | ".join(parts)
    if "const" in schema:
        return f"Literal[{schema['const']!r}]"
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return f"Literal[{', '.join(repr(v) for v in schema['enum'])}]"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_annotation({**schema, "type": k}, depth + 1) for k in kind) or "Any"
    if kind in _JSON_TYPES:
        return _JSON_TYPES[kind]
    if kind == "array":
        if isinstance(schema.get("prefixItems"), list):
            items = ", ".join(_annotation(s, depth + 1) for s in schema["prefixItems"])
            return f"tuple[{items}]"
        return f"list[{_annotation(schema.get('items'), depth + 1)}]"
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            return f"dict[str, {_annotation(extra, depth + 1)}]"
        return "dict[str, Any]"
    return "Any"


def _tool_function(local: str, definition: ToolDefinition) -> Callable[..., Any]:
    """An async host function with keyword-only parameters from the tool's JSON schema, its
    types and defaults kept for the stub (:func:`_stubs`)."""
    schema = definition.parameters_json_schema or {}
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    params = []
    for pname, prop in properties.items():
        if not (pname.isidentifier() and not keyword.iskeyword(pname)):
            continue  # not expressible as a keyword argument: pydantic-ai's validation decides
        default: Any = inspect.Parameter.empty
        if pname not in required:
            shown = "..."
            if isinstance(prop, dict) and "default" in prop:
                shown = repr(prop["default"])
            default = _Shown(shown)
        params.append(
            inspect.Parameter(
                pname,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=_annotation(prop),
            )
        )
    if schema.get("additionalProperties", True) is not False or len(params) < len(properties):
        params.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    target = definition.name
    returns = (
        _annotation(definition.return_schema)
        if definition.return_schema is not None
        else inspect.Signature.empty
    )

    async def call(**kwargs: Any) -> Any:
        current = _CURRENT.get()
        if current is None:
            raise Misuse("a code-mode tool was called outside a run_code call")
        # A left-out argument is not sent: pydantic-ai fills in the real default.
        args = {k: v for k, v in kwargs.items() if not isinstance(v, _Shown)}
        part = ToolCallPart(
            tool_name=target,
            args=args,
            tool_call_id=f"{current.parent_id}:{next(current.numbers)}",
        )
        return await current.manager.handle_call(part, wrap_validation_errors=False)

    call.__name__ = local
    call.__doc__ = definition.description or ""
    call.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    return call


def _signature_text(signature: inspect.Signature) -> str:
    """``(*, title: str, limit: int = 5) -> int``: annotations bare, as a stub writes them."""
    pieces: list[str] = []
    star = False
    for param in signature.parameters.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            pieces.append(f"**{param.name}")
            continue
        if param.kind is inspect.Parameter.KEYWORD_ONLY and not star:
            pieces.append("*")
            star = True
        text = param.name
        if param.annotation is not inspect.Parameter.empty:
            text += f": {param.annotation}"
        if param.default is not inspect.Parameter.empty:
            text += f" = {param.default!r}"
        pieces.append(text)
    tail = ""
    if signature.return_annotation is not inspect.Signature.empty:
        tail = f" -> {signature.return_annotation}"
    return f"({', '.join(pieces)}){tail}"


def _stubs(sandbox: Sandbox) -> str:
    lines = []
    for tool in sandbox.tools.values():
        doc = (inspect.getdoc(tool.fn) or "").strip()
        lines.append(f"async def {tool.name}{_signature_text(tool.signature)}: ...")
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
