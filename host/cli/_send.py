"""`mty send` and `mty ask`: one message into a running `mty run` or `mty node`.

    mty send ADDRESS MESSAGE [BODY] --socket S        # returns when the mailbox accepted it
    mty ask  ADDRESS MESSAGE [BODY] --socket S        # prints the reply, as JSON

ADDRESS is an agent address (``kv:3``) or a registered name; BODY is JSON (default ``null``),
as a manifest's ``[[start]]`` body. They go through the control socket (ops ``send`` and
``ask``, mighty.control), so they reach what `mty run --keep-running` or `mty node` serves when
``RUNTIME_CONTROL_SOCK`` (or ``--socket``) names its socket: try a swapped version with a
message, without restarting the system. Exit status: 0 delivered (and, for ask, replied); 2 for
a bad request or an unknown agent; 1 when the runtime cannot be reached, the ask timed out or
the handler failed.

Rejected: a BODY given as Python or TOML (JSON is what ``--json`` prints everywhere else, and
what the reply comes back as).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from mighty._errors import BadInput
from mighty.cli._main import _control_socket, _errors, _fail, escape_control

__all__ = ["ask_command", "send_command"]

_SOCKET_HELP = "Control socket of the run or node (default: $RUNTIME_CONTROL_SOCK)."
_USAGE_KINDS = ("noproc", "bad_input", "bad_request", "unknown_op")


def _body(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadInput(f"BODY is not JSON ({exc}): {text[:80]!r}") from None


def _request(path: str, op: str, args: dict[str, Any], timeout: float, as_json: bool) -> Any:
    from mighty.control import ControlError, request

    try:
        return request(path, op, args, timeout=timeout)
    except ControlError as exc:
        code = 2 if exc.kind in _USAGE_KINDS else 1
        if exc.kind == "unknown_op":
            message = (
                f"{exc}: this runtime serves no {op!r} (started by an older mighty?)"
                if op in str(exc)
                else str(exc)
            )
        else:
            message = str(exc)
        _fail(message, as_json=as_json, kind=exc.kind, code=code)


@click.command("send")
@click.argument("address")
@click.argument("message")
@click.argument("body", required=False)
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), help=_SOCKET_HELP)
@click.option(
    "--timeout",
    type=click.FloatRange(0, 3600, min_open=True),
    default=5.0,
    show_default=True,
    help="Seconds to wait for room in a full mailbox.",
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def send_command(
    address: str,
    message: str,
    body: str | None,
    socket_path: Path | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Send MESSAGE with BODY (JSON, default null) to the agent at ADDRESS of a running system."""
    with _errors(as_json):
        path = _control_socket(socket_path)
        args = {"to": address, "message": message, "body": _body(body), "timeout": timeout}
        result = _request(path, "send", args, timeout + 10.0, as_json)
        if as_json:
            click.echo(json.dumps({"ok": True, "result": result}))
        else:
            click.echo(f"{escape_control(address)} <- {escape_control(message)}: accepted")


@click.command("ask")
@click.argument("address")
@click.argument("message")
@click.argument("body", required=False)
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), help=_SOCKET_HELP)
@click.option(
    "--timeout",
    type=click.FloatRange(0, 3600, min_open=True),
    default=None,
    help="Seconds to wait for the reply (default: as long as the handler's budget allows).",
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def ask_command(
    address: str,
    message: str,
    body: str | None,
    socket_path: Path | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Ask the agent at ADDRESS of a running system MESSAGE with BODY; print its reply (JSON)."""
    with _errors(as_json):
        path = _control_socket(socket_path)
        args: dict[str, Any] = {"to": address, "message": message, "body": _body(body)}
        if timeout is not None:
            args["timeout"] = timeout
        # The runtime times the ask; the connection waits a little longer for its answer.
        wait = (timeout if timeout is not None else 600.0) + 10.0
        result = _request(path, "ask", args, wait, as_json)
        if as_json:
            click.echo(json.dumps({"ok": True, "result": result}))
        else:
            click.echo(json.dumps(result["reply"]))
