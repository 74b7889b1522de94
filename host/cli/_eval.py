"""`mty eval SUITE.toml`: run a suite of recorded cases x members, print verdicts.

Thin: ``mighty.eval.load_suite`` reads the file, ``Suite.run`` runs the cells; this module
prints a table, the evidence of every cell that did not pass, and a summary line. Exit 0 only
when every cell passes, 1 otherwise, 2 for a malformed suite file (one line).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from mighty.cli._main import EXIT_OK, _errors, _fail, _write_text, escape_control
from mighty.cli._progress import Waits

__all__ = ["eval_command", "verify_swap"]

EXIT_FAILED = 1
_NOTE = 72


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def _fuel(cell: Any) -> str:
    if cell.fuel is None:
        return "-"
    if cell.baseline_fuel:
        return f"{cell.fuel:,} ({cell.fuel / cell.baseline_fuel:.2f}x)"
    return f"{cell.fuel:,}"


def render(report: Any) -> str:
    """The table, the evidence of every cell that did not pass, and the summary line."""
    from mighty.eval import evidence_text

    header = ["CASE", "MEMBER", "VERDICT", "FUEL (vs baseline)", "TIME", "NOTE"]
    rows = []
    for cell in report.cells:
        note = cell.reason or "; ".join(c.summary for c in cell.comparisons)
        if cell.live_from:
            note = f"{cell.live_from}; {note}"
        if len(note) > _NOTE:
            note = note[: _NOTE - 3] + "..."
        rows.append(
            [cell.case, cell.member, cell.verdict, _fuel(cell), f"{cell.wall_time:.2f}s", note]
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    widths.append(0)
    lines = [_row(header, widths), *(_row(r, widths) for r in rows)]
    for cell in report.failing():
        lines += ["", f"{cell.name}: {cell.verdict}"]
        lines += ["  " + line for line in evidence_text(cell).splitlines()]
    lines += ["", report.summary()]
    return "\n".join(lines) + "\n"


@click.command("eval")
@click.argument("suite_file", metavar="SUITE.toml", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
@click.option(
    "--junit",
    "junit",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also write the cells as JUnit XML to FILE.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    help="Cells run at once (default: the suite file's, else 2).",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
def eval_command(
    suite_file: Path, as_json: bool, junit: Path | None, workers: int | None, quiet: bool
) -> None:
    """Run every case x member cell of SUITE.toml against its recorded trace.

    Each member's imports are answered from the case's trace while they match (strict: a
    mismatch is `diverged`; live: later calls go to the real import). Exit 0 only when every
    cell passes; 2 for a malformed suite file.
    """
    from mighty.eval import load_suite

    with _errors(as_json):
        suite = load_suite(suite_file, workers=workers)
        with Waits(not quiet and not as_json) as show:
            report = suite.run(progress=show)
        if junit is not None:
            try:
                junit.write_text(report.to_junit(f"mty eval {suite_file}"), "utf-8")
            except OSError as exc:
                _fail(f"cannot write {junit}: {exc.strerror or exc}", as_json=as_json)
        if as_json:
            click.echo(json.dumps(report.to_json()))
        else:
            _write_text(sys.stdout, render(report))
    sys.exit(EXIT_OK if report.ok else EXIT_FAILED)


def verify_swap(suite_file: Path, agent_type: str, component: Path, *, quiet: bool) -> list[str]:
    """Run ``suite_file`` with ``component`` as the member for ``agent_type`` (``mty reload
    --verify``); the failing cells, empty when every cell passed."""
    from mighty import Component
    from mighty.eval import load_suite

    suite = load_suite(suite_file)
    with Waits(not quiet) as show:
        show.wait(f"verifying {component} against {suite_file}")
        loaded = Component.load(component, progress=show)
        return suite.verify_swap(agent_type, loaded)


def refuse_swap(failing: list[str], as_json: bool) -> None:
    """Print that the swap was refused, naming the failing cells, and exit 1."""
    message = f"the verify suite failed {len(failing)} cell(s): " + "; ".join(failing)
    if as_json:
        click.echo(
            json.dumps({"ok": False, "error": {"kind": "verify_failed", "message": message}})
        )
    else:
        click.echo(f"mty: reload refused: {escape_control(message)}", err=True)
    sys.exit(EXIT_FAILED)
