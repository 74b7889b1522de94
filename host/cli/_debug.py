"""`mty trace export`: a trace as a timeline other tools open (Chrome trace-event JSON).

It lives here, joined to the `mty trace` group in ``mighty.cli.__init__``, so the debugging
commands' code does not grow ``_main.py`` (which several people edit). Rejected: a separate
top-level command (``mty timeline``): exporting is a thing done to a trace, beside ``mty trace
show``.
"""

from __future__ import annotations

from pathlib import Path

import click

from mighty.cli._main import _errors

__all__ = ["trace_export_command"]


@click.command("export")
@click.argument("path", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--format",
    "form",
    type=click.Choice(["chrome"]),
    default="chrome",
    show_default=True,
    help="chrome: trace-event JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Where to write it (default: PATH with .json).",
)
@click.option("--no-imports", is_flag=True, help="Leave out the instants for imports.")
def trace_export_command(path: Path, form: str, output: Path | None, no_imports: bool) -> None:
    """Write PATH as a Chrome trace-event timeline.

    Perfetto (ui.perfetto.dev) and chrome://tracing open it.

    One track per agent, a span per message (body and reply decoded), an instant per import, a
    flow per ask. The time axis is the order of the run, one microsecond a record: a trace
    holds no wall time."""
    from mighty.trace import write_chrome_trace

    with _errors(as_json=False):
        target = output or path.with_suffix(".json")
        count = write_chrome_trace(path, target, imports=not no_imports)
        click.echo(f"{target}: {count} events ({form} trace-event JSON)")
