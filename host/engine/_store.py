"""The component store: every component mighty loads, kept by the sha256 of its bytes.

Traces name components by sha256; the file they were loaded from is a poor pointer (a relative
path, or ``.mighty/X.wasm`` that the next build overwrites). So :meth:`Component.load` hands
every component's bytes here once, and ``mty replay`` finds the recorded component by hash in
``<cache>/components/<sha256>.wasm`` wherever it is run from and whatever was rebuilt since.

Writes are atomic (``atomic_write_bytes``: a private temp file renamed into place), so racing
writers leave one whole file; the content is a pure function of the name, so either is right.
A hit costs one ``stat``. A store that cannot be written (a read-only cache, a full disk) never
fails a load: the component is still usable, it is only not kept. Rejected: hardlinking the
source file (it is the very file a rebuild overwrites in place when it has one link; a copy of
bytes already in memory is as cheap) and an index file (the directory is the index).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

from mighty._cachedir import atomic_write_bytes, cache_root
from mighty._errors import BadInput

__all__ = ["ComponentStore", "keep_component"]


class ComponentStore:
    """Components on disk under ``root/components/<sha256>.wasm`` (default root: the cache)."""

    def __init__(self, root: Path | None = None) -> None:
        self.directory = (root if root is not None else cache_root()) / "components"

    def path_for(self, sha256: str) -> Path:
        """Where the component with this sha256 is (or would be) kept."""
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise BadInput(f"not a sha256 hex digest: {sha256!r}")
        return self.directory / f"{sha256}.wasm"

    def keep(self, sha256: str, data: bytes) -> Path | None:
        """Store ``data`` (whose sha256 the caller computed) unless it is already there.

        Returns its path, or None when the store cannot be written.
        """
        path = self.path_for(sha256)
        try:
            if path.stat().st_size == len(data):
                return path
        except OSError:
            pass
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            atomic_write_bytes(path, data)
        except OSError:
            return None
        return path

    def find(self, sha256: str) -> Path | None:
        """The stored file for ``sha256``, if there is one and its bytes still hash to it."""
        path = self.path_for(sha256)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != sha256:
            # Damaged: drop it, so the next load of the real component stores it again.
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None
        return path


def keep_component(sha256: str, data: bytes) -> None:
    """Keep a loaded component in the default store (called by :meth:`Component.load`)."""
    ComponentStore().keep(sha256, data)
