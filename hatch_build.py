"""Builds mighty's optional C extensions (hatchling build hook; also runnable as a script).

Every ``*.c`` file under ``host/`` (the package ``mighty``) or ``sandbox/`` (``mighty.sandbox``)
is one extension module named by its path: ``host/trace/_speedups.c`` is
``mighty.trace._speedups``. Each is a compiled form of a pure-Python path that stays in the
package as the fallback and as the oracle the tests hold the compiled one to, so the package
works without them; they only make hot paths cheaper.

- A wheel (``pip install .``, ``python -m build``) compiles them with the interpreter's own
  compiler settings (``sysconfig``'s ``LDSHARED``) and carries them; the wheel is then tagged for
  this interpreter and platform instead of ``py3-none-any``.
- An editable install (``pip install -e .``, what ``.ci/setup`` does) compiles them in place,
  beside their sources (git ignores them).
- ``python hatch_build.py`` compiles them in place too: after editing a ``.c`` file in an
  editable checkout (the tests fail on an extension older than its source).
- ``MIGHTY_PURE_PYTHON=1`` builds none (for a platform without a C compiler); the package then
  uses its pure-Python paths, and so does a process that sets it at run time.

A compiler that fails fails the build, with its output: a broken extension must not pass for a
missing one.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

try:
    from hatchling.builders.hooks.plugin.interface import BuildHookInterface  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # run as a script, outside a build: only the in-place build is needed
    BuildHookInterface = object  # type: ignore[misc,assignment,unused-ignore]

ROOT = Path(__file__).resolve().parent
SOURCES = {"host": "mighty", "sandbox": "mighty/sandbox"}
"""Source folder -> where it lands in the wheel."""

CFLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fno-strict-aliasing"]


def extensions(root: Path = ROOT) -> list[tuple[Path, str]]:
    """Each C source and its module's path in the wheel without the suffix
    (``mighty/trace/_speedups``), sorted."""
    found = []
    for folder, target in SOURCES.items():
        base = root / folder
        for dirpath, _dirs, files in os.walk(base):  # not into host/sandbox, a symlink
            for name in files:
                if name.endswith(".c"):
                    source = Path(dirpath) / name
                    relative = source.relative_to(base).with_suffix("")
                    found.append((source, f"{target}/{relative.as_posix()}"))
    return sorted(found)


def suffix() -> str:
    return str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def compile_one(source: Path, output: Path) -> None:
    """Compile and link ``source`` into the extension module ``output``."""
    linker = shlex.split(str(sysconfig.get_config_var("LDSHARED") or "cc -shared"))
    shared = shlex.split(str(sysconfig.get_config_var("CCSHARED") or "-fPIC"))
    include = sysconfig.get_paths()["include"]
    command = [*linker, *shared, *CFLAGS, f"-I{include}", str(source), "-o", str(output)]
    output.parent.mkdir(parents=True, exist_ok=True)
    hint = "set MIGHTY_PURE_PYTHON=1 to build without the compiled speedups"
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603 - our own sources, the interpreter's own compiler
    except OSError as exc:  # no compiler at all
        raise RuntimeError(f"compiling {source.name} failed ({hint}): {exc}") from exc
    if done.returncode != 0:
        raise RuntimeError(
            f"compiling {source.name} failed ({hint}):\n$ {shlex.join(command)}\n"
            f"{done.stdout}{done.stderr}"
        )


def build_in_place(root: Path = ROOT) -> list[Path]:
    """Compile every extension beside its source when the module is older than the source."""
    built = []
    for source, _target in extensions(root):
        output = source.with_name(source.stem + suffix())
        if not output.exists() or output.stat().st_mtime < source.stat().st_mtime:
            compile_one(source, output)
            built.append(output)
    return built


def build_for_wheel(root: Path = ROOT) -> dict[str, str]:
    """Compile every extension into a temporary folder: {compiled file: its path in the
    wheel}. Each file is named by its path in the wheel: two modules may share a name
    (``mighty/abi/_speedups`` and ``mighty/trace/_speedups``), and one temporary file for both
    would carry one of them under both names."""
    out = Path(tempfile.mkdtemp(prefix="mighty-ext-"))
    included = {}
    for source, target in extensions(root):
        output = out / (target + suffix())
        compile_one(source, output)
        included[str(output)] = target + suffix()
    return included


def pure() -> bool:
    return os.environ.get("MIGHTY_PURE_PYTHON", "") not in ("", "0")


class CustomBuildHook(BuildHookInterface):  # type: ignore[misc]
    """The wheel target's hook: compile the extensions into the wheel (or in place when
    editable)."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if pure() or not extensions(Path(self.root)):
            return
        if version == "editable":
            build_in_place(Path(self.root))
            return
        build_data["force_include"].update(build_for_wheel(Path(self.root)))
        build_data["pure_python"] = False
        build_data["infer_tag"] = True


if __name__ == "__main__":
    if pure():
        sys.exit("MIGHTY_PURE_PYTHON is set: nothing to build")
    for path in build_in_place():
        print(f"built {path.relative_to(ROOT)}")
