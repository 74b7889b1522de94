"""The inputs of a build: which files count, their digest, and the worlds a WIT package defines.

The digest must change whenever the component could, and only then. The build reads exactly
the handler's import graph: the handler module and every local module it imports, found by
reading their ``import`` statements (and ``importlib.import_module``/``__import__`` calls with
a literal name) with ``ast``, resolved against the ``-p`` roots in order; a local *package*
counts whole (every file under it: submodules, ``componentize-py.toml``, its own WIT). Those
files are copied into a staging directory and componentize-py sees only them
(``_build.py``), so the digest covers what the build reads, not a guess: a manifest, a README
or another handler's module beside the handler changes nothing, and a module the scan misses
(an import spelled at run time) fails the build with "No module named ..." instead of making a
stale cache entry. Paths are hashed relative to their root, so moving a project keeps its hits.

Rejected: hashing every ``.py``/``.toml``/``.json``/``.txt`` under the handler's folder (the
first design): editing one start message in ``mighty.toml`` rebuilt every agent (0.8 s -> 50 s);
asking componentize-py which modules it bundled (only known after the build it would skip).

componentize-py also appends a site-packages directory to the guest's path by itself (from
``$VIRTUAL_ENV``, else the running interpreter's). The key covers the installed distributions
the import graph *reaches* there (:func:`reached_distributions`): a name the handler's files
import that is neither local, nor in the standard library, nor a binding componentize-py
generates, is looked up in those site-packages; the distribution that provides it counts by
``name==version``, and so does every installed distribution it requires, transitively (its
``Requires-Dist``, markers ignored: a superset is safe). A module lying in site-packages outside
any distribution counts by its bytes, like a local one. Everything else installed there is not
read by the build's result: componentize-py bundles no site-packages file the guest did not
import while it was pre-initialised. (The directory *listing* of site-packages does end up in
the snapshot heap, in the import system's path cache; the component's bytes are not
reproducible anyway, docs/determinism.md, and the listing changes nothing a handler runs.)
Rejected: every installed distribution (the first design: any ``pip install`` of an unrelated
package, say the ``mcp`` extra, threw away every cached build, 3.4 s -> 313 s for ``mty run``,
and two venvs never shared one); hashing the site-packages trees (costs more than the build);
hashing the reached distributions' files (an upgrade changes the version, and an edit inside an
installed, non-editable package is not something the cache should chase).

WASI interfaces: componentize-py bundles no WIT for ``wasi:`` packages, so a world importing
``wasi:http/outgoing-handler`` fails "package 'wasi:http@0.2.0' not found" unless its WIT folder
has a ``deps/`` holding them. When the package's own files refer to a ``wasi:`` package that its
``deps/`` does not declare, the build adds the WASI 0.2.0 packages we vendor (``wit/wasi/``,
:func:`wasi_deps`) to a staged copy of the WIT folder, and the digest covers them. A package its
``deps/`` does declare is the user's copy and wins. Rejected: asking users to vendor the WASI WIT
themselves (every project would carry the same seven folders, and the error names none of them);
passing our folder as a second ``-d`` (componentize-py takes one WIT path).

The worlds are found with a small regex over the package's top-level ``.wit`` files instead of
asking a tool: componentize-py has no "list worlds" command and wasm-tools is only a development
dependency. A miss here is harmless: componentize-py still resolves the world itself and reports
an unknown one.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import os
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

__all__ = [
    "BuildInput",
    "build_inputs",
    "compute_digest",
    "find_worlds",
    "input_files",
    "installed_distributions",
    "reached_distributions",
    "site_package_paths",
    "wasi_deps",
]

_DIGEST_VERSION = "mighty-build/3"
"""Names the build recipe too (staging, environment): bump it when ``_build.py`` changes how
componentize-py runs, so old cache entries are not served for the new recipe."""

_SKIPPED_SUFFIXES = frozenset({".pyc", ".pyo"})

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
# `import wasi:http/outgoing-handler@0.2.0;`, `use wasi:io/streams@0.2.0.{input-stream};`,
# `include wasi:cli/imports@0.2.0;`: the package name and version a file refers to.
_WASI_REFERENCE = re.compile(
    r"(?:^|[\s;{}])(?:import|export|use|include)\s+wasi:(?P<name>[a-z][\w-]*)/[\w-]+"
    r"(?:@(?P<version>[0-9][\w.+-]*))?"
)
_WASI_PACKAGE = re.compile(
    r"(?:^|[\s;{}])package\s+wasi:(?P<name>[a-z][\w-]*)(?:@(?P<version>[0-9][\w.+-]*?))?\s*[;{]"
)


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


BuildInput = tuple[int, str, Path]
"""One file a build reads: ``(index of its root, posix path relative to the root, path)``."""


def build_inputs(module: str, roots: Sequence[Path]) -> list[BuildInput]:
    """The files a build of handler ``module`` reads from ``roots``: the module and every local
    module it imports, transitively (a package whole), sorted by root and path.

    A name is resolved as Python would: the first root holding ``name.py`` or a ``name/``
    directory wins. Names found in no root (the standard library, installed packages, the
    bindings componentize-py generates) are not inputs here.
    """
    taken: dict[tuple[int, str], Path] = {}
    seen: set[str] = set()
    pending = [module]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        found = _resolve(name, roots)
        if found is None:
            continue
        index, files = found
        for rel, path in files:
            if (index, rel) in taken:
                continue
            taken[index, rel] = path
            if path.suffix == ".py":
                pending.extend(sorted(_imported_names(path) - seen))
    return sorted((index, rel, path) for (index, rel), path in taken.items())


def _resolve(name: str, roots: Sequence[Path]) -> tuple[int, list[tuple[str, Path]]] | None:
    # Python's order within one root: a regular package, then a module, then a namespace
    # package (a directory without ``__init__.py``).
    for index, root in enumerate(roots):
        package, single = root / name, root / f"{name}.py"
        if (package / "__init__.py").is_file() or (package.is_dir() and not single.is_file()):
            files = [
                (f"{name}/{rel}", path)
                for rel, path in input_files(package, suffixes=None)
                if path.suffix not in _SKIPPED_SUFFIXES
            ]
            return index, files
        if single.is_file():
            return index, [(single.name, single)]
    return None


def _imported_names(path: Path) -> set[str]:
    """The top-level names ``path`` imports (absolute imports only: relative ones stay inside
    a package, which counts whole)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):
        # The build will report it, with the line; nothing more to follow from here.
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.partition(".")[0])
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and _call_name(node.func) in ("import_module", "__import__")
        ):
            names.add(node.args[0].value.partition(".")[0])
    return {n for n in names if n.isidentifier()}


def _call_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def compute_digest(
    *,
    module: str,
    roots: Sequence[Path],
    wit: Path,
    world: str,
    tool_version: str,
    distributions: Sequence[str] | None = None,
    site_paths: Sequence[Path] | None = None,
) -> str:
    """sha256 hex over everything a build reads: the handler's import graph
    (:func:`build_inputs`), WIT (and the WASI WIT the build adds), world, module, the
    componentize-py version (which fixes the guest CPython, its standard library and the
    bindings it generates) and the installed distributions the import graph reaches
    (:func:`reached_distributions` over ``site_paths``, default :func:`site_package_paths`).

    ``distributions`` replaces that last part with a fixed list (an isolated build, which sees
    no site-packages, passes a marker of its own).
    """
    h = hashlib.sha256()

    def field(*parts: str) -> None:
        # NUL-separated and length-prefixed below, so no two input sets hash the same stream.
        h.update("\0".join(parts).encode("utf-8") + b"\0")

    def content(rel: str, path: Path) -> None:
        data = path.read_bytes()
        field("file", rel, str(len(data)))
        h.update(data)

    inputs = build_inputs(module, roots)
    if distributions is None:
        paths = site_package_paths() if site_paths is None else list(site_paths)
        distributions, loose = reached_distributions(inputs, roots, paths)
    else:
        loose = []
    field(_DIGEST_VERSION, "componentize-py", tool_version, "world", world, "module", module)
    field("distributions", str(len(distributions)), *distributions)
    field("loose", str(len(loose)))
    for rel, path in loose:
        content(rel, path)
    field("roots", str(len(roots)))
    field("files", str(len(inputs)))
    for index, rel, path in inputs:
        field("root", str(index))
        content(rel, path)
    wit_files = input_files(wit, suffixes=_WIT_SUFFIXES)
    field("wit", str(len(wit_files)))
    for rel, path in wit_files:
        content(rel, path)
    # Only when the build adds them, so a build without WASI imports keeps its digest.
    added = wasi_deps(wit)
    if added:
        field("wasi", str(len(added)))
        for rel, path in added:
            content(rel, path)
    return h.hexdigest()


# Modules componentize-py generates (or ships inside its own guest) for every build: they come
# with the tool version and the WIT, both in the key, never from site-packages.
_GENERATED = frozenset(
    {
        "wit_world",
        "componentize_py_types",
        "componentize_py_runtime",
        "componentize_py_async_support",
        "poll_loop",
    }
)
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _normal(name: str) -> str:
    # PEP 503: "Typing_Extensions" and "typing-extensions" are one distribution.
    return re.sub(r"[-_.]+", "-", name).lower()


def reached_distributions(
    inputs: Sequence[BuildInput], roots: Sequence[Path], site_paths: Sequence[Path]
) -> tuple[list[str], list[tuple[str, Path]]]:
    """What of ``site_paths`` the import graph ``inputs`` reaches: the ``name==version`` of the
    distributions providing the names it imports (and everything they require, transitively),
    sorted, and the files of modules found there that no distribution owns, as
    ``(relative posix path, path)``.

    Only names found in no root, not in the standard library and not generated by
    componentize-py are looked up; a name found nowhere (a typo, a module the build will report
    missing) adds nothing.
    """
    wanted: set[str] = set()
    for _, _, path in inputs:
        if path.suffix == ".py":
            wanted |= _imported_names(path)
    wanted -= sys.stdlib_module_names
    wanted -= _GENERATED
    wanted = {name for name in wanted if _resolve(name, roots) is None}
    # A cheap look first: resolving lists a package's files (thousands, for some).
    present = {name for name in wanted if _in_site(name, site_paths)}
    if not present:
        return [], []
    dists = list(importlib.metadata.distributions(path=[str(p) for p in site_paths]))
    by_name: dict[str, importlib.metadata.Distribution] = {}
    owner: dict[str, str] = {}
    for dist in dists:
        name = dist.metadata["Name"]
        if not name or _normal(name) in by_name:
            continue  # the first on the path wins, as for imports
        by_name[_normal(name)] = dist
        for top in _top_level_names(dist):
            owner.setdefault(top, _normal(name))
    reached: set[str] = set()
    pending: list[str] = []
    loose: list[tuple[str, Path]] = []
    for name in sorted(present):
        if name in owner:
            pending.append(owner[name])
            continue
        found = _resolve(name, site_paths)
        if found is not None:
            loose.extend(found[1])
    while pending:
        key = pending.pop()
        if key in reached or key not in by_name:
            continue
        reached.add(key)
        for requirement in by_name[key].requires or ():
            match = _REQUIREMENT_NAME.match(requirement)
            if match:
                pending.append(_normal(match[1]))
    listed = sorted(f"{by_name[k].metadata['Name']}=={by_name[k].version}" for k in reached)
    return listed, sorted(loose)


def _in_site(name: str, site_paths: Sequence[Path]) -> bool:
    for path in site_paths:
        if (path / name).is_dir() or (path / f"{name}.py").is_file():
            return True
        if any(path.glob(f"{name}.*.so")) or any(path.glob(f"{name}.*.pyd")):
            return True
    return False


def _top_level_names(dist: importlib.metadata.Distribution) -> set[str]:
    text = dist.read_text("top_level.txt")
    if text:
        return {line.strip() for line in text.splitlines() if line.strip()}
    names: set[str] = set()
    for file in dist.files or ():
        first = file.parts[0] if file.parts else ""
        if first.endswith(".py"):
            names.add(first[:-3])
        elif first and "." not in first and first != "__pycache__":
            names.add(first)
        elif "." in first and len(file.parts) == 1 and first.split(".")[-1] in ("so", "pyd"):
            names.add(first.split(".")[0])  # a top-level extension module
    return names


def site_package_paths() -> list[Path]:
    """The site-packages directories componentize-py appends to the guest's path: the
    ``$VIRTUAL_ENV``'s, else the running interpreter's."""
    venv = os.environ.get("VIRTUAL_ENV")
    if venv:
        found = [*Path(venv).glob("lib/python*/site-packages"), Path(venv, "Lib", "site-packages")]
        return [p for p in found if p.is_dir()]
    import site

    return [Path(p) for p in site.getsitepackages() if Path(p).is_dir()]


_WIT_SUFFIXES = frozenset({".wit"})

WasiPackage = tuple[str, str | None]
"""A ``wasi:`` package as ``(name, version)``: ``("http", "0.2.0")``; the version None when a
reference gives none."""


def wasi_deps(wit: Path, vendored: Path | None = None) -> list[tuple[str, Path]]:
    """The vendored WASI WIT files a build of ``wit`` adds under its ``deps/``, as
    ``(posix path relative to deps/, path)``, sorted; empty when it adds none.

    None are added unless the package's own files (not ``deps/``) refer to a ``wasi:`` package
    its ``deps/`` does not declare; then every vendored package (``vendored``, default
    :func:`mighty._resources.wasi_wit`) that ``deps/`` does not declare is added: one WASI
    package refers to others (``wasi:http/proxy`` includes ``wasi:cli/imports``, which uses
    filesystem, sockets, random...), and an unreferenced one costs the build nothing.
    """
    referenced: set[WasiPackage] = set()
    for path in _package_files(wit):
        for match in _WASI_REFERENCE.finditer(_wit_text(path)):
            referenced.add((match["name"], _version(match["version"])))
    if not referenced:
        return []
    deps = wit / "deps"
    own = (
        _declared(path for _, path in input_files(deps, suffixes=_WIT_SUFFIXES))
        if deps.is_dir()
        else set()
    )
    if all(_satisfied(package, own) for package in referenced):
        return []
    if vendored is None:
        from mighty._resources import wasi_wit

        vendored = wasi_wit()
    added: list[tuple[str, Path]] = []
    for folder in sorted(p for p in vendored.iterdir() if p.is_dir()):
        files = input_files(folder, suffixes=_WIT_SUFFIXES)
        if _declared(path for _, path in files) & own:
            continue
        added.extend((f"{folder.name}/{rel}", path) for rel, path in files)
    return added


def _package_files(wit: Path) -> list[Path]:
    # The main package is the folder's top-level files; deps/ holds the others.
    return [wit] if wit.is_file() else sorted(wit.glob("*.wit"))


def _wit_text(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    return _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub("", text))


def _version(text: str | None) -> str | None:
    # `use wasi:io/streams@0.2.0.{...}`: the dot before the brace is not the version's.
    return text.rstrip(".") if text else None


def _declared(paths: Iterable[Path]) -> set[WasiPackage]:
    found: set[WasiPackage] = set()
    for path in paths:
        for match in _WASI_PACKAGE.finditer(_wit_text(path)):
            found.add((match["name"], _version(match["version"])))
    return found


def _satisfied(package: WasiPackage, declared: set[WasiPackage]) -> bool:
    name, version = package
    return any(n == name and (version is None or v == version) for n, v in declared)


def find_worlds(wit: Path) -> list[str]:
    """The names of the worlds defined by the WIT package at ``wit`` (a directory or one file).

    Only the package's own files count, not ``deps/``: componentize-py picks the default world
    from the main package alone.
    """
    names: list[str] = []
    for path in _package_files(wit):
        for match in _WORLD.finditer(_wit_text(path)):
            if match["name"] not in names:
                names.append(match["name"])
    return names


def installed_distributions() -> list[str]:
    """``name==version`` of every distribution componentize-py can see besides our ``-p`` paths
    (``mty cache`` and diagnostics; the build key covers only :func:`reached_distributions`)."""
    paths = [str(p) for p in site_package_paths()]
    dists = importlib.metadata.distributions(path=paths)
    return sorted({f"{d.metadata['Name']}=={d.version}" for d in dists})
