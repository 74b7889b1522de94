"""Code mode over MCP (extra ``mcp``): the ``run_python`` tool's server on stdio or HTTP.

``mty sandbox serve`` is a thin CLI over this module: build a server with
:func:`build_sandbox_server`, then :func:`serve_stdio` or :func:`serve_http` (after
:func:`parse_bind`, :func:`read_token` and :func:`check_bind` for HTTP). Importing it imports the
official ``mcp`` SDK, so ``mighty.sandbox`` itself does not.
"""

from mighty.sandbox._mcp import (
    ARTIFACT_PART,
    ARTIFACT_SCHEME,
    MAX_PROGRESS_MESSAGE,
    MAX_REPLY,
    MAX_UNSENT_OUTPUT,
    MCP_OUTPUT,
    RUN_PYTHON,
    ArtifactStore,
    CallLimits,
    Preparation,
    RunOutput,
    SandboxLike,
    build_sandbox_server,
    build_server,
    check_bind,
    checked_call_result,
    describe_limits,
    load_tools,
    parse_bind,
    read_token,
    render_text,
    run_call,
    serve_http,
    serve_stdio,
    stdout_to_stderr,
    to_call_result,
    tool_description,
)

__all__ = [
    "ARTIFACT_PART",
    "ARTIFACT_SCHEME",
    "MAX_PROGRESS_MESSAGE",
    "MAX_REPLY",
    "MAX_UNSENT_OUTPUT",
    "MCP_OUTPUT",
    "RUN_PYTHON",
    "ArtifactStore",
    "CallLimits",
    "Preparation",
    "RunOutput",
    "SandboxLike",
    "build_sandbox_server",
    "build_server",
    "check_bind",
    "checked_call_result",
    "describe_limits",
    "load_tools",
    "parse_bind",
    "read_token",
    "render_text",
    "run_call",
    "serve_http",
    "serve_stdio",
    "stdout_to_stderr",
    "to_call_result",
    "tool_description",
]
