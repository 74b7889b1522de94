"""Interpreter variants with pure-Python packages built in: ``Sandbox(packages=[...])``.

The sandbox has no filesystem to import from: every module the code can import is already in
the interpreter's pre-initialised heap, put there when componentize-py built the component
(which is why ``guests/interpreter/interpreter.py`` imports the standard library modules it
offers). A package is made importable the same way: a *variant* of the interpreter is built
whose module is the interpreter's own source plus, at its end, a generated block that imports
each package and every one of its submodules (so a package that imports a submodule lazily
still finds it). Anything else stays absent: ``import`` of it is an ordinary
``ModuleNotFoundError``.

Packages are given as distribution names installed in the host environment (``"attrs"``) or
paths to wheel files (``"dist/tool-1.0-py3-none-any.whl"``). Each distribution's files are
checked before anything is built: a native extension (``.so``, ``.pyd``, ``.dylib``) or a wheel
that is not ``Root-Is-Purelib`` is a :class:`PackageError`, as is a name that is not installed
or a wheel that is not a readable, bounded zip without unsafe paths. The importable top-level
modules are staged into a directory the build reads (``mty build``'s ``python_path``), so the
build's content hash covers the interpreter source and every package file: an unchanged set is
never rebuilt (and the compiled form is cached too), while any change to a package's files
builds a new variant, with its own component SHA-256 (snapshots of one variant are refused by
another). Building a variant takes about as long as the interpreter itself (tens of seconds,
once per machine and package set).

Rejected: copying packages into a preopened directory at run time (a filesystem grant to
every run, and each run would re-import and re-compile the package); shipping a ready variant
(each package set is a new 20 MB component; building one on demand costs the same once).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath

from mighty._errors import BadInput, BuildError
from mighty.build import build_component
from mighty.engine import Component
from mighty.sandbox._interpreter import INTERPRETER_SOURCE, INTERPRETER_WIT, publish

__all__ = ["MAX_PACKAGE_BYTES", "PackageError", "interpreter_with_packages"]

Progress = Callable[[str], None]

MAX_PACKAGE_BYTES = 64 << 20
"""At most this many bytes of files per distribution (a wheel's uncompressed size included)."""
_MAX_FILES = 20_000
_NATIVE = (".so", ".pyd", ".dylib", ".dll")
_GENERATED = "\n\n# -- packages bundled into this interpreter variant by mighty.sandbox --\n"

_RESERVED = frozenset(
    {"interpreter", "wit_world", "componentize_py_types", "componentize_py_runtime"}
)

_lock = threading.Lock()
_loaded: dict[str, Component] = {}


class PackageError(BadInput):
    """A package cannot be built into the sandbox: missing, not pure Python, or unreadable."""


def interpreter_with_packages(
    packages: Sequence[str | os.PathLike[str]], progress: Progress | None = None
) -> Component:
    """The interpreter with ``packages`` importable (built once per package set, then cached)."""
    if isinstance(packages, str | os.PathLike):
        raise PackageError("packages must be a list of distribution names or wheel paths")
    report = progress or _quiet
    with tempfile.TemporaryDirectory(prefix="mighty-packages-") as tmp:
        root = Path(tmp)
        staged = root / "packages"
        staged.mkdir()
        tops: list[str] = []
        for spec in packages:
            for name in _stage(spec, staged):
                if name in _RESERVED or name in sys.stdlib_module_names:
                    raise PackageError(
                        f"package {spec!r} provides a top-level module {name!r}, which would "
                        "shadow the interpreter's own"
                    )
                if name not in tops:
                    tops.append(name)
        source_dir = root / "source"
        source_dir.mkdir()
        source = source_dir / "interpreter.py"
        source.write_text(INTERPRETER_SOURCE.read_text(encoding="utf-8") + _imports(tops))
        try:
            built = build_component(
                source,
                output=None,  # left in the build cache: published below without a copy
                wit=INTERPRETER_WIT,
                world="interpreter",
                python_path=[staged],
                progress=report,
                # A package's top-level code runs during the build: it sees only its staged
                # copy, never the host's site-packages (componentize-py mounts them writable).
                site_packages=False,
            )
        except BuildError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PackageError(
                f"the packages failed to import while the interpreter variant was built: "
                f"{first} (dependencies are not resolved for you: list them in packages too)"
            ) from exc
        with _lock:
            component = _loaded.get(built.component_sha256)
            if component is not None:
                return component
            component = Component.load(publish(built), progress=report)
            _loaded[built.component_sha256] = component
            return component


def _quiet(_message: str) -> None:
    pass


def _imports(tops: Sequence[str]) -> str:
    """The generated tail of the variant's interpreter module: a static import of each
    top-level module (so the build stages the package whole), then every submodule."""
    lines = [_GENERATED]
    lines.extend(f"import {name}\n" for name in tops)
    lines.append(
        "\n\ndef _mighty_bundle(names: list[str]) -> None:\n"
        "    import importlib\n"
        "    import pkgutil\n"
        "\n"
        "    for name in names:\n"
        "        path = getattr(sys.modules[name], '__path__', None)\n"
        "        if path is None:\n"
        "            continue\n"
        "        for info in pkgutil.walk_packages(path, name + '.', onerror=lambda _n: None):\n"
        "            if info.name.rpartition('.')[2] == '__main__':\n"
        "                continue\n"
        "            try:\n"
        "                importlib.import_module(info.name)\n"
        "            except Exception:  # noqa: BLE001 - a submodule that cannot import is absent\n"
        "                pass\n"
        "\n"
        f"\n_mighty_bundle({list(tops)!r})\n"
        "del _mighty_bundle\n"
    )
    return "".join(lines)


def _stage(spec: str | os.PathLike[str], into: Path) -> list[str]:
    """Copy one distribution's importable top-level modules into ``into``; their names."""
    if isinstance(spec, os.PathLike) or str(spec).endswith(".whl"):
        return _stage_wheel(Path(spec), into)
    if not isinstance(spec, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}", spec):
        shown = repr(spec)[:100]
        raise PackageError(f"a package is a distribution name or a .whl path, got {shown}")
    return _stage_installed(spec, into)


def _stage_installed(name: str, into: Path) -> list[str]:
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise PackageError(
            f"no distribution named {name!r} is installed in this Python environment "
            f"({sys.prefix}); install it, or give the path of a wheel"
        ) from None
    files = list(dist.files or ())
    if not files:
        raise PackageError(f"distribution {name!r} lists no files (no RECORD): cannot stage it")
    if len(files) > _MAX_FILES:
        raise PackageError(f"distribution {name!r} has {len(files)} files, over {_MAX_FILES}")
    native = [str(f) for f in files if str(f).lower().endswith(_NATIVE)]
    if native:
        raise PackageError(
            f"distribution {name!r} has native extensions ({', '.join(native[:3])}): only "
            "pure-Python packages can be built into the sandbox's interpreter"
        )
    copied: dict[str, None] = {}
    total = 0
    for entry in files:
        parts = PurePosixPath(str(entry)).parts
        top = _top_level(parts)
        if top is None or entry.suffix == ".pyc":
            continue
        path = Path(str(dist.locate_file(entry)))
        if not path.is_file():
            continue
        total += path.stat().st_size
        if total > MAX_PACKAGE_BYTES:
            raise PackageError(f"distribution {name!r} is over {MAX_PACKAGE_BYTES} bytes")
        target = into.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        copied[top] = None
    if not copied:
        raise PackageError(
            f"distribution {name!r} installs no importable Python modules here (an editable "
            "install or a .pth file?): give a wheel instead"
        )
    return list(copied)


def _stage_wheel(path: Path, into: Path) -> list[str]:
    if not path.is_file():
        raise PackageError(f"wheel {path} does not exist or is not a file")
    try:
        with zipfile.ZipFile(path) as wheel:
            infos = wheel.infolist()
            if len(infos) > _MAX_FILES:
                raise PackageError(f"wheel {path.name} has {len(infos)} files, over {_MAX_FILES}")
            names = [info.filename for info in infos]
            native = [n for n in names if n.lower().endswith(_NATIVE)]
            if native:
                raise PackageError(
                    f"wheel {path.name} has native extensions ({', '.join(native[:3])}): only "
                    "pure-Python packages can be built into the sandbox's interpreter"
                )
            if sum(info.file_size for info in infos) > MAX_PACKAGE_BYTES:
                raise PackageError(f"wheel {path.name} is over {MAX_PACKAGE_BYTES} bytes unpacked")
            _check_purelib(wheel, names, path.name)
            copied: dict[str, None] = {}
            for info in infos:
                parts = PurePosixPath(info.filename).parts
                if info.is_dir() or ".." in parts or info.filename.startswith("/"):
                    if ".." in parts or info.filename.startswith("/"):
                        raise PackageError(
                            f"wheel {path.name} has an unsafe path {info.filename!r}"
                        )
                    continue
                top = _top_level(parts)
                if top is None or info.filename.endswith(".pyc"):
                    continue
                target = into.joinpath(*parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(wheel.read(info))
                copied[top] = None
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError) as exc:
        raise PackageError(f"wheel {path.name} cannot be read: {exc}") from None
    if not copied:
        raise PackageError(f"wheel {path.name} holds no importable Python modules")
    return list(copied)


def _check_purelib(wheel: zipfile.ZipFile, names: Sequence[str], shown: str) -> None:
    metadata = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/WHEEL", n)]
    if len(metadata) != 1:
        raise PackageError(f"wheel {shown} has no (or several) .dist-info/WHEEL files")
    text = wheel.read(metadata[0])[: 64 << 10].decode("utf-8", "replace")
    if not re.search(r"^Root-Is-Purelib:\s*true\s*$", text, re.MULTILINE | re.IGNORECASE):
        raise PackageError(
            f"wheel {shown} is not pure Python (Root-Is-Purelib is not true): only "
            "pure-Python packages can be built into the sandbox's interpreter"
        )


def _top_level(parts: Sequence[str]) -> str | None:
    """The importable top-level name a distribution file belongs to, or None (metadata,
    scripts, data, files outside site-packages)."""
    if not parts or ".." in parts:
        return None
    first = parts[0]
    if len(parts) == 1:
        stem, dot, suffix = first.rpartition(".")
        return stem if dot and suffix == "py" and stem.isidentifier() else None
    if first.endswith((".dist-info", ".data", ".egg-info")) or "__pycache__" in parts:
        return None
    return first if first.isidentifier() else None
