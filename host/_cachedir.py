"""Where mighty keeps its caches, and the one safe way to put a file there.

Several processes may fill the same cache at once (two ``mty build`` runs, a worker pool compiling
the same component). Every write therefore goes to a private temporary file in the target's
directory and is renamed over the target: a reader sees the old file, the new file, or nothing,
never half a file, and when two writers race the last rename wins with a complete file. No locks:
the cached content is a pure function of its key, so either writer's bytes are right.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_copy", "atomic_write_bytes", "cache_root"]

CACHE_DIR_ENV = "MTY_CACHE_DIR"

# Fills an open file descriptor with the new content.
_Fill = Callable[[int], None]


def cache_root() -> Path:
    """The cache directory: ``$MTY_CACHE_DIR`` if set, else the platform's user cache dir.

    Created (mode 0o700, caches may hold private code) when missing.
    """
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        root = Path(configured).expanduser()
    else:
        import platformdirs

        root = platformdirs.user_cache_path("mighty")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is never seen partly written."""
    _atomic_write(path, lambda fd: _write_all(fd, data))


def atomic_copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` so that ``dst`` is never seen partly written."""
    with src.open("rb") as source:

        def copy(fd: int) -> None:
            with os.fdopen(os.dup(fd), "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)

        _atomic_write(path=dst, fill=copy)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _atomic_write(path: Path, fill: _Fill) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same directory as the target, so the rename cannot cross file systems.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            fill(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        # mkstemp creates 0o600. Keep the mode of the file being replaced, else the usual 0o644;
        # reading the umask would mean setting it, which races with other threads.
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = 0o644
        os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        # BaseException too: a KeyboardInterrupt mid-copy must not leave the temp file behind.
        Path(tmp_name).unlink(missing_ok=True)
        raise
