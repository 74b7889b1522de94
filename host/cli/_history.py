"""`mty history` and `mty fork`: a durable agent's stored history, and a new agent from it.

    mty history AGENT [MANIFEST] [--state-dir DIR] [--limit N] [--json]
    mty history AGENT [MANIFEST] [--state-dir DIR] --trace OUT.trace   # for replay / debug
    mty fork AGENT --at N --as NEWNAME [MANIFEST] [--state-dir DIR] [--json]

AGENT is a durable agent's registered name or its address (``orders:1``). The state_dir is
``--state-dir``, else the manifest's ``[runtime] state_dir`` (MANIFEST, default
``mighty.toml``), as `mty run` finds it. history reads only (it takes no lock, so it reads the
store of a running system); fork writes the new agent into the same store and so needs the
runtime stopped (the store's lock). What the entries are and what a fork holds:
mighty.agents._history and docs/durability.md.

Human output is one line per entry (position, kind, summary, time when stored), then a
``… N more`` line past ``--limit``; ``--json`` prints one object. Errors are one line (one
JSON object with ``--json``), exit status 2: an unknown agent, a missing or unreadable
state_dir, a damaged store or log.

Rejected: a positional state_dir (a manifest path and a directory in the same place would be
told apart only by guessing); reading through the control socket of the running system (the
history is what is stored, and a crashed system, the case that matters most, has no socket).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from mighty._errors import BadInput
from mighty.cli._main import _errors, _fail, escape_control

__all__ = ["fork_command", "history_command"]

_STATE_HELP = "The state_dir (default: the manifest's [runtime] state_dir)."


@contextmanager
def _typed(as_json: bool) -> Iterator[None]:
    """Bad input reported with its own kind (``unknown_agent``, ``bad_state_dir``,
    ``fork_refused``), where `mty`'s common handler says ``bad_input`` for all of them."""
    try:
        yield
    except BadInput as exc:
        _fail(exc.message, as_json=as_json, kind=exc.kind)


def _state_dir(manifest: Path | None, state_dir: Path | None) -> Path:
    if state_dir is not None:
        return state_dir
    from mighty.agents import load_manifest
    from mighty.agents.hosting import state_dir as manifest_state_dir

    path = manifest or Path("mighty.toml")
    loaded, base = load_manifest(path)
    found = manifest_state_dir(loaded, base)
    if found is None:
        raise BadInput(f"{path}: no [runtime] state_dir, so no durable agents (or --state-dir)")
    return found


@click.command("history")
@click.argument("agent")
@click.argument("manifest", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--state-dir", type=click.Path(path_type=Path), help=_STATE_HELP)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="Most entries listed; the rest are counted.",
)
@click.option(
    "--trace",
    "trace_out",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Instead, write the message in flight as a trace `mty replay` and `mty debug` run"
    " (the checkpoint restored, then the logged imports).",
)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def history_command(
    agent: str,
    manifest: Path | None,
    state_dir: Path | None,
    limit: int,
    trace_out: Path | None,
    as_json: bool,
) -> None:
    """List durable AGENT's checkpoint, journaled messages and logged imports."""
    with _errors(as_json), _typed(as_json):
        from mighty.agents import read_history
        from mighty.agents.hosting import export_trace

        if trace_out is not None:
            imports = export_trace(_state_dir(manifest, state_dir), agent, trace_out)
            if as_json:
                click.echo(json.dumps({"ok": True, "trace": str(trace_out), "imports": imports}))
            else:
                click.echo(
                    escape_control(
                        f"wrote {trace_out}: {agent} restored from its checkpoint, then its "
                        f"message in flight with {imports} logged import(s)"
                    )
                )
            return
        history = read_history(_state_dir(manifest, state_dir), agent, limit=limit)
        if as_json:
            click.echo(json.dumps({"ok": True, **history.to_json()}))
            return
        who = history.address + (f" ({history.name})" if history.name else "")
        click.echo(escape_control(f"{who}, type {history.type}, in {history.state_dir}"))
        for entry in history.entries:
            line = f"{entry.position:>5}  {entry.kind:<10}  {entry.summary}"
            click.echo(escape_control(line + (f"  [{entry.time}]" if entry.time else "")))
        if history.more:
            click.echo(f"    … {history.more} more, not listed (past --limit or the read bound)")
        if history.torn:
            click.echo("    (the log ends inside a record: a crash mid-write; the rest is whole)")
        if history.stale:
            click.echo("    (the log's message was checkpointed already: no recovery reads it)")


@click.command("fork")
@click.argument("agent")
@click.argument("manifest", required=False, type=click.Path(path_type=Path, dir_okay=False))
@click.option("--at", "at", type=click.IntRange(min=0), required=True, help="The position.")
@click.option("--as", "new_name", required=True, help="The fork's registered name.")
@click.option("--state-dir", type=click.Path(path_type=Path), help=_STATE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print exactly one JSON object.")
def fork_command(
    agent: str,
    manifest: Path | None,
    at: int,
    new_name: str,
    state_dir: Path | None,
    as_json: bool,
) -> None:
    """Store a new durable agent NEWNAME with AGENT's state at history position N."""
    with _errors(as_json), _typed(as_json):
        from mighty.agents import fork_agent

        fork = fork_agent(_state_dir(manifest, state_dir), agent, at, new_name)
        if as_json:
            click.echo(json.dumps({"ok": True, **fork.to_json()}))
            return
        held = f"its checkpoint, {fork.messages} message(s), {fork.imports} logged import(s)"
        click.echo(
            escape_control(
                f"{fork.source} at {fork.at} -> {fork.name} ({fork.address}): {held}; "
                f"a runtime on this state_dir that registers type "
                f"{fork.address.rpartition(':')[0]} runs it"
            )
        )
