"""Build a Python handler into a WebAssembly component with componentize-py, with a cache.

componentize-py runs as a subprocess rather than through its in-process ``componentize()``
function: the tool pre-initialises a whole guest CPython, takes seconds, prints to our stdout and
panics (aborting the process) on some inputs, and a subprocess is the only way to get a timeout,
a progress tick and its output as text to explain failures with.

The cache is content-addressed (``builds/<sha256 of every input>.wasm``) with no index and no
locks on reading: an entry is written by an atomic rename, so a reader sees a whole file or none.
Builders of the same digest take an advisory lock (``builds/.<digest>.lock``, ``flock``) so
that one builds and the others then read its entry, instead of all building at once. Failed
builds are not cached; the failure is cheap to reproduce and the user is about to edit the file
anyway.

Reproducibility: componentize-py runs on a *staged copy* of the handler's import graph
(``_inputs.build_inputs``), never on the user's folders: every staged file and directory has
the same fixed mtime (``SOURCE_DATE_EPOCH``, else 1980-01-01), so the guest's import system
records the same stamps; a regular file named ``__pycache__`` in every staged directory stops
the guest CPython writing bytecode there (it used to write ``__pycache__/*.pyc`` into the
user's folder, so a second build loaded code the first had compiled: another heap); and the
roots are mounted ``/0``, ``/1``... in the guest, so no host path reaches the component. A
WIT folder that refers to ``wasi:`` packages without its own ``deps/`` for them is staged too,
as ``wit/`` with the vendored WASI WIT under ``deps/`` (``_inputs.wasi_deps``). The subprocess
gets a fixed environment for what it reads of it (``PYTHONHASHSEED=0``, ``TZ=UTC``,
``SOURCE_DATE_EPOCH``, no bytecode writes on the host side) and runs in the staging directory.
What is left is componentize-py's own: it pre-initialises the guest under a WASI context of
real entropy and real clocks (0.25.1: ``WasiCtxBuilder::new()``; upstream issue
bytecodealliance/componentize-py#247), so the guest's hash secret, ``random`` state and time
stamps in the snapshot heap differ from run to run. docs/determinism.md has the measurements.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mighty._cachedir import atomic_copy, cache_root
from mighty._errors import BadInput, BuildError
from mighty.build._check import check_export_names, check_syntax, syntax_inputs
from mighty.build._diagnose import diagnose
from mighty.build._inputs import (
    BuildInput,
    build_inputs,
    compute_digest,
    find_worlds,
    input_files,
    wasi_deps,
)

__all__ = ["DEFAULT_TIMEOUT", "BuildResult", "ComponentizeError", "build_component"]

DEFAULT_TIMEOUT = 600.0
"""Seconds a componentize-py run may take before it is killed."""

_TOOL = "componentize-py"
_PROGRESS_INTERVAL = 1.0
_COMPONENT_PREAMBLE = b"\0asm"
_COMPONENT_LAYER = b"\x0d\x00\x01\x00"  # version 0x0d, layer 1: a component, not a core module
_DEFAULT_EPOCH = 315532800  # 1980-01-01T00:00:00Z

Progress = Callable[[str], None]
"""Receives short human-readable status lines while a build runs."""


@dataclass(frozen=True)
class BuildResult:
    """A built component and how it was obtained."""

    path: Path
    """Where the component was written (the ``output`` argument), or the build cache's own
    entry when ``output`` was None."""
    digest: str
    """sha256 hex over every input of the build; names the cache entry."""
    component_sha256: str
    """sha256 hex of the component's bytes."""
    cached: bool
    """True when the component came from the build cache and componentize-py did not run."""
    seconds: float
    """Wall time of the whole call."""


class ComponentizeError(BuildError):
    """componentize-py ran and failed. ``details`` is its complete output, for ``--verbose``."""

    def __init__(
        self,
        message: str,
        *,
        details: str,
        filename: str | None = None,
        lineno: int | None = None,
    ) -> None:
        super().__init__(message, filename=filename, lineno=lineno)
        self.details = details


def _cache_hit(
    cached_path: Path, output: Path | None, digest: str, started: float
) -> BuildResult | None:
    if not _is_component_file(cached_path):
        return None
    return _result(cached_path, output, digest, started, cached=True)


def _result(
    cached_path: Path, output: Path | None, digest: str, started: float, *, cached: bool
) -> BuildResult:
    """The build's result, copied from the cache entry to ``output`` (None: left there)."""
    path = cached_path
    if output is not None:
        atomic_copy(cached_path, output)
        path = output
    return BuildResult(
        path=path,
        digest=digest,
        component_sha256=_sha256_file(path),
        cached=cached,
        seconds=time.monotonic() - started,
    )


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An advisory lock across processes (released by the kernel if the holder dies)."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def build_component(
    source: Path,
    *,
    output: Path | None,
    wit: Path | None = None,
    world: str | None = None,
    python_path: Sequence[Path] = (),
    progress: Progress | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    site_packages: bool = True,
) -> BuildResult:
    """Compile the handler module ``source`` into a component at ``output``.

    ``output=None`` leaves the component in the build cache and returns that entry's path: no
    copy is written (and synced) per call, which matters for a component loaded by every new
    process (the sandbox's 21 MB interpreter). The entry is shared and named by the build's
    inputs: read it, never write it (``mty cache clean`` may remove it later; copy it to keep).

    ``wit`` defaults to the ``wit/`` directory beside ``source`` and ``world`` to the only world
    it defines. ``python_path`` adds directories the handler imports from, after the source's
    own. An unchanged rebuild is served from the cache without running componentize-py.

    ``site_packages=False`` builds code that must not reach the host: componentize-py mounts
    every directory on the guest's path *writable* while it pre-initialises the guest (running
    its top-level code), and appends the host's site-packages to that path by itself; here it
    gets an empty one of the build's own instead, so the code sees only its staged copies
    (``Sandbox(packages=...)``: a wheel's ``__init__`` could otherwise drop a ``.pth`` into the
    host's site-packages, run by every later Python start).

    Raises ``BadInput`` for unusable arguments and ``BuildError`` (a ``ComponentizeError`` when
    the tool ran) when the build fails, with the handler's file and line when it is a Python
    error in the handler.
    """
    started = time.monotonic()
    report: Progress = progress or _ignore
    source = _check_source(source)
    output = None if output is None else Path(output)
    if output is not None and output.is_dir():
        raise BadInput(f"output {output} is a directory; give the path of the .wasm file to write")
    wit = _resolve_wit(source, wit)
    world = world if world is not None else _default_world(wit)
    roots = [source.parent, *(Path(p) for p in python_path)]
    for root in roots[1:]:
        if not root.is_dir():
            raise BadInput(f"python path entry {root} is not a directory")
    version = _tool_version()

    digest = compute_digest(
        module=source.stem,
        roots=roots,
        wit=wit,
        world=world,
        tool_version=version,
        # An isolated build sees no installed distribution, and is not a plain build's twin.
        distributions=None if site_packages else ["(isolated)"],
    )
    builds = cache_root() / "builds"
    cached_path = builds / f"{digest}.wasm"
    hit = _cache_hit(cached_path, output, digest, started)
    if hit is not None:
        return hit
    # What componentize-py would fail on only after a panic or a minute: named here at once.
    _check_first(source, wit, world, roots)
    builds.mkdir(parents=True, exist_ok=True)
    # One builder per digest at a time (pytest-xdist workers, parallel `mty build`s): the others
    # wait here, then find the cache entry the first one published.
    with _exclusive(builds / f".{digest}.lock"):
        hit = _cache_hit(cached_path, output, digest, started)
        if hit is not None:
            return hit
        executable = _find_tool()
        report(f"building {source.name} with {_TOOL} {version} ...")
        # The tool writes straight to its -o path, so point it at a private name in the cache
        # directory and publish with one rename once the result is known to be whole.
        fd, tmp_name = tempfile.mkstemp(prefix=f".{digest}.", suffix=".wasm.tmp", dir=builds)
        os.close(fd)
        tmp_path = Path(tmp_name)
        stage = Path(
            tempfile.mkdtemp(prefix=f".{digest[:16]}.", suffix=".stage", dir=builds)
        ).resolve()
        try:
            staged = _stage(build_inputs(source.stem, roots), len(roots), stage)
            command = [
                executable,
                "-d",
                str(_stage_wit(wit, stage / "wit")),
                "-w",
                world,
                "componentize",
                source.stem,
                *(arg for root in staged for arg in ("-p", str(root))),
                "-o",
                str(tmp_path.resolve()),
            ]
            env: dict[str, str] = {}
            if not site_packages:
                # componentize-py appends $VIRTUAL_ENV's lib/**/site-packages to the guest's
                # path (else pipenv's, else the system Python's): point it at an empty one.
                isolated = stage / "isolated"
                (isolated / "lib" / "site-packages").mkdir(parents=True)
                env["VIRTUAL_ENV"] = str(isolated)
            _run(
                command,
                env=env,
                roots=roots,
                source=source,
                timeout=timeout,
                report=report,
                started=started,
                cwd=stage,
            )
            if not _is_component_file(tmp_path):
                raise BuildError(f"{_TOOL} succeeded but {tmp_path} is not a WebAssembly component")
            _fsync(tmp_path)
            os.replace(tmp_path, cached_path)
            _share_with_store(cached_path)
        finally:
            tmp_path.unlink(missing_ok=True)
            shutil.rmtree(stage, ignore_errors=True)

    result = _result(cached_path, output, digest, started, cached=False)
    report(f"done in {result.seconds:.1f} s")
    return result


def _ignore(_: str) -> None:
    pass


def _check_first(source: Path, wit: Path, world: str, roots: Sequence[Path]) -> None:
    check_export_names(wit, world)
    check_syntax(syntax_inputs(build_inputs(source.stem, roots)))


def _share_with_store(cached_path: Path) -> None:
    """Hard-link a new build into the component store (``components/<sha256>.wasm``), where
    loading it would put a second copy of the same bytes (18 MB each: a build used to be
    stored twice). Best effort: the store copies it on load when the link cannot be made."""
    from mighty.engine import ComponentStore

    try:
        target = ComponentStore().path_for(_sha256_file(cached_path))
        if target.exists():
            return
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.link(cached_path, target)
    except OSError:
        pass


def _source_epoch() -> int:
    """The fixed mtime of staged files: ``$SOURCE_DATE_EPOCH`` (reproducible-builds.org), else
    1980-01-01 (the earliest a zip, hence a wheel, can hold)."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "")
    return int(value) if value.isdigit() else _DEFAULT_EPOCH


def _stage(inputs: Sequence[BuildInput], count: int, stage: Path) -> list[Path]:
    """Copy ``inputs`` under ``stage/<root index>/``; return the staged roots, in order.

    Only bytes are copied (no mode bits, owners or times of the originals), then every file
    and directory gets the same mtime, deepest first so setting a file's time does not move
    its directory's again.
    """
    staged = [stage / str(index) for index in range(count)]
    for root in staged:
        root.mkdir()
    for index, rel, path in inputs:
        target = staged[index].joinpath(*rel.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    epoch = _source_epoch()
    for root in staged:
        for dirpath, dirnames, filenames in os.walk(root, topdown=False):
            directory = Path(dirpath)
            if "__pycache__" not in filenames and "__pycache__" not in dirnames:
                (directory / "__pycache__").write_bytes(b"")
                filenames.append("__pycache__")
            for name in filenames:
                os.utime(directory / name, (epoch, epoch))
            os.utime(directory, (epoch, epoch))
    return staged


def _stage_wit(wit: Path, target: Path) -> Path:
    """The WIT path to give componentize-py: ``wit`` itself, or, when the build adds the vendored
    WASI packages (:func:`wasi_deps`), a copy of its ``.wit`` files at ``target`` with them
    under ``deps/`` (the user's folder is never written to)."""
    added = wasi_deps(wit)
    if not added:
        return wit.resolve()
    # The files the digest covers, nothing else: the package's own and its deps/.
    for rel, path in input_files(wit, suffixes=frozenset({".wit"})):
        _copy(path, target.joinpath(*rel.split("/")))
    for rel, path in added:
        _copy(path, target.joinpath("deps", *rel.split("/")))
    return target


def _copy(path: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(path.read_bytes())


def _check_source(source: Path) -> Path:
    source = Path(source)
    if not source.is_file():
        raise BadInput(f"handler source {source} does not exist or is not a file")
    if source.suffix != ".py":
        raise BadInput(f"handler source {source} is not a Python file (.py)")
    if not source.stem.isidentifier():
        raise BadInput(
            f"handler source {source}: {source.stem!r} is not a valid Python module name"
        )
    return source


def _resolve_wit(source: Path, wit: Path | None) -> Path:
    if wit is None:
        beside = source.parent / "wit"
        if not beside.is_dir():
            raise BadInput(
                f"no WIT directory for {source}: expected {beside}/ beside the handler;"
                " pass --wit PATH to use another one"
            )
        return beside
    wit = Path(wit)
    if not wit.exists():
        raise BadInput(f"WIT path {wit} does not exist")
    return wit


def _default_world(wit: Path) -> str:
    worlds = find_worlds(wit)
    if len(worlds) == 1:
        return worlds[0]
    if not worlds:
        raise BadInput(f"no world is defined in {wit}; add one or pass --world NAME")
    listed = ", ".join(worlds)
    raise BadInput(f"{wit} defines several worlds ({listed}); choose one with --world NAME")


def _tool_version() -> str:
    try:
        return importlib.metadata.version(_TOOL)
    except importlib.metadata.PackageNotFoundError:
        pass
    # Installed elsewhere (found on PATH): ask it, since the version is part of the digest.
    completed = subprocess.run(  # noqa: S603  (fixed executable, no shell)
        [_find_tool(), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    words = completed.stdout.split()
    if completed.returncode != 0 or len(words) < 2:
        raise BadInput(f"cannot tell which version of {_TOOL} is installed: {completed.stderr}")
    return words[-1]


def _find_tool() -> str:
    # The scripts directory of this interpreter first: PATH may hold another version, and the
    # version we hash into the digest is the one installed beside us.
    scripts = Path(sys.executable).parent
    for name in (_TOOL, f"{_TOOL}.exe"):
        candidate = scripts / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(_TOOL)
    if found is None:
        raise BadInput(
            f"cannot find the {_TOOL} executable beside {sys.executable} or on PATH;"
            f" install it with `pip install {_TOOL}==0.25.1`"
        )
    return found


def _run(
    command: Sequence[str],
    *,
    roots: Sequence[Path],
    source: Path,
    timeout: float,
    report: Progress,
    started: float,
    cwd: Path,
    env: dict[str, str],
) -> None:
    env = {**os.environ, **env}
    # A Rust backtrace is noise to a handler author and hides the Python error we parse out.
    env["RUST_BACKTRACE"] = "0"
    env["RUST_LIB_BACKTRACE"] = "0"
    # The tool's own (host) Python: the same hash seed, clock zone and epoch on every machine,
    # and no bytecode written beside its sources.
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["TZ"] = "UTC"
    env["SOURCE_DATE_EPOCH"] = str(_source_epoch())
    run_started = time.monotonic()
    with subprocess.Popen(  # noqa: S603  (fixed executable, arguments are paths, no shell)
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        text=True,
        encoding="utf-8",
        errors="replace",
    ) as proc:
        try:
            while True:
                try:
                    stdout, stderr = proc.communicate(timeout=_PROGRESS_INTERVAL)
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - run_started >= timeout:
                        proc.kill()
                        stdout, stderr = proc.communicate()
                        raise ComponentizeError(
                            f"{_TOOL} did not finish within {timeout:g} s and was stopped",
                            details=_join_output(stdout, stderr),
                        ) from None
                    report(f"building {source.name}: {time.monotonic() - started:.0f} s")
        except BaseException:
            # Popen's __exit__ would wait for the child: on Ctrl-C or a failing progress
            # callback, do not sit out the rest of a multi-second build.
            proc.kill()
            raise
    if proc.returncode != 0:
        found = diagnose(stderr, roots=roots, source=source)
        raise ComponentizeError(
            found.message,
            details=_join_output(stdout, stderr),
            filename=found.filename,
            lineno=found.lineno,
        )


def _join_output(stdout: str, stderr: str) -> str:
    parts = [part.rstrip() for part in (stdout, stderr) if part.strip()]
    return "\n".join(parts)


def _is_component_file(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return head == _COMPONENT_PREAMBLE + _COMPONENT_LAYER


def _fsync(path: Path) -> None:
    # Without it a crash soon after the rename can leave an empty file under the entry's name.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
