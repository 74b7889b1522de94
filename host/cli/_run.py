"""`mty run mighty.toml`: run an agent system until its start messages are done (or Ctrl-C).

The end, either way: the tree is stopped in reverse start order (``Runtime.shutdown``, which
returns within its deadline; after a signal it first interrupts every guest call still running,
whose message then counts as unhandled, so a busy agent does not hold the exit), and the
summary says, per agent, what was handled and what was accepted but left unhandled. Exit
status: 0 when everything accepted was handled and nothing failed, 1 otherwise, 130 on SIGINT
and 143 on SIGTERM (one line, or one JSON object whose error kind is ``cancelled``).

Signals are only *noted* by the handler, never raised: the main thread may be inside a lock of
the runtime, a ctypes callback of wasmtime (an agent's ``init`` runs here) or ``Event.wait``,
and an exception or a lock taken from a handler there corrupts or deadlocks. The main thread
waits in short slices and looks at the note. Rejected: raising ``KeyboardInterrupt`` (as the
other commands do) out of ``start_tree`` or a start message's ask.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from contextlib import suppress
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from mighty._errors import BadInput
from mighty.cli._main import _control_refused, _control_socket, _errors, _write_text
from mighty.cli._progress import Waits

if TYPE_CHECKING:
    from mighty.agents import AgentOutput, StartReply
    from mighty.trace import FlushMode

__all__ = ["run_command"]

_SHUTDOWN_TIMEOUT = 10.0
_SLICE = 0.05
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Signals:
    """SIGINT and SIGTERM while the command runs: the first is remembered, none is raised."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.count = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        for signum in _SIGNALS:
            try:
                self._previous[signum] = signal.signal(signum, self._noted)
            except ValueError:  # not the main thread (click invoked from a test's thread)
                break
        return self

    def _noted(self, signum: int, _frame: FrameType | None) -> None:
        # Plain attribute writes only: no lock may be taken here (see the module docstring).
        if self.first is None:
            self.first = signum
        self.count += 1

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            # After a signal the process is on its way out: a late Ctrl-C must not land in
            # the default handler and print a traceback while the exit unwinds.
            signal.signal(signum, signal.SIG_IGN if self.first is not None else previous)

    @property
    def requested(self) -> bool:
        return self.first is not None


@click.command("run")
@click.argument("manifest", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--record",
    "record",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[TRACE]",
    help="Record every agent to TRACE.",
)
@click.option(
    "--flush",
    type=click.Choice(["record", "call", "os"]),
    default="call",
    show_default=True,
    help="When recorded records reach the OS (docs/determinism.md, Durability).",
)
@click.option("--keep-running", is_flag=True, help="After the start messages, run until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Least severe agent line shown (print() output is info, stderr warning).",
)
@click.option("-q", "--quiet", is_flag=True, help="No agent output and no progress on stderr.")
@click.option(
    "--introspect",
    is_flag=True,
    help="The introspect capability: inspect snapshots and spans carry message bodies.",
)
@click.option(
    "--shutdown-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=_SHUTDOWN_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="At the end, how long to wait for messages still running before abandoning them "
    "(after Ctrl-C or SIGTERM they are interrupted at once).",
)
@click.option(
    "--http",
    "http",
    metavar="HOST:PORT",
    help="Serve the manifest's [http] routes here (default: its [http] listen); keeps running.",
)
def run_command(
    manifest: Path,
    record: str | None,
    flush: FlushMode,
    keep_running: bool,
    as_json: bool,
    log_level: str,
    quiet: bool,
    introspect: bool,
    shutdown_timeout: float,
    http: str | None,
) -> None:
    """Run the agents, supervision tree and start messages of MANIFEST.

    Each agent's log() lines and print() output (its stdout and stderr) are shown on stderr as
    they are written, prefixed with the agent's address; --json also carries each agent's last
    lines (at most 200 lines and 64 KiB per agent) in the summary. With an [http] block that
    has a listen address, or --http HOST:PORT, its routes are served (docs/serve.md) until
    Ctrl-C.
    """
    # Imported here: `mty --version` needs no runtime.
    from mighty.agents import Application
    from mighty.agents.hosting import level_number

    threshold = level_number(log_level)
    with _Signals() as signals, _errors(as_json):
        with Waits(not quiet) as show:
            events = _EventWriter(threshold)
            app = Application.from_manifest(
                manifest,
                record=(Path(record) if record else True) if record is not None else None,
                flush=flush,
                on_output=None if quiet else _OutputWriter(threshold),
                on_event=None if quiet else events,
                introspect=introspect,
                progress=show,
            )
        # With telemetry on, events go to the exporter, not to stderr.
        events.enabled = app.telemetry is None
        if signals.first is not None:  # while building: nothing ran yet
            app.shutdown()
            _cancelled(signals.first, [], [], None, as_json)
        control = _control_server(app)
        if control is not None:
            app.on_shutdown(control.stop)
        routes = app.manifest.http
        if http is not None and routes is None:
            app.shutdown()
            raise BadInput(f"--http: {manifest} has no [http] block (docs/serve.md)")
        serving = routes is not None and (http is not None or routes.listen is not None)
        keep_running = keep_running or serving

        def started(_root: Any) -> None:
            if serving:
                log = None if quiet else (lambda line: click.echo(line, err=True))
                front = app.serve_http(http, log=log)
                assert front.address is not None
                host, port = front.address
                shown = f"[{host}]" if ":" in host else host
                # Always said, quiet or not: with port 0 it is the only way to learn the port.
                click.echo(f"mty: serving [http] on http://{shown}:{port}", err=True)
            if keep_running:
                click.echo("mty: running; Ctrl-C to stop", err=True)

        def replied(reply: StartReply) -> None:
            if not as_json:
                click.echo(
                    f"{reply.to} <- {reply.message}: {json.dumps(reply.reply, default=repr)}"
                )

        def failed(to: str, message: str, why: str) -> None:
            if not as_json:
                click.echo(f"{to} <- {message}: error: {why}", err=True)

        report = app.run(
            keep_running=keep_running,
            interrupted=lambda: signals.requested,
            on_started=started,
            on_reply=replied,
            on_failure=failed,
            threshold=threshold,
            timeout=shutdown_timeout,
            # A signal interrupts the guest calls still running: they are not waited for.
            signal=lambda: signals.first,
        )
        replies = [r.to_json() for r in report.replies]
        if signals.first is not None:
            _cancelled(signals.first, replies, report.failures, report.summary, as_json)
        if as_json:
            click.echo(json.dumps(report.to_json(), default=repr))
        else:
            _print_summary(report.summary, report.supervisor)
        sys.exit(0 if report.ok else 1)


def _start_messages(
    runtime: Any,
    items: list[Any],
    signals: _Signals,
    replies: list[dict[str, Any]],
    failures: list[str],
    as_json: bool,
) -> None:
    """Send the manifest's start messages in order (waiting for asks), until a signal."""

    def replied(reply: StartReply) -> None:
        replies.append(reply.to_json())
        if not as_json:
            click.echo(f"{reply.to} <- {reply.message}: {json.dumps(reply.reply, default=repr)}")

    def failed(to: str, message: str, why: str) -> None:
        if not as_json:
            click.echo(f"{to} <- {message}: error: {why}", err=True)

    from mighty.agents.hosting import send_start_messages

    _, failed_lines = send_start_messages(
        runtime, items, interrupted=lambda: signals.requested, on_reply=replied, on_failure=failed
    )
    failures.extend(failed_lines)


def _cancelled(
    signum: int,
    replies: list[dict[str, Any]],
    failures: list[str],
    summary: dict[str, Any] | None,
    as_json: bool,
) -> None:
    """Report the signal that stopped the run, in one line or one JSON object, and exit."""
    name = signal.Signals(signum).name
    how = "interrupted" if signum == signal.SIGINT else "terminated"
    left = [] if summary is None else [a for a in summary["agents"] if a["unhandled"]]
    total = 0 if summary is None else summary["unhandled"]
    message = f"{how} by {name}; {total} accepted message(s) left unhandled"
    if left:
        message += ": " + ", ".join(f"{_label(a)} {a['unhandled']}" for a in left)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": False,
                    "error": {"kind": "cancelled", "message": message, "signal": name},
                    "replies": replies,
                    "failures": failures,
                    **(summary or {"agents": [], "workers": [], "events": {}, "unhandled": 0}),
                },
                default=repr,
            )
        )
    else:
        click.echo(f"mty: {message}", err=True)
    sys.exit(128 + signum)


def _label(agent: dict[str, Any]) -> str:
    return f"{agent['address']} ({agent['name']})" if agent["name"] else str(agent["address"])


class _EventWriter:
    """Telemetry off: what agents emit() becomes one structured line on stderr
    (``[address] event NAME {json}``), at info level."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        from mighty.agents.hosting import level_number

        self._level = level_number
        self.enabled = True
        self._lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        if not self.enabled:
            return
        kind = event.kind
        if not kind.startswith("agent.") or kind in ("agent.crashed", "agent.restarted"):
            return
        if self._level("info") < self.threshold:
            return
        if "body" in event.data:  # the guest's emit()
            fields = json.dumps(event.data["body"], default=repr, sort_keys=True)
            line = f"[{event.address}] event {kind[len('agent.') :]} {fields}\n"
        else:  # the runtime's own (hibernated, woke, recovered): not the agent's words
            line = f"mty: {event.address} {kind[len('agent.') :]}\n"
        with self._lock, suppress(OSError, ValueError):
            _write_text(sys.stderr, line)


def _control_server(app: Any) -> Any:
    """The local control socket, when RUNTIME_CONTROL_SOCK names a path (opt-in)."""
    from mighty.control import ENV_VAR, ControlServer, application_ops

    path = os.environ.get(ENV_VAR)
    if not path:
        return None
    server = ControlServer(path, application_ops(app)).start()
    click.echo(f"mty: control socket at {path}", err=True)
    return server


class _OutputWriter:
    """Agent lines to stderr as they come (from any worker thread), one whole line at a time.

    Each line of a multi-line text gets the address, so no agent's text can pass for
    another's; on a terminal the text is escaped like all guest output (see _main).
    """

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        from mighty.agents.hosting import level_number

        self._level = level_number
        self._lock = threading.Lock()

    def __call__(self, item: AgentOutput) -> None:
        if self._level(item.level) < self.threshold:
            return
        if item.stream == "log":
            head = f"[{item.address}] {item.level}: "
        elif item.stream == "stderr":
            head = f"[{item.address}] stderr: "
        else:
            head = f"[{item.address}] "
        text = "".join(f"{head}{line}\n" for line in item.text.split("\n"))
        with self._lock, suppress(OSError, ValueError):
            _write_text(sys.stderr, text)


def _summary(runtime: Any, threshold: int = 0) -> dict[str, Any]:
    from mighty.agents.hosting import run_summary

    return run_summary(runtime, threshold)


def _print_summary(summary: dict[str, Any], state: str) -> None:
    click.echo(f"supervisor: {state}")
    for agent in summary["agents"]:
        name = f" ({agent['name']})" if agent["name"] else ""
        click.echo(
            f"  {agent['address']}{name}: handled {agent['handled']}, failed {agent['failed']}, "
            f"crashes {agent['crashes']}, restarts {agent['restarts']}, "
            f"unhandled {agent['unhandled']}, fuel {agent['fuel']}"
        )
    for worker in summary["workers"]:
        click.echo(
            f"  {worker['name']}: {worker['messages']} messages in {worker['batches']} batches, "
            f"{worker['steals']} steals"
        )
    if summary["events"]:
        click.echo(
            "  events: " + ", ".join(f"{k} x{v}" for k, v in sorted(summary["events"].items()))
        )
    if summary["unhandled"]:
        click.echo(f"  left unhandled: {summary['unhandled']} accepted message(s)")
    hibernation = summary.get("hibernation")
    if hibernation:
        click.echo(
            f"  hibernation: {hibernation['hibernated']} asleep, "
            f"{hibernation['hibernations']} hibernations, {hibernation['wakes']} wakes "
            f"(p50 {hibernation['wake_ms_p50']} ms), {hibernation['recovered']} recovered"
        )


@click.command("reload")
@click.argument("agent_type")
@click.option(
    "--from",
    "source",
    required=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="The new component.",
)
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(path_type=Path),
    help="Control socket (default: $RUNTIME_CONTROL_SOCK).",
)
@click.option(
    "--drain-timeout",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds to wait for in-flight messages.",
)
@click.option(
    "--verify",
    "verify",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Run this eval suite with the new component first; refuse unless every cell passes.",
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
def reload_command(
    agent_type: str,
    source: Path,
    socket_path: Path | None,
    drain_timeout: float,
    verify: Path | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Hot-swap AGENT_TYPE in a running `mty run` to the component --from NEW.wasm."""
    from mighty.control import ControlError, request

    with _errors(as_json):
        path = _control_socket(socket_path)
        if not source.is_file():
            raise BadInput(f"{source}: no such file")
        if verify is not None:
            from mighty.cli._eval import refuse_swap, verify_swap

            # Before the request: a refused swap never reaches the running side.
            failing = verify_swap(verify, agent_type, source, quiet=quiet or as_json)
            if failing:
                refuse_swap(failing, as_json)
        try:
            # The running side compiles the new component first: tens of seconds, once.
            with Waits(not quiet) as show:
                show.wait(f"reloading {agent_type} from {source}")
                result = request(
                    path,
                    "reload",
                    {
                        "agent_type": agent_type,
                        "component": str(source.resolve()),
                        "drain_timeout": drain_timeout,
                    },
                    timeout=drain_timeout + 120,
                )
        except ControlError as exc:
            _control_refused("reload", exc.kind, exc.message, as_json)  # str(exc) repeats kind
        if as_json:
            click.echo(json.dumps({"ok": True, "result": result}))
        else:
            click.echo(
                f"{agent_type}: swapped {len(result['agents'])} agent(s) to "
                f"{result['new_component'][:12]} (longest pause {result['max_pause_ms']} ms)"
            )
