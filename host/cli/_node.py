"""`mty node mighty.toml`: run an agent system as one node of a cluster, until a signal.

Assembled by ``mighty.cluster.NodeApplication`` (what a Python user runs to get the same node);
this module parses options, prints, and waits for a signal. The manifest's ``[cluster]`` block
says how to join (see mighty.cluster); its agents,
``[supervisor]`` tree and ``[[start]]`` messages are as for `mty run`. The node whose name is
``[cluster.supervisor] node`` (default: the first peer) also runs the cluster supervisor and
sends the start messages; every other node stands by to take the supervisor over if that node
dies (mighty.cluster.SupervisorLease). Exit status: 0 after SIGINT/SIGTERM with nothing left
unhandled, 1 otherwise, 2 on a bad manifest or when the cluster cannot be joined.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from mighty._errors import BadInput
from mighty.cli._main import _control_refused, _control_socket, _errors
from mighty.cli._progress import Waits
from mighty.cli._reach import check_nats_reachable
from mighty.cli._run import _OutputWriter, _Signals, _start_messages, _summary

__all__ = ["node_command"]

_SLICE = 0.05


@click.command("node")
@click.argument("manifest", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--name", help="This node's name (default: [cluster] node).")
@click.option("--server", "servers", multiple=True, help="NATS server URL; repeatable.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Least severe agent line shown.",
)
@click.option("-q", "--quiet", is_flag=True, help="No agent output and no progress on stderr.")
@click.option(
    "--record",
    "record",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Record every agent of this node to this trace (its header names the node).",
)
def node_command(
    manifest: Path,
    name: str | None,
    servers: tuple[str, ...],
    as_json: bool,
    log_level: str,
    quiet: bool,
    record: Path | None,
) -> None:
    """Join the cluster of MANIFEST's [cluster] block and serve its agents until Ctrl-C."""
    from mighty.agents import load_manifest
    from mighty.agents.hosting import level_number
    from mighty.cluster import NodeApplication

    threshold = level_number(log_level)
    with _Signals() as signals, _errors(as_json):
        spec, base = load_manifest(manifest)
        config = NodeApplication.cluster_config(spec, base, manifest, servers)
        check_nats_reachable(config.servers, min(config.connect_timeout, 5.0))  # before builds
        with Waits(not quiet) as show:
            app = NodeApplication(
                spec,
                base,
                config,
                name=name,
                on_output=None if quiet else _OutputWriter(threshold),
                recorder=_recorder(record, name or config.node),
                progress=show,
                on_note=lambda text: click.echo(f"mty: {text}", err=True),
            )
        failures: list[str] = []
        replies: list[dict[str, Any]] = []
        try:
            app.start()
            control = _control_server(app.runtime, app.node)
            if control is not None:
                app.on_shutdown(control.stop)
            if app.leads:
                _start_messages(app.runtime, spec.start, signals, replies, failures, as_json)
            while not signals.requested:
                time.sleep(_SLICE)
        finally:
            app.shutdown(interrupt=signals.first)
        runtime, node = app.runtime, app.node
        summary = _summary(runtime, threshold)
        summary["node"] = {
            "name": node.name,
            "sent": node.stats.sent,
            "asked": node.stats.asked,
            "received": node.stats.received,
            "dropped": dict(node.stats.dropped),
        }
        failed = bool(failures) or summary["unhandled"] > 0
        if as_json:
            click.echo(
                json.dumps(
                    {"ok": not failed, "replies": replies, "failures": failures, **summary},
                    default=repr,
                )
            )
        else:
            click.echo(_node_line(node.name, len(summary["agents"]), summary["node"]))
        sys.exit(1 if failed else 0)


def _node_line(name: str, agents: int, stats: dict[str, Any]) -> str:
    """The closing line: ``node a: 2 agent(s); sent 3, asked 1, received 4, dropped none``
    (it printed the stats dict)."""
    dropped = ", ".join(f"{why} {n}" for why, n in sorted(stats["dropped"].items())) or "none"
    return (
        f"node {name}: {agents} agent(s); sent {stats['sent']}, asked {stats['asked']}, "
        f"received {stats['received']}, dropped {dropped}"
    )


def _recorder(record: Path | None, node: str | None) -> Any:
    """The node's recorder (its trace's header names the node: mighty.trace.replay_across)."""
    if record is None:
        return None
    from mighty.trace import Recorder

    return Recorder(record, node=node)


def _control_server(runtime: Any, node: Any) -> Any:
    """The control socket (RUNTIME_CONTROL_SOCK): inspect, top, send, ask, status, and
    migrate for `mty migrate`."""
    import os

    from mighty.control import ENV_VAR, ControlServer, runtime_ops

    path = os.environ.get(ENV_VAR)
    if not path:
        return None

    def status(_args: dict[str, Any]) -> Any:
        return {**_summary(runtime), "node": node.name, "live": node.live_nodes()}

    def migrate(args: dict[str, Any]) -> Any:
        address, target = args.get("address"), args.get("node")
        if not isinstance(address, str) or not isinstance(target, str):
            raise BadInput("migrate takes {address: str, node: str}")
        return node.migrate(address, target).to_json()

    # inspect, top, send and ask as `mty run` serves them (`mty inspect` got unknown_op here).
    ops = {**runtime_ops(runtime), "status": status, "migrate": migrate}
    server = ControlServer(path, ops).start()
    click.echo(f"mty: control socket at {path}", err=True)
    return server


@click.command("migrate")
@click.argument("address")
@click.argument("node")
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(path_type=Path),
    help="Control socket of the node holding ADDRESS (default: $RUNTIME_CONTROL_SOCK).",
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def migrate_command(address: str, node: str, socket_path: Path | None, as_json: bool) -> None:
    """Move the agent at ADDRESS, live, to NODE (state, mailbox; senders keep the address)."""
    from mighty.control import ControlError, request

    with _errors(as_json):
        path = _control_socket(socket_path)
        try:
            # Preparing the target may ship and compile a component (the agent keeps running).
            result = request(path, "migrate", {"address": address, "node": node}, timeout=600)
        except ControlError as exc:
            _control_refused("migration", exc.kind, exc.message, as_json)  # str(exc) repeats kind
        if as_json:
            click.echo(json.dumps({"ok": True, "result": result}))
        else:
            click.echo(
                f"{address}: moved to {result['address']} (paused {result['pause_ms']} ms, "
                f"{result['moved']} queued message(s) moved)"
            )
