"""`mty exec`: run a Python file (or stdin) in a fresh code-mode sandbox.

Text mode writes what the code controls (its output, value, error) through ``_write_text``:
control characters are escaped when the stream is a terminal, and a character the stream's
encoding cannot hold is written as an escape rather than failing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from mighty.cli._main import (
    EXIT_GUEST,
    EXIT_OK,
    EXIT_USAGE,
    _errors,
    _Size,
    _write_text,
    escape_control,
)
from mighty.cli._progress import Waits

__all__ = ["exec_command"]


@click.command("exec")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False, allow_dash=True))
@click.option("--fuel", type=click.IntRange(min=1), help="Fuel for the run (default 10^10).")
@click.option("--memory", type=_Size(), help="Memory ceiling, e.g. 64MiB (default 128MiB).")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Wall-clock seconds (default 5).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the RunResult as one JSON object.")
@click.option("-q", "--quiet", is_flag=True, help="No progress messages.")
def exec_command(
    file: Path,
    fuel: int | None,
    memory: int | None,
    timeout: float | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Run FILE ('-' for stdin) as Python in a fresh sandbox: no files, no network, no tools.

    Without --json the code's stdout and stderr are passed through, then the result's value
    (as JSON) or the error. Exit status: 0 ok, 1 the code failed, 2 bad usage.
    """
    from mighty._errors import BadInput
    from mighty.sandbox import Limits, Sandbox

    with _errors(as_json):
        try:
            raw = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
        except OSError as exc:
            raise BadInput(f"cannot read {file}: {exc.strerror}") from None
        try:
            code = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadInput(f"{file} is not UTF-8 text") from None
        changes: dict[str, int | float | None] = {
            "fuel": fuel,
            "memory": memory,
            "timeout": timeout,
        }
        try:
            limits = Limits().replace(**{k: v for k, v in changes.items() if v is not None})
        except (TypeError, ValueError) as exc:
            raise BadInput(str(exc)) from None
        with Waits(not quiet) as show:
            sandbox = Sandbox(limits=limits, pool=0, progress=show)
        with sandbox:
            result = sandbox.run(code)
        if as_json:
            click.echo(json.dumps(result.to_json()))
        else:
            _write_text(sys.stdout, result.stdout)
            _write_text(sys.stderr, result.stderr)
            if result.ok:
                if result.value is not None:
                    value = json.dumps(result.value, indent=2, ensure_ascii=False)
                    _write_text(sys.stdout, value + "\n")
            else:
                assert result.error is not None
                message = escape_control(result.error.message)  # an error line: always
                if result.error.traceback:
                    _write_text(sys.stderr, result.error.traceback.rstrip("\n") + "\n")
                    # The traceback showed it whole (a SyntaxError's source and caret): once.
                    message = (message.strip().splitlines() or [""])[-1]
                _write_text(sys.stderr, f"mty: {result.error.kind}: {message}\n")
        sys.exit(EXIT_OK if result.ok else EXIT_GUEST)


_ = EXIT_USAGE  # usage errors exit with 2 through click and _errors
