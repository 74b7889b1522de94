"""``mty serve COMPONENT``: a ``wasi:http/proxy`` component behind an HTTP server.

Thin: it parses the options into a :class:`~mighty.serve.Server` (policy, per-request budget,
limits) and runs it until SIGINT/SIGTERM, which shut it down gracefully (requests in flight
finish, up to ``--shutdown-timeout``). Rejected: a default of ``0.0.0.0`` (a handler is
reachable from the network only when asked, and then only with a bearer token).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from mighty._errors import BadInput
from mighty.cli._main import _errors, _http, _policy, _Size
from mighty.cli._progress import Waits

if TYPE_CHECKING:
    from mighty.serve import Server

__all__ = ["parse_listen", "serve_command"]


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) as (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) >= 65536:
        raise BadInput(f"--listen takes HOST:PORT (port 0: any free one), got {text!r}")
    return host.strip("[]"), int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _control_ops(server: Server) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """``reload`` (a swap, as `mty reload http --from NEW.wasm` asks) and ``status``."""
    from mighty.engine import Component

    def reload(args: dict[str, Any]) -> Any:
        agent_type, path = args.get("agent_type"), args.get("component")
        if agent_type != "http" or not isinstance(path, str):
            raise BadInput("mty serve swaps its one component: mty reload http --from NEW.wasm")
        report = server.swap(Component.load(path))
        return {"agents": ["http"], **report}

    def status(_args: dict[str, Any]) -> Any:
        stats = server.stats
        return {
            "component": server.component.sha256,
            "connections": stats.connections,
            "requests": stats.requests,
            "in_flight": stats.in_flight,
            "statuses": {str(k): v for k, v in stats.statuses.items()},
            "failures": dict(stats.failures),
        }

    return {"reload": reload, "status": status}


def _read_token(path: str) -> str:
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"--token-file {path}: {exc}") from None
    if len(token) < 16 or any(c.isspace() for c in token):
        raise BadInput(f"--token-file {path}: the token must be 16+ characters without spaces")
    return token


@click.command()
@click.argument("component", type=click.Path(path_type=Path))
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    show_default=True,
    metavar="HOST:PORT",
    help="Where to listen (port 0: any free one; off loopback needs --token-file).",
)
@click.option("--fuel", type=click.IntRange(min=1), help="Fuel per request (default 10^10).")
@click.option("--memory", type=_Size(), help="Linear memory per request (default 256MiB).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds per request: its deadline (504 past it).",
)
@click.option("--env", "env", multiple=True, metavar="K=V", help="Guest environment; repeatable.")
@click.option(
    "--dir",
    "dirs",
    multiple=True,
    metavar="HOST:GUEST[:rw]",
    help="Preopen a host directory, read-only unless :rw; repeatable.",
)
@click.option(
    "--allow-http",
    "allow_http",
    multiple=True,
    metavar="ORIGIN",
    help="Let the handler's outgoing wasi:http reach ORIGIN; repeatable.",
)
@click.option(
    "--http-secret",
    "http_secrets",
    multiple=True,
    nargs=2,
    metavar="ORIGIN HEADER=VALUE",
    help="A secret header for ORIGIN's outgoing requests (docs/http.md).",
)
@click.option(
    "--record",
    "record_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Record each request to its own trace in DIR (mty replay replays one).",
)
@click.option(
    "--record-share",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=1.0,
    show_default=True,
    help="With --record: the share of requests recorded, spread evenly (0.1: every tenth).",
)
@click.option(
    "--max-concurrent",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="Requests handled at once; more are answered 503 at once.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=1024,
    show_default=True,
    help="Open connections; more are closed at once.",
)
@click.option("--max-request-bytes", type=_Size(), help="Request body limit (default 16MiB).")
@click.option("--max-response-bytes", type=_Size(), help="Response body limit (default 64MiB).")
@click.option(
    "--header-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds from a request's first byte to its last header (408 past it).",
)
@click.option(
    "--body-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="Seconds between two reads of a request body.",
)
@click.option(
    "--shutdown-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    help="On SIGTERM, seconds to let requests in flight finish.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    help="A file holding the bearer token every request must carry (required off loopback).",
)
@click.option(
    "--control",
    "control_path",
    type=click.Path(path_type=Path),
    help="Serve a control socket here (default: $RUNTIME_CONTROL_SOCK if set): "
    "`mty reload http --from NEW.wasm` swaps the component under load.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress messages and no request log.")
def serve_command(
    component: Path,
    listen: str,
    fuel: int | None,
    memory: int | None,
    timeout: float,
    env: Sequence[str],
    dirs: Sequence[str],
    allow_http: Sequence[str],
    http_secrets: Sequence[tuple[str, str]],
    record_dir: Path | None,
    record_share: float,
    max_concurrent: int,
    max_connections: int,
    max_request_bytes: int | None,
    max_response_bytes: int | None,
    header_timeout: float,
    body_timeout: float,
    shutdown_timeout: float,
    token_file: str | None,
    control_path: Path | None,
    quiet: bool,
) -> None:
    """Serve COMPONENT (the wasi:http/proxy world) over HTTP/1.1.

    Each request runs in a fresh instance under the per-request budget (--fuel, --memory,
    --timeout) with the grants the options give; failures answer 500 (504 past the deadline)
    with the kind of failure and nothing of the host. SIGTERM or Ctrl-C stop gracefully.
    With --control, `mty reload http --from NEW.wasm` swaps the component with no request
    refused (in-flight ones finish on the old one), and `status` reports the counts.
    """
    from mighty.budget import Budget
    from mighty.engine import Component
    from mighty.serve import ServeLimits, Server

    with _errors(False):
        host, port = parse_listen(listen)
        token = _read_token(token_file) if token_file is not None else None
        if token is None and not _loopback(host):
            raise BadInput(f"--listen {listen} is off loopback: give --token-file")
        changes = {"fuel": fuel, "memory": memory, "timeout": timeout}
        budget = Budget(**{k: v for k, v in changes.items() if v is not None})  # type: ignore[arg-type]
        sizes = {"max_request_bytes": max_request_bytes, "max_response_bytes": max_response_bytes}
        limits = ServeLimits(
            max_concurrent=max_concurrent,
            max_connections=max_connections,
            header_timeout=header_timeout,
            body_timeout=body_timeout,
            shutdown_timeout=shutdown_timeout,
            **{k: v for k, v in sizes.items() if v is not None},
        )
        policy = _http(_policy(env, (), None, dirs, "real", None), allow_http, http_secrets)
        with Waits(not quiet) as show:
            loaded = Component.load(component, progress=show)

        def log(line: str) -> None:
            click.echo(line, err=True)

        server = Server(
            loaded,
            policy=policy,
            budget=budget,
            limits=limits,
            record_dir=record_dir,
            record_share=record_share,
            token=token,
            log=None if quiet else log,
        )

        def ready(bound_host: str, bound_port: int) -> None:
            shown = f"[{bound_host}]" if ":" in bound_host else bound_host
            # Always said, quiet or not: with port 0 it is the only way to learn the port.
            click.echo(f"mty: serving {component} on http://{shown}:{bound_port}", err=True)

        from mighty.control import ENV_VAR, ControlServer

        where = control_path or (Path(os.environ[ENV_VAR]) if os.environ.get(ENV_VAR) else None)
        control = None
        if where is not None:
            control = ControlServer(where, _control_ops(server)).start()
        try:
            server.run(host, port, on_ready=ready)
        finally:
            if control is not None:
                control.stop()
    if quiet:
        return
    stats = server.stats
    click.echo(f"mty: served {stats.requests} requests; stopped", err=True)
