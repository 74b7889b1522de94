"""`mty sandbox serve`: code mode as an MCP server on stdio, or Streamable HTTP (`--http`).

On stdio, stdout is the MCP channel, so this command writes nothing there itself: messages and
errors go to stderr, and setup runs with file descriptor 1 pointed at stderr (over HTTP too).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import click

from mighty._errors import MightyError

__all__ = ["sandbox_group"]

_EXIT_USAGE = 2


class _Bytes(click.ParamType):  # type: ignore[type-arg] # generic only in newer stubs
    name = "BYTES"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from mighty.cli._main import parse_size

        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


def _fail(message: str, cause: BaseException | None = None) -> NoReturn:
    if cause is not None and os.environ.get("MTY_DEBUG") == "1":
        raise cause
    click.echo(f"mty: error: {message}", err=True)
    sys.exit(_EXIT_USAGE)


@click.group("sandbox")
def sandbox_group() -> None:
    """Code mode: run untrusted Python in a fresh WebAssembly sandbox."""


@sandbox_group.command("prepare")
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
def prepare(quiet: bool) -> None:
    """Build and compile the sandbox's Python interpreter now (first use pays it otherwise)."""
    import time

    from mighty.cli._main import _errors
    from mighty.cli._progress import Waits
    from mighty.sandbox import interpreter_component

    with _errors(as_json=False):
        started = time.monotonic()
        with Waits(not quiet) as show:
            component = interpreter_component(show)
        if not quiet:
            seconds = time.monotonic() - started
            click.echo(
                f"interpreter ready: {component.origin} (sha256 {component.sha256[:12]}, "
                f"{seconds:.1f} s)"
            )


@sandbox_group.command("serve")
@click.option(
    "--tools",
    "tools_spec",
    metavar="MODULE:ATTR",
    help="A list or dict of host callables the code may call (imported; trusted).",
)
@click.option("--fuel", type=click.IntRange(min=1), help="Fuel per call (default: the sandbox's).")
@click.option("--memory", type=_Bytes(), help="Linear memory ceiling per call, e.g. 256MiB.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Wall-clock seconds per call (default: the sandbox's).",
)
@click.option(
    "--output",
    type=_Bytes(),
    help="Bytes of a call's stdout+stderr shown in its result (default 64KiB; the rest is an "
    "artifact resource).",
)
@click.option(
    "--http",
    "http_bind",
    metavar="HOST:PORT",
    help="Serve Streamable HTTP at http://HOST:PORT/mcp instead of stdio (port 0: any free).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    help="With --http: a file holding the bearer token every request must carry "
    "(required off loopback).",
)
def serve(
    tools_spec: str | None,
    fuel: int | None,
    memory: int | None,
    timeout: float | None,
    output: int | None,
    http_bind: str | None,
    token_file: str | None,
) -> None:
    """Serve the MCP tool `run_python` on stdio (or HTTP); each call runs in a fresh sandbox.

    The server answers at once; the interpreter is prepared in the background (the first call
    waits for it; `mty sandbox prepare` does it ahead of time). Over HTTP several clients are
    served at once from one pool of warm instances; a public address needs --token-file.
    """
    try:
        from mighty.sandbox import mcp
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in ("mcp", "mcp_types"):
            raise
        _fail(f"the MCP SDK is not installed ({exc}); pip install 'mighty-host[mcp]'", exc)

    if token_file is not None and http_bind is None:
        _fail("--token-file needs --http (stdio has no HTTP requests to check)")
    try:
        token: str | None = None
        host, port = "", 0
        if http_bind is not None:
            host, port = mcp.parse_bind(http_bind)
            token = mcp.read_token(token_file) if token_file is not None else None
            mcp.check_bind(host, token)  # before anything is built: a refusal costs nothing
        with mcp.stdout_to_stderr():
            server = mcp.build_sandbox_server(
                tools=mcp.load_tools(tools_spec) if tools_spec else None,
                fuel=fuel,
                memory=memory,
                timeout=timeout,
                output=output,
                progress=lambda message: click.echo(f"mty: {message}", err=True),
            )
    except MightyError as exc:
        _fail(exc.message, exc)
    if http_bind is not None:

        def ready(url: str) -> None:
            click.echo(f"mty: serving MCP tool {mcp.RUN_PYTHON!r} on {url}", err=True)

        try:
            mcp.serve_http(server, host=host, port=port, token=token, on_ready=ready)
        except MightyError as exc:
            _fail(exc.message, exc)
        return
    click.echo(f"mty: serving MCP tool {mcp.RUN_PYTHON!r} on stdio", err=True)
    try:
        mcp.serve_stdio(server)
    except KeyboardInterrupt:
        sys.exit(130)
