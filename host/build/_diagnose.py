"""Turn componentize-py's failure output into the handler's own error and source line.

componentize-py 0.25.1 is a Rust tool behind a Python entry point. When the build fails it exits 1
and prints, on stderr::

    Traceback (most recent call last):
      File ".../bin/componentize-py", line 8, in <module>
        sys.exit(script())
    AssertionError: <headline>

    Caused by:
        <cause chain, numbered "0: ...", "1: ..." when there are several>

    Stack backtrace:            (only when RUST_BACKTRACE / RUST_LIB_BACKTRACE is on)
       0: ...

The headline is what matters. For a Python error while the guest interpreter imports the handler
(componentize-py pre-initialises CPython at build time) it is the guest's own traceback, whose
paths are the guest's view of the ``-p`` directories: ``/0/...`` for the first, ``/1/...`` for
the second, and so on; ``/python/...`` is the guest's standard library. A syntax error has the
usual ``File "...", line N`` / caret / ``SyntaxError: ...`` shape. A handler whose ``WitWorld``
lacks an export, or that has no ``WitWorld`` at all, gets a bare ``TypeError: ...`` /
``AttributeError: ...`` line with no traceback. WIT problems get a Rust headline and a cause chain
that ends in a source snippet (``--> wit/x.wit:4:25``).

Parsing the text is the only option: the tool has no machine-readable error output, and running
the handler's import ourselves in a native CPython would not reproduce the guest's (different
version, no sockets, a bundled stdlib). Unknown shapes fall back to the last lines of the output,
so a new componentize-py version degrades to a less tidy message, not a crash.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["Diagnosis", "diagnose"]

_WRAPPER_HEADLINE = "AssertionError: "
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)(?:, in (?P<func>.+))?\s*$')
_GUEST_ROOT = re.compile(r"^/(?P<index>\d+)/(?P<rest>.+)$")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b(?::|$)")
_WIT_LOCATION = re.compile(r"-->\s+(?P<path>.+?):(?P<line>\d+):(?P<col>\d+)\s*$", re.MULTILINE)
_NUMBERED_CAUSE = re.compile(r"^\d+: ")
_AVAILABLE_WORLDS = re.compile(r"Available worlds: \[(?P<list>[^\]]*)\]")
_MAX_FALLBACK_LINES = 8


@dataclass(frozen=True)
class Diagnosis:
    """What went wrong, in a few lines, and where in the user's files when that is known."""

    message: str
    filename: str | None = None
    lineno: int | None = None


def diagnose(stderr: str, *, roots: Sequence[Path], source: Path) -> Diagnosis:
    """Explain a failed componentize-py run from its stderr.

    ``roots`` are the ``-p`` directories in the order they were passed, spelled as the user gave
    them; guest paths ``/N/rest`` are mapped back to ``roots[N] / rest``. ``source`` is the handler
    file, used to point at its ``WitWorld`` class when the error has no traceback.
    """
    text = _strip_rust_backtrace(stderr)
    headline, causes = _split_wrapper(text)
    if headline is None:
        return Diagnosis(_fallback(text))
    if any(_FRAME.match(line) for line in headline.splitlines()):
        return _python_traceback(headline, roots)
    first = headline.strip().splitlines()[0] if headline.strip() else ""
    if _EXCEPTION_LINE.match(first):
        return _python_without_traceback(headline.strip(), source)
    return _tool_error(headline, causes)


def _strip_rust_backtrace(text: str) -> str:
    # We run the tool with backtraces off, but a user's environment may force them on.
    cut = text.find("\nStack backtrace:")
    return text if cut < 0 else text[:cut]


def _split_wrapper(text: str) -> tuple[str | None, list[str]]:
    start = text.find(_WRAPPER_HEADLINE)
    if start < 0:
        return None, []
    body = text[start + len(_WRAPPER_HEADLINE) :]
    headline, sep, caused = body.partition("\nCaused by:")
    causes: list[str] = []
    if sep:
        # Drop the chain's fixed indent but keep the snippet's own: it lines up the caret.
        for raw in textwrap.dedent(caused).splitlines():
            line = raw.strip()
            if line:
                causes.append(_NUMBERED_CAUSE.sub("", line) if _NUMBERED_CAUSE.match(line) else raw)
    return headline.rstrip(), causes


def _python_traceback(headline: str, roots: Sequence[Path]) -> Diagnosis:
    lines = headline.splitlines()
    frames: list[tuple[int, re.Match[str]]] = [
        (i, m) for i, line in enumerate(lines) if (m := _FRAME.match(line)) is not None
    ]
    exception = _exception_text(lines, frames[-1][0] if frames else -1)
    chosen: tuple[int, re.Match[str], str] | None = None
    for index, match in reversed(frames):
        user_path = _user_path(match["path"], roots)
        if user_path is not None:
            chosen = (index, match, user_path)
            break
    if chosen is None:
        return Diagnosis(exception)
    index, match, user_path = chosen
    lineno = int(match["line"])
    where = f'  File "{user_path}", line {lineno}'
    if match["func"]:
        where += f", in {match['func'].strip()}"
    message_lines = [exception, where]
    code = _code_line(lines, index)
    if code:
        message_lines.append(f"    {code}")
    return Diagnosis("\n".join(message_lines), filename=user_path, lineno=lineno)


def _exception_text(lines: Sequence[str], last_frame: int) -> str:
    # After the last frame come its indented code and caret lines, then the exception, which
    # may itself span several lines (an ExceptionGroup, a multi-line message).
    tail = lines[last_frame + 1 :]
    for i, line in enumerate(tail):
        if line and not line[0].isspace():
            return "\n".join(tail[i:]).strip()
    return "\n".join(tail).strip() or "the handler raised an exception while being imported"


def _code_line(lines: Sequence[str], frame_index: int) -> str | None:
    if frame_index + 1 >= len(lines):
        return None
    following = lines[frame_index + 1]
    if not following.startswith("    ") or _FRAME.match(following):
        return None
    code = following.strip()
    # A caret-only line is not code.
    return code if code and set(code) - set("^~ ") else None


def _user_path(guest_path: str, roots: Sequence[Path]) -> str | None:
    match = _GUEST_ROOT.match(guest_path)
    if match is None:
        return None
    index = int(match["index"])
    if index >= len(roots):
        return None
    return str(roots[index].joinpath(*PurePosixPath(match["rest"]).parts))


def _python_without_traceback(headline: str, source: Path) -> Diagnosis:
    lines = [headline]
    lineno = _witworld_line(source) if "WitWorld" in headline else None
    if lineno is not None:
        lines.append(f'  File "{source}", line {lineno}, in class WitWorld')
    if "abstract" in headline:
        lines.append("  every export of the world needs a method on WitWorld")
    elif "WitWorld" in headline and lineno is None:
        lines.append(
            f"  {source} must define `class WitWorld(wit_world.WitWorld)`"
            " with one method per export"
        )
    return Diagnosis("\n".join(lines), filename=str(source), lineno=lineno)


def _witworld_line(source: Path) -> int | None:
    try:
        tree = ast.parse(source.read_bytes(), filename=str(source))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "WitWorld":
            return node.lineno
    return None


def _tool_error(headline: str, causes: Sequence[str]) -> Diagnosis:
    headline_lines = [line for line in headline.strip().splitlines() if line.strip()]
    available = _AVAILABLE_WORLDS.search(headline)
    if available is not None and causes:
        names = [n.strip().strip('"') for n in available["list"].split(",") if n.strip()]
        message = f"{causes[0].strip()} (available: {', '.join(names) or 'none'})"
        return Diagnosis(message)
    message = "\n".join([*headline_lines[:1], *causes]) if causes else "\n".join(headline_lines)
    location = _WIT_LOCATION.search(message)
    if location is None:
        return Diagnosis(message)
    return Diagnosis(message, filename=location["path"], lineno=int(location["line"]))


def _fallback(text: str) -> str:
    lines = [
        line
        for line in text.strip().splitlines()
        if line.strip() and not line.startswith("note: run with `RUST_BACKTRACE")
    ]
    return "\n".join(lines[-_MAX_FALLBACK_LINES:]) or "componentize-py failed without output"
