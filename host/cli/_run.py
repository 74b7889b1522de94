"""`mty run mighty.toml`: run an agent system until its start messages are done (or Ctrl-C)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import click

from mighty._errors import BadInput
from mighty.cli._main import _errors, _progress

__all__ = ["run_command"]


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
@click.option("--keep-running", is_flag=True, help="After the start messages, run until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
def run_command(manifest: Path, record: str | None, keep_running: bool, as_json: bool) -> None:
    """Run the agents, supervision tree and start messages of MANIFEST."""
    from mighty.agents import AgentError, Runtime, start_tree
    from mighty.agents._manifest import agent_types, load_manifest, supervisor_spec
    from mighty.trace import Recorder

    with _errors(as_json):
        spec, base = load_manifest(manifest)
        show = _progress(sys.stderr.isatty() and not as_json)
        types = agent_types(spec, base, show)
        recorder = Recorder(Path(record) if record else None) if record is not None else None
        failures: list[str] = []
        replies: list[dict[str, Any]] = []
        stop = threading.Event()
        runtime = Runtime(workers=spec.workers, recorder=recorder)
        control = _control_server(runtime)
        try:
            for agent_type in types:
                runtime.register(agent_type)
            root = start_tree(
                runtime, supervisor_spec(spec.supervisor), on_failed=lambda why: stop.set()
            )
            for item in spec.start:
                try:
                    if item.ask:
                        reply = runtime.ask(item.to, item.message, item.body, timeout=item.timeout)
                        replies.append({"to": item.to, "message": item.message, "reply": reply})
                        if not as_json:
                            click.echo(
                                f"{item.to} <- {item.message}: {json.dumps(reply, default=repr)}"
                            )
                    else:
                        runtime.send(item.to, item.message, item.body)
                except AgentError as exc:
                    failures.append(f"{item.to} <- {item.message}: {exc.message}")
                    if not as_json:
                        click.echo(f"{item.to} <- {item.message}: error: {exc.message}", err=True)
            if keep_running:
                _wait_for_interrupt(stop)
            runtime.drain()
        finally:
            if control is not None:
                control.stop()
            summary = _summary(runtime)
            runtime.shutdown(drain=False)
            if recorder is not None:
                recorder.close()
        failed = root.state == "failed" or bool(failures)
        if as_json:
            click.echo(
                json.dumps(
                    {"ok": not failed, "replies": replies, "failures": failures, **summary},
                    default=repr,
                )
            )
        else:
            _print_summary(summary, root.state)
        sys.exit(1 if failed else 0)


def _control_server(runtime: Any) -> Any:
    """The local control socket, when RUNTIME_CONTROL_SOCK names a path (opt-in)."""
    from mighty.control import ENV_VAR, ControlServer

    path = os.environ.get(ENV_VAR)
    if not path:
        return None

    def reload(args: dict[str, Any]) -> Any:
        agent_type, component = args.get("agent_type"), args.get("component")
        if not isinstance(agent_type, str) or not isinstance(component, str):
            raise BadInput("reload takes {agent_type: str, component: path}")
        timeout = float(args.get("drain_timeout", 5.0))
        return runtime.reload(agent_type, component, drain_timeout=timeout).to_json()

    def status(_args: dict[str, Any]) -> Any:
        return _summary(runtime)

    server = ControlServer(path, {"reload": reload, "status": status}).start()
    click.echo(f"mty: control socket at {path}", err=True)
    return server


def _wait_for_interrupt(stop: threading.Event) -> None:
    def interrupted(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        click.echo("mty: running; Ctrl-C to stop", err=True)
        while not stop.wait(0.2):
            pass
    finally:
        signal.signal(signal.SIGINT, previous)


def _summary(runtime: Any) -> dict[str, Any]:
    agents = [
        {
            "address": p.address,
            "name": p.name,
            "handled": p.stats.handled,
            "failed": p.stats.failed,
            "crashes": p.stats.crashes,
            "restarts": p.stats.restarts,
            "fuel": p.stats.fuel,
            "mailbox_high_water": p.mailbox.high_water,
        }
        for p in runtime.agents()
    ]
    workers = [
        {"name": w.name, "messages": w.messages, "batches": w.batches, "steals": w.steals}
        for w in runtime.worker_stats()
    ]
    events: dict[str, int] = {}
    for event in list(runtime.events):
        events[event.kind] = events.get(event.kind, 0) + 1
    return {"agents": agents, "workers": workers, "events": events}


def _print_summary(summary: dict[str, Any], state: str) -> None:
    click.echo(f"supervisor: {state}")
    for agent in summary["agents"]:
        name = f" ({agent['name']})" if agent["name"] else ""
        click.echo(
            f"  {agent['address']}{name}: handled {agent['handled']}, failed {agent['failed']}, "
            f"crashes {agent['crashes']}, restarts {agent['restarts']}, fuel {agent['fuel']}"
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
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def reload_command(
    agent_type: str, source: Path, socket_path: Path | None, drain_timeout: float, as_json: bool
) -> None:
    """Hot-swap AGENT_TYPE in a running `mty run` to the component --from NEW.wasm."""
    from mighty.control import ENV_VAR, ControlError, request

    with _errors(as_json):
        path = socket_path or os.environ.get(ENV_VAR)
        if not path:
            raise BadInput(f"no control socket: pass --socket or set {ENV_VAR}")
        if not source.is_file():
            raise BadInput(f"{source}: no such file")
        try:
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
            if as_json:
                click.echo(
                    json.dumps({"ok": False, "error": {"kind": exc.kind, "message": str(exc)}})
                )
            else:
                click.echo(f"mty: reload refused: {exc}", err=True)
            sys.exit(1)
        if as_json:
            click.echo(json.dumps({"ok": True, "result": result}))
        else:
            click.echo(
                f"{agent_type}: swapped {len(result['agents'])} agent(s) to "
                f"{result['new_component'][:12]} (longest pause {result['max_pause_ms']} ms)"
            )
