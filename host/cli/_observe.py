"""`mty inspect` and `mty top`: a running `mty run`, seen through its control socket.

Both only parse, ask the socket (ops ``inspect`` and ``top``, see mighty.control) and render
with rich. ``top`` reads keys in cbreak mode (no echo, no line buffering; Ctrl-C still
signals) and always restores the terminal, whatever ends it: q, Ctrl-C, or the runtime going
away mid-view (one line, exit 1).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from mighty._errors import BadInput
from mighty.cli._main import _control_socket, _errors, _fail, escape_control

__all__ = ["inspect_agents_command", "top_command"]

_SOCKET_HELP = "Control socket (default: $RUNTIME_CONTROL_SOCK)."
_PIPED_WIDTH = 10_000
"""Columns when stdout is not a terminal: a tree or table piped to a file or `less` keeps its
whole lines (rich assumes 80 columns there, and cut them)."""


def _console() -> Any:
    """A rich console for stdout: the terminal's width, or no practical limit when piped."""
    from rich.console import Console

    width = None if sys.stdout.isatty() else _PIPED_WIDTH
    return Console(highlight=False, soft_wrap=True, width=width)


def _ask(path: str, op: str, args: dict[str, Any], as_json: bool) -> Any:
    """One control request; a ControlError becomes one line (exit 2 for a bad request or an
    unknown agent, 1 when the runtime cannot be reached)."""
    from mighty.control import ControlError, request

    try:
        return request(path, op, args, timeout=10.0)
    except ControlError as exc:
        usage = exc.kind in ("noproc", "bad_input", "bad_request", "unknown_op")
        _fail(str(exc), as_json=as_json, kind=exc.kind, code=2 if usage else 1)


# -- inspect -------------------------------------------------------------------------------------


@click.command("inspect")
@click.argument("agent", required=False)
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), help=_SOCKET_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as one JSON object.")
def inspect_agents_command(agent: str | None, socket_path: Path | None, as_json: bool) -> None:
    """Show AGENT (an address or a registered name) of a running `mty run`, or the whole tree.

    The snapshot: mailbox depth and high-water mark, the message in flight, budget state,
    restarts and the last messages handled (their bodies only if the runtime was started with
    the introspect capability).
    """
    with _errors(as_json):
        path = _control_socket(socket_path)
        result = _ask(path, "inspect", {"agent": agent} if agent else {}, as_json)
        if as_json:
            click.echo(json.dumps(result))
            return
        console = _console()
        if agent:
            console.print(_agent_tree(result))
        else:
            console.print(_runtime_tree(result))


def _text(value: Any) -> str:
    # rich markup and terminal controls are both neutralised: names come from manifests and
    # guests.
    from rich.markup import escape

    return escape(escape_control(str(value)))


def _agent_label(snap: dict[str, Any]) -> str:
    name = f" ({_text(snap['name'])})" if snap.get("name") else ""
    mailbox = snap["mailbox"]
    flight = snap.get("in_flight")
    doing = (
        f", handling {_text(flight['message'])} for {flight['elapsed_ms']:.0f} ms" if flight else ""
    )
    return (
        f"[bold]{_text(snap['address'])}[/bold]{name} [dim]{_text(snap['type'])}[/dim] "
        f"{_text(snap['state'])}{doing}; mailbox {mailbox['depth']}/{mailbox['capacity']} "
        f"(high {mailbox['high_water']}), handled {snap['handled']}, failed {snap['failed']}, "
        f"restarts {snap['restarts']}"
    )


def _agent_tree(snap: dict[str, Any]) -> Any:
    from rich.tree import Tree

    tree = Tree(_agent_label(snap))
    budget = snap["budget"]
    lifetime_limit = budget["fuel_lifetime_limit"]
    tree.add(f"component {_text(snap['component'][:12])}, parent {_text(snap['parent'])}")
    tree.add(
        f"memory {budget['memory_used']} / {budget['memory_ceiling']} bytes; fuel last message "
        f"{budget['fuel_last_message']} / {budget['fuel_per_message']}, lifetime "
        f"{budget['fuel_lifetime']}"
        + (f" / {lifetime_limit}" if lifetime_limit is not None else "")
        + f"; timeout {budget['timeout_s']:g} s"
    )
    if snap["children"]:
        tree.add("children: " + ", ".join(_text(c) for c in snap["children"]))
    grants = snap.get("grants")
    if grants is not None:
        tree.add(
            "grants: "
            + "; ".join(
                f"{what} {', '.join(_text(n) for n in grants[what]) or 'none'}"
                for what in ("tools", "http", "spawn", "message", "inspect")
            )
        )
    recent = tree.add(f"last {len(snap['recent'])} message(s)")
    for item in snap["recent"]:
        body = f" {_text(json.dumps(item['body']))[:120]}" if "body" in item else ""
        recent.add(
            f"{_text(item['name'])} from {_text(item['sender'])}: {_text(item['outcome'])}, "
            f"{item['duration_ms']:.3f} ms, fuel {item['fuel']}{body}"
        )
    return tree


def _runtime_tree(snap: dict[str, Any]) -> Any:
    from rich.tree import Tree

    root = Tree("[bold]runtime[/bold]")
    nodes: dict[str | None, Any] = {}
    supervisors = {s["name"]: s["parent"] for s in snap["supervisors"]}

    def node(name: str | None) -> Any:
        if name in nodes:
            return nodes[name]
        if name is None:
            return root
        parent = supervisors.get(name)
        # A parent that is an agent (it spawned this one) or a supervisor we know.
        made = node(parent if parent in supervisors else None).add(
            f"[cyan]supervisor {_text(name)}[/cyan]"
        )
        nodes[name] = made
        return made

    for name in supervisors:
        node(name)
    agents = {a["address"]: a for a in snap["agents"]}
    placed: set[str] = set()

    def place(agent: dict[str, Any]) -> None:
        if agent["address"] in placed:
            return
        placed.add(agent["address"])
        parent = agent.get("parent")
        if parent in agents:
            place(agents[parent])
            holder = nodes[parent]
        elif parent in supervisors:
            holder = node(parent)
        else:
            holder = root
        nodes[agent["address"]] = holder.add(_agent_label(agent))

    for agent in snap["agents"]:
        place(agent)
    workers = root.add("workers")
    for worker in snap["workers"]:
        current = f", running {_text(worker['current'])}" if worker["current"] else ""
        workers.add(
            f"{_text(worker['name'])}: queue {worker['queued']}{current}, "
            f"{worker['messages']} messages, {worker['steals']} steals"
        )
    http = snap.get("http")
    if http:
        front = root.add(
            f"http {_text(http['listen'])}: {http['in_flight']} in flight, "
            f"{http['requests']} requests, {http['connections']} connections"
        )
        for route, counts in http["routes"].items():
            front.add(f"{_text(route)}: {_route_counts(counts)}")
    return root


def _route_counts(counts: dict[str, Any]) -> str:
    statuses = ", ".join(f"{k} x{v}" for k, v in counts["statuses"].items()) or "none answered"
    return f"{counts['in_flight']} in flight, {counts['requests']} requests ({statuses})"


# -- top -----------------------------------------------------------------------------------------


@click.command("top")
@click.option("--socket", "socket_path", type=click.Path(path_type=Path), help=_SOCKET_HELP)
@click.option(
    "--interval",
    type=click.FloatRange(0.1, 60.0),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--sort",
    "sort_key",
    default="address",
    show_default=True,
    help="Sort agents by address, type, state, mailbox, msgs_per_s, fuel_per_s or memory.",
)
@click.option("--once", is_flag=True, help="Print one frame (rates over one interval) and exit.")
@click.option("--json", "as_json", is_flag=True, help="With --once: the frame as one JSON object.")
def top_command(
    socket_path: Path | None, interval: float, sort_key: str, once: bool, as_json: bool
) -> None:
    """A live view of a running `mty run`: agents and workers, refreshed every INTERVAL.

    Keys: q quits, s sorts by the next column, r reverses the order. Ctrl-C quits too.
    """
    from mighty.control import SORT_KEYS, sort_rows

    with _errors(as_json):
        path = _control_socket(socket_path)
        if sort_key not in SORT_KEYS:
            raise BadInput(f"--sort {sort_key!r}: choose one of {', '.join(SORT_KEYS)}")
        if as_json and not once:
            raise BadInput("--json needs --once (a live view is for a terminal)")
        if once:
            frame, rows = _sample(path, interval, as_json)
            rows = sort_rows(rows, sort_key)
            if as_json:
                click.echo(
                    json.dumps(
                        {
                            "version": frame["version"],
                            "interval": interval,
                            "agents": rows,
                            "workers": frame["workers"],
                            **({"http": frame["http"]} if "http" in frame else {}),
                        }
                    )
                )
            else:
                _console().print(
                    _top_view(rows, frame["workers"], sort_key, None, frame.get("http"))
                )
            return
        _live(path, interval, sort_key)


def _sample(path: str, interval: float, as_json: bool) -> tuple[dict[str, Any], list[Any]]:
    from mighty.control import top_rows

    first = _ask(path, "top", {}, as_json)
    time.sleep(interval)
    second = _ask(path, "top", {}, as_json)
    return second, top_rows(first, second)


def _top_view(
    rows: list[dict[str, Any]],
    workers: list[dict[str, Any]],
    sort_key: str,
    reverse: bool | None,
    http: dict[str, Any] | None = None,
) -> Any:
    from rich.console import Group
    from rich.table import Table

    order = "" if reverse is None else (" (reversed)" if reverse else "")
    agents = Table(title=f"mty top: {len(rows)} agent(s), sorted by {sort_key}{order}")
    for column in ("address", "type", "state", "mailbox", "msgs/s", "fuel/s", "memory"):
        agents.add_column(column, justify="left" if column in ("address", "type") else "right")
    for row in rows:
        name = f" ({row['name']})" if row.get("name") else ""
        agents.add_row(
            _text(row["address"] + name),
            _text(row["type"]),
            _text(row["state"]),
            str(row["mailbox"]),
            f"{row['msgs_per_s']:.1f}",
            str(row["fuel_per_s"]),
            _bytes(row["memory"]),
        )
    table = Table(title="workers")
    for column in ("worker", "queue", "current", "messages", "steals"):
        table.add_column(column)
    for worker in workers:
        table.add_row(
            _text(worker["name"]),
            str(worker["queued"]),
            _text(worker["current"] or "-"),
            str(worker["messages"]),
            str(worker["steals"]),
        )
    parts: list[Any] = [agents, table]
    if http:
        routes = Table(
            title=f"http {_text(http['listen'])}: {http['in_flight']} in flight, "
            f"{http['requests']} requests"
        )
        for column in ("route", "in flight", "requests", "statuses"):
            left = column in ("route", "statuses")
            routes.add_column(column, justify="left" if left else "right")
        for route, counts in http["routes"].items():
            statuses = " ".join(f"{k}:{v}" for k, v in counts["statuses"].items()) or "-"
            routes.add_row(
                _text(route), str(counts["in_flight"]), str(counts["requests"]), statuses
            )
        parts.append(routes)
    return Group(*parts, "[dim]q quit  s sort  r reverse[/dim]")


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n //= 1024
    return f"{n} GiB"


@contextlib.contextmanager
def _cbreak() -> Iterator[bool]:
    """Keys one at a time without echo, when stdin is a terminal; restored on the way out."""
    try:
        import termios
        import tty

        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
    except (ImportError, OSError, ValueError, AttributeError):
        yield False
        return
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _key(timeout: float, interactive: bool) -> str | None:
    if not interactive:
        time.sleep(timeout)
        return None
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if not ready:
        return None
    data = os.read(sys.stdin.fileno(), 32)
    if not data:
        return "q"  # end of input: nothing more will come
    return data.decode("utf-8", "replace")[-1:]


def _live(path: str, interval: float, sort_key: str) -> None:
    from rich.console import Console
    from rich.live import Live

    from mighty.control import SORT_KEYS, ControlError, request, sort_rows, top_rows

    console = Console(highlight=False)
    reverse: bool | None = None
    previous: dict[str, Any] | None = None
    # Ctrl-C raises KeyboardInterrupt out of here; both context managers restore the terminal
    # first, then _errors reports it in one line (exit 130).
    with _cbreak() as interactive, Live(console=console, auto_refresh=False) as live:
        while True:
            try:
                frame = request(path, "top", {}, timeout=max(5.0, interval * 3))
            except ControlError as exc:
                live.stop()
                _fail(f"the runtime went away: {exc}", as_json=False, kind=exc.kind, code=1)
            rows = top_rows(previous, frame)
            previous = frame
            live.update(
                _top_view(
                    sort_rows(rows, sort_key, reverse=reverse),
                    frame["workers"],
                    sort_key,
                    reverse,
                    frame.get("http"),
                ),
                refresh=True,
            )
            deadline = time.monotonic() + interval
            while (left := deadline - time.monotonic()) > 0:
                key = _key(left, interactive)
                if key in ("q", "Q"):
                    return
                if key == "s":
                    sort_key = SORT_KEYS[(SORT_KEYS.index(sort_key) + 1) % len(SORT_KEYS)]
                    break
                if key == "r":
                    reverse = not (reverse or False)
                    break
