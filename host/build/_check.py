"""Checks made before componentize-py runs: export names that cannot link, and syntax errors.

Both failures used to surface only from componentize-py: a world exporting ``read`` panicked in
its linker (``wit-component ... linking.rs ... one or more duplicate items detected``, then a
PyO3 traceback) and a syntax error in the handler came back after the tool had started the
guest, up to a minute later. Here they are found in milliseconds and named.

Export names. componentize-py links the guest out of shared libraries (wasi-libc, libpython, its
runtime) plus one it generates for the bindings, in which each function the *world* exports
(not an exported interface's: those are ``pkg/iface#name``) is a symbol of its WIT name. The
dynamic-link main module exports some C symbols by their plain names; a world export of one of
those names is a duplicate and the linker panics. The list (:data:`LINKED_SYMBOLS`) is the
main module's exports that are also valid WIT names (lowercase letters and digits, no
hyphen: no C symbol has one), read from a component componentize-py 0.25.1 built::

    wasm-tools print --skeleton X.wasm | awk '/^  \\(core module \\$/{m=$3}
        /^    \\(export "/{match($0,/"[^"]*"/); print m, substr($0,RSTART+1,RLENGTH-2)}' |
        grep -E '^\\$main [a-z][a-z0-9]*$'

(less ``memory``, the main module's linear memory, not a function: a world export of that name
builds). It is the same for every build of that version (checked on three different handlers),
and tried: ``read``, ``drem`` and ``sqrt`` fail the build; ``rand`` and ``getpid``, exported by
libc.so but not by the main module, build and run. Rejected: every libc symbol (would refuse
``rand``, which works); asking the linker (only by running componentize-py, the minute saved).

Syntax. The handler and the local modules it imports are compiled with :func:`compile` on the
host first. The guest is CPython 3.14 (componentize-py 0.25.1); an older host rejects some
newer syntax that the guest accepts (type parameters, PEP 701 f-strings, ``except A, B:``,
t-strings), so on a host older than the guest an error on a line using such syntax is left to
componentize-py to judge. Rejected: ``ast.parse(feature_version=...)`` (only parses as an
*older* version than the host).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from mighty._errors import BuildError
from mighty.build._inputs import BuildInput

__all__ = [
    "GUEST_PYTHON",
    "LINKED_SYMBOLS",
    "ExportNameClash",
    "HandlerSyntaxError",
    "check_export_names",
    "check_syntax",
    "syntax_inputs",
    "world_function_exports",
]

GUEST_PYTHON = (3, 14)
"""The CPython version inside componentize-py 0.25.1's guest."""

LINKED_SYMBOLS = frozenset(
    [
        "access",
        "acos",
        "acosh",
        "alphasort64",
        "asin",
        "asinh",
        "atan",
        "atan2",
        "atanh",
        "calloc",
        "clock",
        "close",
        "copysign",
        "cos",
        "cosh",
        "creat64",
        "drem",
        "dremf",
        "duplocale",
        "exp",
        "exp2",
        "fabs",
        "fcntl",
        "fdopen",
        "fgetpos64",
        "fmod",
        "fopen64",
        "fpurge",
        "free",
        "freopen64",
        "fseeko",
        "fseeko64",
        "fsetpos64",
        "fstat",
        "ftello",
        "ftello64",
        "ftruncate",
        "futimesat",
        "getcwd",
        "getentropy",
        "glob64",
        "globfree64",
        "iprintf",
        "isatty",
        "lseek",
        "lstat",
        "malloc",
        "memrchr",
        "mkdir",
        "newlocale",
        "nftw64",
        "pow",
        "pow10",
        "pow10f",
        "pow10l",
        "read",
        "readlink",
        "realloc",
        "reallocarray",
        "rmdir",
        "sin",
        "sinh",
        "sqrt",
        "stat",
        "stpcpy",
        "stpncpy",
        "strchrnul",
        "tan",
        "tanh",
        "trunc",
        "unlink",
        "uselocale",
        "versionsort64",
        "write",
    ]
)
"""World-level export names that clash with a symbol of the guest's C runtime at link time
(componentize-py 0.25.1)."""


class ExportNameClash(BuildError):
    """The world exports a function whose name is a C symbol of the guest's runtime."""

    def __init__(self, message: str, *, export: str, filename: str, lineno: int) -> None:
        super().__init__(message, filename=filename, lineno=lineno)
        self.export = export


class HandlerSyntaxError(BuildError):
    """The handler, or a local module it imports, is not valid Python."""


_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
_WORLD_HEAD = re.compile(r"(?:^|[\s;{}])world\s+%?(?P<name>[a-zA-Z][\w-]*)\s*\{")
_EXPORT_FUNC = re.compile(
    r"(?:^|[\s;{}])export\s+%?(?P<name>[a-z][a-z0-9-]*)\s*:\s*(?:async\s+)?func\b"
)
_INCLUDE = re.compile(r"(?:^|[\s;{}])include\s+%?(?P<name>[a-zA-Z][\w-]*)\s*;")


def _blank(text: str) -> str:
    # Comments become spaces of the same length, so offsets still give the right line.
    return _COMMENTS.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def _world_bodies(wit: Path) -> dict[str, tuple[Path, str, int]]:
    """Each world of the package's own files: ``name -> (file, text, offset of its body)``,
    with only the body's top level kept (nested ``{...}`` blanked)."""
    files = [wit] if wit.is_file() else sorted(wit.glob("*.wit"))
    found: dict[str, tuple[Path, str, int]] = {}
    for path in files:
        text = _blank(path.read_text(encoding="utf-8", errors="replace"))
        for head in _WORLD_HEAD.finditer(text):
            start = head.end()
            depth, index, body = 1, start, []
            while index < len(text) and depth:
                char = text[index]
                if char == "{":
                    depth += 1
                elif char == "}":
                    depth -= 1
                body.append(char if depth == 1 or char == "\n" else " ")
                index += 1
            found.setdefault(head["name"], (path, "".join(body), start))
    return found


def world_function_exports(wit: Path, world: str) -> list[tuple[str, Path, int]]:
    """The functions ``world`` exports at its top level (``export name: func(...)``), with
    those of the local worlds it includes: ``(name, file, line)``."""
    bodies = _world_bodies(wit)
    exports: list[tuple[str, Path, int]] = []
    seen: set[str] = set()
    pending = [world]
    while pending:
        name = pending.pop()
        if name in seen or name not in bodies:
            continue
        seen.add(name)
        path, body, offset = bodies[name]
        full = path.read_text(encoding="utf-8", errors="replace")
        for match in _EXPORT_FUNC.finditer(body):
            line = full.count("\n", 0, offset + match.start("name")) + 1
            exports.append((match["name"], path, line))
        pending.extend(m["name"] for m in _INCLUDE.finditer(body))
    return exports


def check_export_names(wit: Path, world: str) -> None:
    """Raise :class:`ExportNameClash` for the first world export named like a linked C symbol."""
    for name, path, line in world_function_exports(wit, world):
        if name in LINKED_SYMBOLS:
            raise ExportNameClash(
                f"{path}:{line}: world {world!r} exports a function named {name!r}, the name of "
                f"a C function ({name}) the guest's runtime (wasi-libc, under componentize-py's "
                "Python) already exports; the two cannot be linked into one component "
                f"(componentize-py fails with 'duplicate items detected'). Rename the export "
                f"(for example {name}-data) or move it into an exported interface "
                f"(export api: interface {{ {name}: func(...); }}), whose functions do not "
                "share the C namespace",
                export=name,
                filename=str(path),
                lineno=line,
            )


_NEWER_SYNTAX = re.compile(
    r"^\s*type\s+\w"  # type X = ... (3.12)
    r"|^\s*(?:async\s+)?(?:def|class)\s+\w+\s*\["  # type parameters (3.12)
    r"|^\s*except\*?\s+[^:()]+,"  # except A, B: (3.14)
    r"|(?<![\w.])(?:t|rt|tr)['\"]",  # t-strings (3.14)
    re.IGNORECASE,
)


def check_syntax(files: Sequence[Path], *, host: tuple[int, int] | None = None) -> None:
    """Compile each of ``files`` with the host's :func:`compile`; raise
    :class:`HandlerSyntaxError` naming the file and line of the first syntax error, unless the
    host is older than the guest and the line may use syntax the guest has and the host not."""
    host = host if host is not None else (sys.version_info[0], sys.version_info[1])
    for path in files:
        source = path.read_bytes()
        try:
            compile(source, str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            line = (exc.text or "").rstrip("\n")
            if host < GUEST_PYTHON and (
                _NEWER_SYNTAX.search(line) or (exc.msg or "").startswith("f-string")
            ):
                continue  # maybe valid for the guest: componentize-py decides
            where = f"{path}:{exc.lineno}" if exc.lineno else str(path)
            shown = f"\n    {line.strip()}" if line.strip() else ""
            raise HandlerSyntaxError(
                f"{where}: SyntaxError: {exc.msg}{shown}",
                filename=str(path),
                lineno=exc.lineno,
            ) from None
        except ValueError as exc:  # source with NUL bytes
            raise HandlerSyntaxError(f"{path}: {exc}", filename=str(path)) from None


def syntax_inputs(inputs: Sequence[BuildInput]) -> list[Path]:
    """The files of a build's import graph to compile first: every module at the top of a root
    and every package's ``__init__.py`` (a package's other files may be unused)."""
    chosen: list[Path] = []
    for _, rel, path in inputs:
        if path.suffix != ".py":
            continue
        if "/" not in rel or rel.endswith("/__init__.py"):
            chosen.append(path)
    return chosen
