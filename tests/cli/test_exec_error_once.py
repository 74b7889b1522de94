"""`mty exec`: a syntax error's source and caret are shown once, then one summary line."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from mighty import Component
from mighty.cli import main


def test_syntax_error_is_printed_once(interpreter: Component, tmp_path: Path) -> None:
    """The traceback shows the line and caret; the closing mty line only names the error."""
    bad = tmp_path / "bad.py"
    bad.write_text("x = (1\n")
    done = CliRunner().invoke(main, ["exec", str(bad), "-q"])
    assert done.exit_code == 1
    assert done.stderr.count("x = (1") == 1, done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == (
        "mty: exception: SyntaxError: '(' was never closed"
    )
