"""Terminal output of guest text escapes control characters; --json stays strict JSON."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.cli._main import _CONTROL, escape_control

ATTACK = "print('\\x1b]0;owned\\x07\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J\\x9b31m done\\tok')"


def _mty() -> list[str]:
    script = Path(sys.executable).parent / "mty"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from mighty.cli import main; sys.exit(main())"]


@given(st.text())
def test_escaped_text_has_no_control_characters(text: str) -> None:
    """After escaping, only newline and tab remain of the control characters."""
    escaped = escape_control(text)
    assert _CONTROL.search(escaped) is None
    assert escaped.count("\n") == text.count("\n")
    assert escaped.count("\t") == text.count("\t")


def test_escapes_are_visible() -> None:
    """ESC, BEL, CSI (C1), DEL and a bidi override become readable escapes."""
    assert escape_control("\x1b]0;t\x07\x9b\x7f\u202e\r") == "\\x1b]0;t\\x07\\x9b\\x7f\\u202e\\x0d"
    assert escape_control("plain é\n\t") == "plain é\n\t"


def _on_a_terminal(args: list[str], stdin: str) -> bytes:
    """Run mty with stdout and stderr on a pseudo-terminal; what the terminal received."""
    master, slave = pty.openpty()
    with subprocess.Popen(
        [*_mty(), *args], stdin=subprocess.PIPE, stdout=slave, stderr=slave, env=os.environ
    ) as process:
        os.close(slave)
        assert process.stdin is not None
        process.stdin.write(stdin.encode())
        process.stdin.close()
        seen = b""
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other side closed
                break
            if not chunk:
                break
            seen += chunk
        process.wait(120)
    os.close(master)
    return seen


@pytest.mark.slow
def test_exec_on_a_terminal_escapes_guest_output(interpreter: object) -> None:
    """OSC 0/52 and CSI from the code reach a terminal as text, never as escapes."""
    seen = _on_a_terminal(["exec", "-"], ATTACK + "\nraise ValueError('\\x1b[31mred')")
    assert b"\x1b" not in seen
    assert b"\x07" not in seen
    assert b"\xc2\x9b" not in seen
    assert b"\\x1b]0;owned\\x07" in seen
    assert b"\\x1b[31mred" in seen


@pytest.mark.slow
def test_exec_piped_keeps_bytes(interpreter: object) -> None:
    """Piped, guest output passes unchanged; --json escapes it as JSON."""
    done = subprocess.run(
        [*_mty(), "exec", "-"], input=ATTACK.encode(), capture_output=True, check=False
    )
    assert b"\x1b]0;owned\x07" in done.stdout
    done = subprocess.run(
        [*_mty(), "exec", "--json", "-"], input=ATTACK.encode(), capture_output=True, check=False
    )
    assert b"\x1b" not in done.stdout
    assert json.loads(done.stdout)["stdout"].startswith("\x1b]0;owned")


@pytest.mark.slow
@pytest.mark.parametrize("as_json", [False, True])
def test_exec_forged_results_are_errors_not_crashes(interpreter: object, as_json: bool) -> None:
    """[inf, -inf] and a lone surrogate are exceptions: strict JSON out, no internal error."""
    for forged in ("[1e999, -1e999]", '"\\\\ud800"'):
        code = f"import interpreter\ninterpreter._dumps = lambda v, w: b'{forged}'\nresult = 1"
        flags = ["--json"] if as_json else []
        done = subprocess.run(
            [*_mty(), "exec", *flags, "-"], input=code.encode(), capture_output=True, check=False
        )
        assert done.returncode == 1, done.stderr
        assert b"internal error" not in done.stderr
        if as_json:
            document = json.loads(done.stdout, parse_constant=pytest.fail)
            assert document["error"]["kind"] == "exception"
        else:
            assert b"mty: exception: TypeError" in done.stderr


@pytest.mark.slow
def test_call_on_a_terminal_escapes_guest_output_and_result(probe_wasm: Path) -> None:
    """`mty call` text mode: guest prints and the result reach a terminal escaped."""
    code = ATTACK + "\nimport sys\nprint('\\x1b[2Jerr', file=sys.stderr)\n'\\x9bresult'"
    seen = _on_a_terminal(["call", str(probe_wasm), "run", json.dumps(code)], "")
    assert b"\x1b" not in seen
    assert b"\x07" not in seen
    assert b"\xc2\x9b" not in seen
    assert b"\\x1b]52;c;ZXZpbA==\\x07" in seen
    assert b"\\x1b[2Jerr" in seen
