"""Tests for parsing componentize-py 0.25.1 failure output, on its real (trimmed) output."""

from __future__ import annotations

from pathlib import Path

from mighty.build._diagnose import diagnose

WRAPPER = """\
Traceback (most recent call last):
  File "/venv/bin/componentize-py", line 8, in <module>
    sys.exit(script())
             ^^^^^^^^
AssertionError: """

RUST_BACKTRACE = """
Stack backtrace:
   0: <anyhow::Error>::msg::<alloc::string::String>
   1: anyhow::__private::format_err
   2: <componentize_py::ComponentGenerator>::generate::{closure#0}
"""

SYNTAX_ERROR = (
    WRAPPER
    + """\
  File "/0/syntax_error.py", line 8
    return "unclosed(
           ^
SyntaxError: unterminated string literal (detected at line 8)


Caused by:
    SyntaxError: unterminated string literal (detected at line 8) (syntax_error.py, line 8)
"""
)

NESTED_RAISE = (
    WRAPPER
    + """\
Traceback (most recent call last):
  File "/0/raises_at_import.py", line 7, in <module>
    CONFIG = load_config()
  File "/1/_broken_helper.py", line 6, in load_config
    return {"timeout": settings["timeout"]}
                       ~~~~~~~~^^^^^^^^^^^
  File "/python/json/__init__.py", line 346, in loads
    return _default_decoder.decode(s)
KeyError: 'timeout'


Caused by:
    KeyError: 'timeout'
"""
    + RUST_BACKTRACE
)

MISSING_METHOD = (
    WRAPPER
    + """\
TypeError: Can't instantiate abstract class WitWorld without an implementation for abstract \
method 'twice'


Caused by:
    TypeError: Can't instantiate abstract class WitWorld without an implementation for \
abstract method 'twice'
"""
)

BAD_WIT = (
    WRAPPER
    + """\
failed to resolve directory while parsing WIT for path [wit]

Caused by:
    0: failed to parse package: wit
    1: name `strin` is not defined
            --> wit/bad.wit:4:25
             |
           4 |   export run: func() -> strin;
             |                         ^----
"""
    + RUST_BACKTRACE
)

UNKNOWN_WORLD = (
    WRAPPER
    + """\
Unable to resolve `Some("nope")`.
Available worlds: [
    "mighty:broken/broken",
    "mighty:broken/other",
]
WIT paths: [
    "wit",
]

Caused by:
    World `nope` not found in package `mighty:broken`
"""
)

ROOTS = [Path("src/app"), Path("/opt/lib")]


def no_rust(message: str) -> None:
    assert "Stack backtrace" not in message
    assert "RUST_BACKTRACE" not in message
    assert "anyhow" not in message
    assert "AssertionError" not in message


def test_syntax_error_points_at_the_line(tmp_path: Path) -> None:
    """A SyntaxError maps /0/... back to the source directory and keeps the line number."""
    d = diagnose(SYNTAX_ERROR, roots=ROOTS, source=Path("src/app/syntax_error.py"))
    assert d.filename == str(Path("src/app/syntax_error.py"))
    assert d.lineno == 8
    assert d.message.splitlines()[0] == (
        "SyntaxError: unterminated string literal (detected at line 8)"
    )
    assert 'return "unclosed(' in d.message
    no_rust(d.message)


def test_last_user_frame_wins_over_stdlib_frames() -> None:
    """The reported frame is the last one in a -p directory, not the guest's stdlib."""
    d = diagnose(NESTED_RAISE, roots=ROOTS, source=Path("src/app/raises_at_import.py"))
    assert d.filename == str(Path("/opt/lib/_broken_helper.py"))
    assert d.lineno == 6
    assert d.message.splitlines() == [
        "KeyError: 'timeout'",
        f'  File "{Path("/opt/lib/_broken_helper.py")}", line 6, in load_config',
        '    return {"timeout": settings["timeout"]}',
    ]


def test_missing_method_points_at_the_class(tmp_path: Path) -> None:
    """A missing export method reports the TypeError at the WitWorld class line."""
    source = tmp_path / "missing.py"
    source.write_text("import wit_world\n\n\nclass WitWorld(wit_world.WitWorld):\n    pass\n")
    d = diagnose(MISSING_METHOD, roots=[tmp_path], source=source)
    assert d.filename == str(source)
    assert d.lineno == 4
    assert "abstract method 'twice'" in d.message.splitlines()[0]
    no_rust(d.message)


def test_bad_wit_gives_the_wit_error_and_location() -> None:
    """A WIT syntax error keeps the parser's message and snippet, located in the .wit file."""
    d = diagnose(BAD_WIT, roots=ROOTS, source=Path("h.py"))
    assert d.filename == "wit/bad.wit"
    assert d.lineno == 4
    assert "name `strin` is not defined" in d.message
    assert "^----" in d.message
    assert "0: " not in d.message
    no_rust(d.message)


def test_unknown_world_lists_the_available_ones() -> None:
    """An unknown world is one line naming the available worlds."""
    d = diagnose(UNKNOWN_WORLD, roots=ROOTS, source=Path("h.py"))
    assert d.message == (
        "World `nope` not found in package `mighty:broken` "
        "(available: mighty:broken/broken, mighty:broken/other)"
    )
    assert d.filename is None


def test_unknown_output_falls_back_to_its_last_lines() -> None:
    """Output of an unknown shape is passed on (its tail), never dropped or crashed on."""
    text = "\n".join(f"line {i}" for i in range(20)) + RUST_BACKTRACE
    d = diagnose(text, roots=ROOTS, source=Path("h.py"))
    assert d.message.splitlines()[-1] == "line 19"
    assert len(d.message.splitlines()) <= 8
    no_rust(d.message)
    assert diagnose("", roots=ROOTS, source=Path("h.py")).message
