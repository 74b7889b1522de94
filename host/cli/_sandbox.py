"""`mty exec`: run a Python file (or stdin) in a fresh code-mode sandbox."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from mighty.cli._main import EXIT_GUEST, EXIT_OK, EXIT_USAGE, _errors, _progress, _Size

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
def exec_command(
    file: Path, fuel: int | None, memory: int | None, timeout: float | None, as_json: bool
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
        show = _progress(not as_json and sys.stderr.isatty())
        with Sandbox(limits=limits, pool=0, progress=show) as sandbox:
            result = sandbox.run(code)
        if as_json:
            click.echo(json.dumps(result.to_json()))
        else:
            sys.stdout.write(result.stdout)
            sys.stderr.write(result.stderr)
            if result.ok:
                if result.value is not None:
                    click.echo(json.dumps(result.value, indent=2, ensure_ascii=False))
            else:
                assert result.error is not None
                if result.error.traceback:
                    click.echo(result.error.traceback.rstrip("\n"), err=True)
                click.echo(f"mty: {result.error.kind}: {result.error.message}", err=True)
        sys.exit(EXIT_OK if result.ok else EXIT_GUEST)


_ = EXIT_USAGE  # usage errors exit with 2 through click and _errors
