"""The inputs of a build: which files count, their digest, and the worlds a WIT package defines.

The digest must change whenever the component could, and should not change otherwise. The guest
bundles only the modules that the handler imports while componentize-py pre-initialises it, but
which ones those are is only known after the build, so every file that Python code can import or
read at import time counts: sources, ``.pth`` files and small text/config formats. Caches, VCS
directories, bytecode and previously built components do not. Paths are hashed relative to their
root, so moving a project keeps its cache hits.

componentize-py also appends a site-packages directory to the guest's path by itself (from
``$VIRTUAL_ENV``, else the running interpreter's). Hashing those trees would cost more than the
build, so the key covers the installed distributions' names and versions instead: an upgrade
invalidates, an edit inside an installed (non-editable) package does not.

The worlds are found with a small regex over the package's top-level ``.wit`` files instead of
asking a tool: componentize-py has no "list worlds" command and wasm-tools is only a development
dependency. A miss here is harmless: componentize-py still resolves the world itself and reports
an unknown one.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["compute_digest", "find_worlds", "input_files", "installed_distributions"]

_DIGEST_VERSION = "mighty-build/1"

HASHED_SUFFIXES = frozenset(
    {".py", ".pyi", ".pth", ".wit", ".json", ".toml", ".txt", ".cfg", ".ini", ".yaml", ".yml"}
)
SKIPPED_DIRS = frozenset(
    {
        "__pycache__",
        ".git",
        ".hg",
        ".svn",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".nox",
        ".venv",
        "node_modules",
    }
)

_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.DOTALL)
_LINE_COMMENT = re.compile(r"//[^\n]*")
_WORLD = re.compile(r"(?:^|[\s;{}])world\s+%?(?P<name>[a-zA-Z][\w-]*)\s*\{")


def input_files(
    root: Path, *, suffixes: frozenset[str] | None, exclude: Path | None = None
) -> list[tuple[str, Path]]:
    """The files under ``root`` that a build reads, as ``(relative posix path, path)``, sorted.

    ``suffixes=None`` takes every file. ``exclude`` (the build's own output) is never taken.
    """
    excluded = exclude.resolve() if exclude is not None else None
    if root.is_file():
        return [(root.name, root)]
    found: list[tuple[str, Path]] = []
    for path in _walk(root):
        if suffixes is not None and path.suffix not in suffixes:
            continue
        if excluded is not None and path.resolve() == excluded:
            continue
        found.append((path.relative_to(root).as_posix(), path))
    found.sort()
    return found


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        # Pruned in place so os.walk does not descend; sorted for a stable order.
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        for name in filenames:
            yield Path(dirpath, name)


def compute_digest(
    *,
    module: str,
    roots: Sequence[Path],
    wit: Path,
    world: str,
    tool_version: str,
    distributions: Sequence[str] = (),
    exclude: Path | None = None,
) -> str:
    """sha256 hex over everything a build reads: sources, WIT, world, module, tool version and
    the installed distributions componentize-py may bundle from.
    """
    h = hashlib.sha256()

    def field(*parts: str) -> None:
        # NUL-separated and length-prefixed below, so no two input sets hash the same stream.
        h.update("\0".join(parts).encode("utf-8") + b"\0")

    def files(entries: Sequence[tuple[str, Path]]) -> None:
        field("files", str(len(entries)))
        for rel, path in entries:
            data = path.read_bytes()
            field("file", rel, str(len(data)))
            h.update(data)

    field(_DIGEST_VERSION, "componentize-py", tool_version, "world", world, "module", module)
    field("distributions", str(len(distributions)), *distributions)
    for index, root in enumerate(roots):
        field("root", str(index))
        files(input_files(root, suffixes=HASHED_SUFFIXES, exclude=exclude))
    field("wit")
    files(input_files(wit, suffixes=frozenset({".wit"})))
    return h.hexdigest()


def find_worlds(wit: Path) -> list[str]:
    """The names of the worlds defined by the WIT package at ``wit`` (a directory or one file).

    Only the package's own files count, not ``deps/``: componentize-py picks the default world
    from the main package alone.
    """
    paths = [wit] if wit.is_file() else sorted(wit.glob("*.wit"))
    names: list[str] = []
    for path in paths:
        text = path.read_text(encoding="utf-8", errors="replace")
        text = _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub("", text))
        for match in _WORLD.finditer(text):
            if match["name"] not in names:
                names.append(match["name"])
    return names


def installed_distributions() -> list[str]:
    """``name==version`` of every distribution componentize-py can see besides our ``-p`` paths."""
    paths: list[str] | None = None
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        found = [*Path(venv).glob("lib/python*/site-packages"), Path(venv, "Lib", "site-packages")]
        paths = [str(p) for p in found if p.is_dir()]
    dists = (
        importlib.metadata.distributions()
        if paths is None
        else importlib.metadata.distributions(path=paths)
    )
    return sorted({f"{d.metadata['Name']}=={d.version}" for d in dists})
