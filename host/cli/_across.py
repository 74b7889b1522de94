"""`mty replay A.bin B.bin --agent a:counter:1` (or a directory): a migrated agent's history.

The logic is ``mighty.trace.replay_across``; this prints its report. A divergence exits 1 as
`mty replay` does; a history that does not join up (a missing trace, a broken link) exits 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from mighty._errors import BadInput

__all__ = ["replay_across_command"]


def replay_across_command(
    traces: Sequence[Path],
    agent: str | None,
    limits: Any,
    component_dirs: Sequence[Path],
    changed: Path | None,
    as_json: bool,
) -> None:
    """Replay ``agent`` across ``traces``; print the segments (or one JSON object)."""
    from mighty.trace import NondeterminismError, replay_across

    if agent is None:
        raise BadInput("several traces: pass --agent NODE:TYPE:PID (its first address)")
    if changed is not None:
        raise BadInput("--component replays one trace; give a single TRACE with it")
    try:
        report = replay_across(traces, agent, limits=limits, component_dirs=component_dirs)
    except NondeterminismError as exc:
        if as_json:
            error = {"kind": "nondeterminism", "message": exc.message, "step": exc.step}
            click.echo(json.dumps({"ok": False, "error": {**error, "instance": exc.instance}}))
        else:
            click.echo(f"mty: NondeterminismError: {exc.message}", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(report.to_json()))
        return
    for segment in report.segments:
        exports = sum(i.exports for i in segment.report.instances)
        imports = sum(i.imports for i in segment.report.instances)
        moved = f"; moved on with state {segment.snapshot[:12]}" if segment.snapshot else ""
        click.echo(
            f"{segment.address} ({segment.path}): {len(segment.report.instances)} instance(s), "
            f"{exports} export call(s), {imports} import(s) replayed{moved}"
        )
    click.echo(f"ok: {len(report.segments)} node(s), digest {report.digest}")
