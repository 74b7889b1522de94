"""`mty`: thin click commands over the library. Parse, call, render; no logic of their own.

Exit status everywhere: 0 ok, 1 the guest failed, 2 bad usage or input, 130 interrupted by
Ctrl-C (SIGINT), 143 terminated (SIGTERM): the guest call is cancelled cleanly either way.
`mty call` passes a guest's own exit status through (``wasi:cli/exit``, and a command
component's ``wasi:cli/run`` result: ok is 0, err is 1), as ``wasmtime run`` does, so that a
script can tell a guest's success from its failure. Rejected: exit 1 for every guest exit,
which made ``exit(0)`` a failure.
Errors are one line on stderr (``mty: error: ...``) and never a Python traceback, unless
``MTY_DEBUG=1``.

Text the guest controls (its stdout and stderr, its error messages) is written to a terminal
with control characters escaped (:func:`escape_control`): an OSC or CSI sequence from a guest
must not retitle the window, set the clipboard (OSC 52) or redraw the screen. Error lines are
always escaped; guest output only when the stream is a terminal (piped or redirected, its
bytes pass unchanged); ``--json`` output is JSON-escaped anyway.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from mighty._errors import (
    BadInput,
    Cancelled,
    CompileError,
    GuestError,
    GuestExit,
    HostError,
    MightyError,
)
from mighty.cli._interrupts import (
    Terminated,
    exiting_for_signal,
    interruptible,
    signal_behind,
)
from mighty.cli._progress import Waits

if TYPE_CHECKING:
    from mighty.engine import Component
    from mighty.instance import Instance
    from mighty.trace import FlushMode, Recorder
    from mighty.wasi import Policy

__all__ = [
    "broken_pipe",
    "command_export",
    "escape_control",
    "main",
    "parse_size",
    "refuse_internal",
    "version_text",
]

EXIT_OK = 0
EXIT_GUEST = 1
EXIT_USAGE = 2

_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "ki": 1024,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mi": 1024**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gi": 1024**3,
    "gib": 1024**3,
}


def parse_size(text: str) -> int:
    """Bytes from ``"1048576"``, ``"64MiB"``, ``"256M"``, ``"1g"`` (decimal or binary units)."""
    match = _SIZE.match(text)
    unit = (match.group(2) or "").lower() if match else ""
    if match is None or unit not in _UNITS:
        raise click.BadParameter(f"{text!r} is not a size (examples: 67108864, 64MiB, 256M, 1G)")
    return int(match.group(1)) * _UNITS[unit]


class _Size(click.ParamType):  # type: ignore[type-arg] # generic only in newer stubs
    name = "BYTES"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape_one(match: re.Match[str]) -> str:
    char = ord(match.group())
    return f"\\x{char:02x}" if char < 0x100 else f"\\u{char:04x}"


def escape_control(text: str) -> str:
    """``text`` safe for a terminal: every control character but newline and tab (C0, DEL, C1,
    and the bidirectional overrides) written as a visible ``\\xNN`` / ``\\uNNNN`` escape."""
    return _CONTROL.sub(_escape_one, text)


def _write_text(stream: Any, text: str) -> None:
    """Write ``text`` to a text stream, escaped if it is a terminal, never failing on an
    encoding the stream cannot represent."""
    if _isatty(stream):
        text = escape_control(text)
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        stream.write(text)
    else:
        stream.flush()
        buffer.write(text.encode(getattr(stream, "encoding", None) or "utf-8", "backslashreplace"))
    stream.flush()


def _write_bytes(stream: Any, data: bytes) -> None:
    """Guest output: raw when piped, decoded and escaped when the stream is a terminal."""
    if _isatty(stream):
        _write_text(stream, data.decode("utf-8", "replace"))
        return
    stream.buffer.write(data)
    stream.flush()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _fail(
    message: str, *, as_json: bool, kind: str = "bad_input", code: int = EXIT_USAGE
) -> NoReturn:
    if as_json:
        click.echo(json.dumps({"ok": False, "error": {"kind": kind, "message": message}}))
    else:
        click.echo(f"mty: error: {escape_control(message)}", err=True)
    sys.exit(code)


def _signal_exit(signum: int) -> int:
    # Shells report a death by signal N as 128 + N; exiting with that code says the same thing
    # without dying, so that every byte of output is flushed first.
    exiting_for_signal()
    with suppress(ValueError):  # not the main thread: no handler to change
        # A second Ctrl-C while the first is being reported must not end in a traceback.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return 128 + signum


def _fail_signal(signum: int, as_json: bool) -> NoReturn:
    message = "interrupted" if signum == signal.SIGINT else "terminated"
    _fail(message, as_json=as_json, kind="cancelled", code=_signal_exit(signum))


def _control_socket(socket_path: Path | None) -> str:
    """The control socket a command talks to: --socket, else $RUNTIME_CONTROL_SOCK."""
    from mighty.control import ENV_VAR

    path = socket_path or os.environ.get(ENV_VAR)
    if not path:
        raise BadInput(f"no control socket: pass --socket or set {ENV_VAR}")
    return str(path)


def _control_refused(what: str, kind: str, message: str, as_json: bool) -> NoReturn:
    """A control request the runtime refused: one line (or one JSON object), exit 1."""
    if as_json:
        click.echo(json.dumps({"ok": False, "error": {"kind": kind, "message": message}}))
    else:
        click.echo(f"mty: {what} refused: {escape_control(message)}", err=True)
    sys.exit(EXIT_GUEST)


@contextmanager
def _errors(as_json: bool) -> Iterator[None]:
    """Render mighty's errors as one line (or one JSON object) and the right exit status."""
    try:
        yield
    except Cancelled as exc:
        code = EXIT_GUEST if exc.signal is None else _signal_exit(exc.signal)
        _fail(exc.message, as_json=as_json, kind=exc.kind, code=code)
    except GuestError as exc:
        _fail(exc.message, as_json=as_json, kind=exc.kind, code=EXIT_GUEST)
    except (BadInput, CompileError) as exc:
        _fail(exc.message, as_json=as_json)
    except HostError as exc:
        _fail(exc.message, as_json=as_json, kind=exc.kind, code=EXIT_USAGE)
    except MightyError as exc:  # pragma: no cover - every family is handled above
        _fail(exc.message, as_json=as_json, kind=exc.kind)
    except KeyboardInterrupt:
        _fail_signal(signal.SIGINT, as_json)
    except Terminated:
        _fail_signal(signal.SIGTERM, as_json)
    except BrokenPipeError:
        broken_pipe()
    except Exception as exc:
        signum = signal_behind(exc)  # a signal's exception another one wraps
        if signum is not None:
            _fail_signal(signum, as_json)
        if os.environ.get("MTY_DEBUG"):
            raise
        _fail(
            f"internal error: {type(exc).__name__}: {exc} (set MTY_DEBUG=1 for a traceback)",
            as_json=as_json,
            kind="internal",
            code=EXIT_USAGE,
        )


def broken_pipe() -> NoReturn:
    """The reader of our output went away (``mty trace show X | head``): exit at once, quietly.

    Descriptor 1 is pointed at /dev/null first, so that the flush at interpreter exit does not
    fail again ("Exception ignored ... BrokenPipeError"). Exit status 141 is what a shell
    reports for a death by SIGPIPE, which is how a C tool in the same spot would end.
    """
    with suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    sys.exit(128 + signal.SIGPIPE)


class _Group(click.Group):
    """The `mty` group: a signal before a command's own error handling still ends cleanly."""

    def invoke(self, ctx: click.Context) -> Any:
        # While the command runs, SIGINT and SIGTERM raise and are never lost (see
        # mighty.cli._interrupts). Commands render their own errors; this only covers the
        # moments before they start (imports, argument parsing) and an interrupt owed until the
        # command's end, where a Ctrl-C would otherwise print a traceback.
        as_json = "--json" in ctx.args
        try:
            with interruptible():
                return super().invoke(ctx)
        except BrokenPipeError:
            broken_pipe()
        except KeyboardInterrupt:
            _fail_signal(signal.SIGINT, as_json)
        except Terminated:
            _fail_signal(signal.SIGTERM, as_json)
        except Exception as exc:
            signum = signal_behind(exc)  # a signal's exception another one wraps
            if signum is None:
                raise
            _fail_signal(signum, as_json)


def version_text() -> str:
    """What ``mty --version`` prints: mighty, the toolchain under it, the engine's settings."""
    from importlib.metadata import PackageNotFoundError, version

    from mighty.engine import SETTINGS

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return (
        f"mty (mighty) {of('mighty-host')}\n"
        f"wasmtime {of('wasmtime')}\n"
        f"componentize-py {of('componentize-py')}\n"
        f"engine fingerprint {SETTINGS.fingerprint}"
    )


def _show_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(version_text())
    ctx.exit()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-V",
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the versions of mighty, wasmtime and componentize-py, and the engine fingerprint.",
)
def main() -> None:
    """mighty: build and run handlers compiled to WebAssembly components."""
    # SIGTERM ends a command the way Ctrl-C does (`_Group.invoke` set that up): the guest call
    # is cancelled cleanly, the command reports one line and exits 143. Commands that stop more
    # gracefully (mty run) install their own handlers.


@main.command()
@click.argument("source", type=click.Path(path_type=Path))
@click.option(
    "--wit",
    "wit",
    type=click.Path(path_type=Path),
    help="WIT directory (default: wit/ beside SOURCE).",
)
@click.option("--world", help="World to build (default: the only world in the WIT package).")
@click.option(
    "-p",
    "--path",
    "python_path",
    multiple=True,
    type=click.Path(path_type=Path),
    help="Extra directory for guest imports; repeatable.",
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=Path),
    help="Where to write the component.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def build(
    source: Path,
    wit: Path | None,
    world: str | None,
    python_path: Sequence[Path],
    output: Path,
    quiet: bool,
    as_json: bool,
) -> None:
    """Compile the Python handler SOURCE to a WebAssembly component (cached by content hash)."""
    from mighty.build import build_component

    with _errors(as_json), Waits(not quiet) as show:
        wit, python_path = _agent_defaults(source, wit, python_path)
        result = build_component(
            source, output=output, wit=wit, world=world, python_path=python_path, progress=show
        )
        show.done()
        if as_json:
            document = {
                "ok": True,
                "path": str(result.path),
                "cached": result.cached,
                "seconds": round(result.seconds, 3),
                "component_sha256": result.component_sha256,
                "build_digest": result.digest,
            }
            click.echo(json.dumps(document))
            return
        note = "cached" if result.cached else f"built in {result.seconds:.1f} s"
        if not quiet:
            click.echo(f"{result.path} ({note}, sha256 {result.component_sha256[:12]})")


def _agent_defaults(
    source: Path, wit: Path | None, python_path: Sequence[Path]
) -> tuple[Path | None, Sequence[Path]]:
    """An agent handler (it imports mighty_agent) with no WIT of its own gets the agent world
    and the guest SDK without being told where they are."""
    if wit is not None or (source.parent / "wit").is_dir():
        return wit, python_path
    try:
        text = source.read_text(encoding="utf-8")
    except OSError:
        return wit, python_path
    if "mighty_agent" not in text:
        return wit, python_path
    from mighty._resources import agent_sdk, agent_wit

    return agent_wit(), [*python_path, agent_sdk()]


_GUEST_ARGV = "mty.call.guest_argv"
_COMMAND_EXPORT = re.compile(r"^wasi:cli/run(@[^#]*)?#run$")


class _CallCommand(click.Command):
    """`mty call`: what follows the first bare ``--`` is the guest's own argument list, never
    options of ours (``mty call X.wasm -- -v file`` reads like ``wasmtime run X.wasm -v file``).
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            at = args.index("--")
            ctx.meta[_GUEST_ARGV] = args[at + 1 :]
            args = args[:at]
        return super().parse_args(ctx, args)


def command_export(component: Component) -> str | None:
    """The name of ``component``'s ``wasi:cli/run`` export, if it is a command."""
    for name in component.export_functions():
        if _COMMAND_EXPORT.match(name):
            return name
    return None


# Negative numbers are JSON arguments, not options: `mty call x.wasm add 1 -5`.
@main.command(cls=_CallCommand, context_settings={"ignore_unknown_options": True})
@click.argument("component", type=click.Path(path_type=Path))
@click.argument("func", required=False)
@click.argument("args", nargs=-1)
@click.option("--fuel", type=click.IntRange(min=1), help="Fuel for the call (default 10^10).")
@click.option("--memory", type=_Size(), help="Linear memory ceiling, e.g. 64MiB (default 256MiB).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Wall-clock seconds (default 10).",
)
@click.option(
    "--env",
    "env",
    multiple=True,
    metavar="K=V",
    help="Environment variable for the guest; repeatable.",
)
@click.option(
    "--arg", "guest_args", multiple=True, metavar="A", help="Argument for the guest; repeatable."
)
@click.option(
    "--argv0",
    metavar="NAME",
    help="The guest's argv[0] (a command's default: the component's file name).",
)
@click.option(
    "--stdin",
    "stdin",
    type=click.Path(path_type=Path, dir_okay=False),
    help="File whose bytes are the guest's stdin ('-' for ours).",
)
@click.option(
    "--dir",
    "dirs",
    multiple=True,
    metavar="HOST:GUEST[:rw]",
    help="Preopen a host directory, read-only unless :rw; repeatable.",
)
@click.option(
    "--clock",
    type=click.Choice(["real", "fixed", "virtual"]),
    default="real",
    show_default=True,
    help="What the guest's clocks read.",
)
@click.option("--seed", type=int, help="Seed the guest's random numbers (default: OS entropy).")
@click.option(
    "--allow-http",
    "allow_http",
    multiple=True,
    metavar="ORIGIN",
    help="Let wasi:http reach ORIGIN (https://api.x.com, https://*.x.com:*); repeatable.",
)
@click.option(
    "--http-secret",
    "http_secrets",
    multiple=True,
    nargs=2,
    metavar="ORIGIN HEADER=VALUE",
    help="Add a header to ORIGIN's requests, VALUE naming a secret: 'Bearer ${ENV_VAR}' or "
    "@FILE; the guest never sees it (docs/http.md).",
)
@click.option(
    "--record",
    "record",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[TRACE]",
    help="Record the run to TRACE (default: mty-trace-<time>.bin).",
)
@click.option(
    "--flush",
    type=click.Choice(["record", "call", "os"]),
    default="call",
    show_default=True,
    help="When recorded records reach the OS (docs/determinism.md, Durability).",
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
def call(
    component: Path,
    func: str | None,
    args: Sequence[str],
    fuel: int | None,
    memory: int | None,
    timeout: float | None,
    env: Sequence[str],
    guest_args: Sequence[str],
    argv0: str | None,
    stdin: Path | None,
    dirs: Sequence[str],
    clock: str,
    seed: int | None,
    allow_http: Sequence[str],
    http_secrets: Sequence[tuple[str, str]],
    record: str | None,
    flush: FlushMode,
    as_json: bool,
    quiet: bool,
) -> None:
    """Call FUNC of COMPONENT with JSON-encoded ARGS and print the result as JSON.

    The guest runs on mighty's WASI with nothing granted but what the options give it. Its
    stdout and stderr are captured: printed to ours, or fields of the --json object.

    A command component (one exporting wasi:cli/run) runs like `wasmtime run`: `mty call
    X.wasm [OPTIONS] -- ARGS...` (FUNC left out), argv[0] is X.wasm's file name unless
    --argv0, and the guest's exit status is ours (with --json, the `exit_code` field).
    """
    from mighty.abi import to_json
    from mighty.budget import Budget
    from mighty.engine import Component
    from mighty.instance import Instance

    with _errors(as_json):
        changes: dict[str, Any] = {"fuel": fuel, "memory": memory, "timeout": timeout}
        budget = Budget(**{k: v for k, v in changes.items() if v is not None})
        with Waits(not quiet) as show:
            loaded = Component.load(component, progress=show)
        func, is_command, argv, args = _call_shape(loaded, component, func, args, argv0, guest_args)
        policy = _policy(env, argv, stdin, dirs, clock, seed)
        policy = _http(policy, allow_http, http_secrets)
        decoded = _json_args(args)
        refuse_internal(loaded, func)
        recorder = _recorder(record, flush)
        try:
            # --fuel/--timeout are for the call; instantiation (which runs guest start-up code)
            # gets the default budget under the same memory ceiling.
            instance = Instance(
                loaded, budget=Budget(memory=budget.memory), policy=policy, record=recorder
            )
        except BaseException:
            if recorder is not None:
                recorder.close()
            raise
        try:
            signature = instance.signature(func)
            values = _typed_args(func, signature.params, decoded)
            try:
                result, usage = instance.call_with_usage(func, *values, budget=budget)
            except GuestExit as exc:
                _guest_exit(exc, instance, as_json=as_json, command=is_command)
            except GuestError as exc:
                if as_json:
                    _guest_failure_json(exc, instance)
                _echo_guest_output(instance)
                raise
            if is_command:
                _command_done(result, usage.to_json(), instance, as_json=as_json)
            rendered = None if signature.result is None else to_json(signature.result, result)
            if as_json:
                document = {"ok": True, "result": rendered, "usage": usage.to_json()}
                document.update(_outputs_json(instance))
                click.echo(json.dumps(document))
            else:
                _echo_guest_output(instance)
                _write_text(sys.stdout, json.dumps(rendered, indent=2, ensure_ascii=False) + "\n")
        finally:
            instance.close()
            if recorder is not None:
                recorder.close()


@main.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--agent",
    "agents",
    multiple=True,
    help="Replay only this agent: an address (kv:3), a registered name, or an instance number;"
    " again for a sub-graph (--agent a --agent b replays both, their messages to each other"
    " as recorded); with several traces (or a directory), a migrated agent's first address"
    " (a:kv:3).",
)
@click.option(
    "--component",
    "changed",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Replay against this component instead (find where a new build diverges).",
)
@click.option(
    "--component-dir",
    "component_dirs",
    multiple=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="Also look for the recorded components (by sha256) among the .wasm files here.",
)
@click.option(
    "--max-fuel",
    type=click.IntRange(min=1),
    default=None,
    help="Most fuel any replayed call gets, whatever the trace recorded.",
)
@click.option(
    "--max-memory",
    type=click.IntRange(min=1),
    default=None,
    help="Most linear-memory bytes a replayed instance gets, whatever the trace recorded.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Most seconds any replayed call gets, whatever the trace recorded.",
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def replay(
    traces: tuple[Path, ...],
    agents: tuple[str, ...],
    changed: Path | None,
    component_dirs: tuple[Path, ...],
    max_fuel: int | None,
    max_memory: int | None,
    timeout: float | None,
    as_json: bool,
) -> None:
    """Run TRACE again, answering every import from it, and check it does the same thing.

    Several TRACES (or a directory of them: the trace of each node of a cluster) and
    --agent a:type:pid replay that agent's history across its migrations, node by node.

    The budget recorded in TRACE is capped by the replay limits (defaults in
    mighty.trace.DEFAULT_REPLAY_LIMITS; raise them with --max-fuel/--max-memory/--timeout).
    Each recorded component is looked up by sha256 in the component store, then at its
    recorded path, then in every --component-dir.
    """
    from dataclasses import replace as _replace

    from mighty.trace import DEFAULT_REPLAY_LIMITS, NondeterminismError, replay_trace

    with _errors(as_json):
        changes: dict[str, Any] = {}
        if max_fuel is not None:
            changes["fuel"] = max_fuel
        if max_memory is not None:
            changes["memory"] = max_memory
        if timeout is not None:
            changes["timeout"] = timeout
        limits = _replace(DEFAULT_REPLAY_LIMITS, **changes)
        agent = agents[0] if len(agents) == 1 else None
        if len(traces) > 1 or traces[0].is_dir():
            from mighty.cli._across import replay_across_command

            if len(agents) > 1:
                raise BadInput("across several traces, --agent names one agent")
            replay_across_command(traces, agent, limits, component_dirs, changed, as_json)
            return
        trace = traces[0]
        try:
            instance = int(agent) if agent is not None and agent.isdigit() else None
            report = replay_trace(
                trace,
                instance=instance,
                agent=(agents or None) if instance is None else None,
                substitute=changed,
                limits=limits,
                component_dirs=component_dirs,
            )
        except NondeterminismError as exc:
            if as_json:
                click.echo(
                    json.dumps(
                        {
                            "ok": False,
                            "error": {
                                "kind": "nondeterminism",
                                "message": exc.message,
                                "instance": exc.instance,
                                "step": exc.step,
                                "expected": _jsonable(exc.expected),
                                "got": _jsonable(exc.got),
                            },
                        }
                    )
                )
            else:
                click.echo(f"mty: NondeterminismError: {exc.message}", err=True)
            sys.exit(EXIT_GUEST)
        if as_json:
            click.echo(json.dumps(report.to_json()))
        else:
            for item in report.instances:
                note = f", interrupted in {', '.join(item.interrupted)}" if item.interrupted else ""
                click.echo(
                    f"instance {item.instance}: {item.exports} export call(s), "
                    f"{item.imports} import(s) replayed{note}"
                )
            tail = " (the trace ends early: replayed what was whole)" if report.truncated else ""
            click.echo(f"ok: digest {report.digest}{tail}")


@main.command()
@click.argument("trace", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--agent",
    "agents",
    multiple=True,
    help="Debug only this agent: an address (kv:3), a registered name, or an instance number;"
    " again for a sub-graph.",
)
def debug(trace: Path, agents: tuple[str, ...]) -> None:
    """Step through a replay of TRACE. Commands come from the prompt or from stdin."""
    from mighty.trace import Debugger

    with _errors(as_json=False):
        interactive = sys.stdin.isatty()
        agent = agents[0] if len(agents) == 1 else None
        instance = int(agent) if agent is not None and agent.isdigit() else None
        named = (agents or None) if instance is None else None
        debugger = Debugger(trace, instance=instance, agent=named)
        lines = debugger.start()
        finished = debugger.finished
        if debugger.current is None and finished is not None and finished.error is not None:
            # Nothing to step through (not a trace, no such instance): fail as `mty replay`.
            debugger.close()
            if isinstance(finished.error, MightyError):
                raise finished.error
        for line in lines:
            click.echo(line)
        done = False
        while not done:
            if interactive:
                click.echo("(mty) ", nl=False)
            raw = sys.stdin.readline()
            if not raw:
                raw = "quit"
            if not interactive:
                click.echo(f"(mty) {raw.strip()}")
            lines, done = debugger.command(raw)
            for line in lines:
                click.echo(line)


@main.group()
def trace() -> None:
    """Inspect trace files."""


@trace.command("show")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option(
    "--html",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Also write a self-contained page: a timeline per agent, click a message for its"
    " body, reply and imports.",
)
def trace_show(path: Path, as_json: bool, html: Path | None) -> None:
    """Summarise a trace: instances, steps, imports by interface, size."""
    from mighty.trace import summarize

    with _errors(as_json):
        if html is not None:
            from mighty.trace import write_html

            write_html(path, html)
            click.echo(f"wrote {html}", err=as_json)
        summary = summarize(path)
        if as_json:
            click.echo(json.dumps(summary))
            return
        click.echo(f"{path}: {summary['bytes']} bytes, {summary['records']} records")
        if summary["truncated"]:
            click.echo(f"  truncated: {summary['readable_bytes']} bytes readable")
        for item in summary["instances"]:
            click.echo(
                f"  instance {item['instance']}: {item['component'][:12]} ({item['path']}), "
                f"{item['steps']} steps, {item['exports']} export call(s)"
            )
            for name, count in sorted(item["imports"].items()):
                click.echo(f"    {count:6d}  {name}")


def _call_shape(
    loaded: Component,
    path: Path,
    func: str | None,
    args: Sequence[str],
    argv0: str | None,
    guest_args: Sequence[str],
) -> tuple[str, bool, list[str], list[str]]:
    """(function, whether it is the command's run, the guest's argv, JSON arguments).

    Without FUNC a command's wasi:cli/run is called. A command gets argv[0] (``--argv0`` or
    the file name), then ``--arg``s, then what followed ``--``; any other function gets its
    ``--arg``s alone (``--argv0`` first if given), and what followed ``--`` are JSON arguments.
    """
    after_dash = click.get_current_context().meta.get(_GUEST_ARGV)
    command = command_export(loaded)
    if func is None:
        if command is None:
            raise BadInput(
                f"{path} is not a command (no wasi:cli/run export): name the function to "
                f"call; it exports: {', '.join(loaded.export_functions()) or 'nothing'}"
            )
        func = command
    if func == command:
        return func, True, [argv0 or path.name, *guest_args, *(after_dash or [])], list(args)
    argv = [*([argv0] if argv0 is not None else []), *guest_args]
    return func, False, argv, [*args, *(after_dash or [])]


def _typed_args(func: str, params: Sequence[tuple[str, Any]], decoded: list[Any]) -> list[Any]:
    """The call's JSON arguments as values of the export's parameter types."""
    from mighty.abi import from_json

    if len(decoded) != len(params):
        wanted = ", ".join(f"{name}: {ty}" for name, ty in params) or "no arguments"
        raise BadInput(f"{func} takes {len(params)} argument(s) ({wanted}), got {len(decoded)}")
    return [from_json(ty, value, name) for (name, ty), value in zip(params, decoded, strict=True)]


def refuse_internal(component: Component, func: str) -> None:
    """BadInput when ``func`` is a toolchain internal (componentize-py's ``exports#init``)."""
    if func in component.export_functions(include_internal=True) and (
        func not in component.export_functions()
    ):
        raise BadInput(
            f"{func} is an internal export of the toolchain (componentize-py runs it while "
            "building), not a function of the handler; `mty inspect-component "
            f"{component.origin}` lists the functions it exports"
        )


def _json_args(args: Sequence[str]) -> list[Any]:
    decoded: list[Any] = []
    for index, text in enumerate(args):
        try:
            decoded.append(json.loads(text))
        except json.JSONDecodeError as exc:
            raise BadInput(f"argument {index + 1} is not JSON ({exc.msg}): {text!r}") from None
    return decoded


def _recorder(record: str | None, flush: FlushMode = "call") -> Recorder | None:
    if record is None:
        return None
    from mighty.trace import Recorder

    recorder = Recorder(Path(record) if record else None, flush=flush)
    click.echo(f"mty: recording to {recorder.path}", err=True)
    return recorder


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A recorded value as plain JSON: results and variants as objects, bytes as base64,
    resources by name; never a Python repr unless the value is of no known kind."""
    import base64
    import math

    from mighty.abi import Err, Ok, Some, Variant
    from mighty.trace import HandleRef

    if depth > 64:
        return "..."
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return {"bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, Ok | Err | Some):
        key = "ok" if isinstance(value, Ok) else "err" if isinstance(value, Err) else "some"
        return {key: _jsonable(value.value, depth + 1)}
    if isinstance(value, Variant):
        return {value.case: _jsonable(value.value, depth + 1)}  # as `mty call --json` writes
    if isinstance(value, HandleRef):
        return {"resource": f"{value.interface}/{value.name}", "rep": value.rep}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(item, depth + 1) for item in value]
    if isinstance(value, dict):
        if all(isinstance(key, str) for key in value):
            return {key: _jsonable(item, depth + 1) for key, item in value.items()}
        return [[_jsonable(k, depth + 1), _jsonable(v, depth + 1)] for k, v in value.items()]
    return repr(value)[:200]


def _policy(
    env: Sequence[str],
    guest_args: Sequence[str],
    stdin: Path | None,
    dirs: Sequence[str],
    clock: str,
    seed: int | None,
) -> Policy:
    from mighty.wasi import Policy

    pairs = []
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput(f"--env takes KEY=VALUE, got {item!r}")
        pairs.append((key, value))
    data = b""
    if stdin is not None:
        try:
            data = sys.stdin.buffer.read() if str(stdin) == "-" else stdin.read_bytes()
        except OSError as exc:
            raise BadInput(f"--stdin {stdin}: {exc.strerror}") from None
    policy = Policy(env=tuple(pairs), args=tuple(guest_args), stdin=data, seed=seed)
    policy = policy.with_clock(clock)  # type: ignore[arg-type] # click.Choice checked it
    for spec in dirs:
        parts = spec.split(":")
        # Read-only unless asked for: the same default as Policy.with_dir and manifests.
        readonly = not (len(parts) == 3 and parts[2] == "rw")
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
            raise BadInput(
                f"--dir takes HOST:GUEST (read-only) or HOST:GUEST:rw (read-write), got {spec!r}"
            )
        host = Path(parts[0])
        if not host.is_dir():
            raise BadInput(f"--dir {spec}: {host} is not a directory")
        try:
            policy = policy.with_dir(host.resolve(), parts[1], readonly=readonly)
        except ValueError as exc:
            raise BadInput(f"--dir {spec}: {exc}") from None
    return policy


def _http(policy: Policy, origins: Sequence[str], secrets: Sequence[tuple[str, str]]) -> Policy:
    from mighty.wasi import Origin, Secret

    granted = {str(Origin.parse(o)): o for o in origins}
    attached: dict[str, list[Secret]] = {key: [] for key in granted}
    for origin, spec in secrets:
        key = str(Origin.parse(origin))
        if key not in attached:
            raise BadInput(f"--http-secret {origin}: that origin has no --allow-http")
        attached[key].append(Secret.parse(spec))
    for key, origin in granted.items():
        policy = policy.with_http(origin, secrets=attached[key])
    return policy


def _outputs_json(instance: Instance) -> dict[str, object]:
    out: dict[str, object] = {}
    for name, capture in (("stdout", instance.stdout), ("stderr", instance.stderr)):
        out[name] = capture.getvalue().decode("utf-8", "replace")
        if capture.truncated:
            out[f"{name}_truncated"] = True
    return out


def _guest_failure_json(exc: GuestError, instance: Instance) -> NoReturn:
    document: dict[str, object] = {"ok": False, "error": {"kind": exc.kind, "message": exc.message}}
    if exc.usage is not None:
        document["usage"] = exc.usage.to_json()
    document.update(_outputs_json(instance))
    code = EXIT_GUEST
    if isinstance(exc, Cancelled) and exc.signal is not None:
        code = _signal_exit(exc.signal)
    click.echo(json.dumps(document))
    sys.exit(code)


def _exit_status(code: int) -> int:
    """A guest's exit status as ours: 0-255 as it is; anything else (which a shell would
    truncate, 256 reading as success) is 1."""
    return code if 0 <= code <= 255 else EXIT_GUEST


def _guest_exit(exc: GuestExit, instance: Instance, *, as_json: bool, command: bool) -> NoReturn:
    """The guest called wasi:cli/exit: its status becomes ours; 0 is success.

    A command says nothing of its own exit (as ``wasmtime run``); a function call that exits
    non-zero still gets its one ``mty: error`` line."""
    status = _exit_status(exc.code)
    if as_json:
        document: dict[str, object] = {"ok": status == 0, "exit_code": status}
        if status == 0 and not command:
            document["result"] = None  # the function never returned a value
        elif status != 0:
            document["error"] = {"kind": exc.kind, "message": exc.message}
        if exc.usage is not None:
            document["usage"] = exc.usage.to_json()
        document.update(_outputs_json(instance))
        click.echo(json.dumps(document))
    else:
        _echo_guest_output(instance)
        if status != 0 and not command:
            click.echo(f"mty: error: {escape_control(exc.message)}", err=True)
    sys.exit(status)


def _command_done(result: object, usage: object, instance: Instance, *, as_json: bool) -> NoReturn:
    """wasi:cli/run returned: ``ok`` is exit status 0, ``err`` 1 (as wasmtime)."""
    from mighty.abi import Ok

    status = EXIT_OK if isinstance(result, Ok) else EXIT_GUEST
    if as_json:
        document: dict[str, object] = {"ok": status == 0, "exit_code": status, "usage": usage}
        if status != 0:
            message = "the command's wasi:cli/run returned an error"
            document["error"] = {"kind": "guest_exit", "message": message}
        document.update(_outputs_json(instance))
        click.echo(json.dumps(document))
    else:
        _echo_guest_output(instance)
    sys.exit(status)


def _echo_guest_output(instance: Instance) -> None:
    _write_bytes(sys.stdout, instance.stdout.getvalue())
    _write_bytes(sys.stderr, instance.stderr.getvalue())
