"""The on-disk cache of compiled components.

Compiling a componentize-py component takes seconds; deserializing its compiled form takes tens of
milliseconds. Entries are keyed by (component bytes sha256, engine settings fingerprint, wasmtime
version), so a change to any of them is a miss, never a wrong hit.

wasmtime trusts serialized artifacts completely (loading one is loading native code), so every
entry carries a sha256 of its payload and is verified before wasmtime sees it. A truncated,
corrupt or foreign entry is deleted and rebuilt, never loaded. Writes are atomic renames, so
concurrent writers and crashes leave either no entry or a whole one.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import struct
from pathlib import Path

from wasmtime import WasmtimeError
from wasmtime import _ffi as ffi
from wasmtime import component as wc

from mighty._cachedir import atomic_write_bytes, cache_root
from mighty.engine._engine import SETTINGS, get_engine, wasmtime_version

__all__ = ["CompiledCache"]

_MAGIC = b"MTYCWASM"
_FORMAT = 1
_HEADER = struct.Struct("<8sI32sQ")  # magic, format, sha256(payload), len(payload)


class CompiledCache:
    """Compiled components on disk under ``root/compiled/<wasmtime>/<settings>/``."""

    def __init__(self, root: Path | None = None) -> None:
        base = root if root is not None else cache_root()
        self.directory = base / "compiled" / wasmtime_version() / SETTINGS.fingerprint

    def path_for(self, component_sha256: str) -> Path:
        return self.directory / f"{component_sha256}.cwasm"

    def load(self, component_sha256: str) -> wc.Component | None:
        """The cached compiled component, or None if absent or unusable (then it is removed)."""
        path = self.path_for(component_sha256)
        try:
            with path.open("rb") as f:
                header = f.read(_HEADER.size)
                if len(header) != _HEADER.size:
                    raise _Corrupt
                magic, fmt, digest, length = _HEADER.unpack(header)
                if magic != _MAGIC or fmt != _FORMAT:
                    raise _Corrupt
                payload = bytearray(length)
                if f.readinto(payload) != length or f.read(1):
                    raise _Corrupt
        except FileNotFoundError:
            return None
        except (_Corrupt, OSError):
            self._discard(path)
            return None
        if hashlib.sha256(payload).digest() != digest:
            self._discard(path)
            return None
        try:
            return _deserialize(payload)
        except WasmtimeError:
            # Verified bytes that wasmtime still refuses: written by another build of wasmtime
            # with the same version string. Rebuild.
            self._discard(path)
            return None

    def store(self, component_sha256: str, compiled: wc.Component) -> Path:
        payload = bytes(compiled.serialize())
        header = _HEADER.pack(_MAGIC, _FORMAT, hashlib.sha256(payload).digest(), len(payload))
        path = self.path_for(component_sha256)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_bytes(path, header + payload)
        return path

    @staticmethod
    def _discard(path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


class _Corrupt(Exception):
    pass


def _deserialize(payload: bytearray) -> wc.Component:
    # wasmtime-py's Component.deserialize copies the payload once more into a ctypes array;
    # a view over our bytearray avoids that copy of tens of megabytes.
    buffer = (ctypes.c_uint8 * len(payload)).from_buffer(payload)
    ptr = ctypes.POINTER(ffi.wasmtime_component_t)()
    error = ffi.wasmtime_component_deserialize(
        get_engine().ptr(), buffer, len(payload), ctypes.byref(ptr)
    )
    if error:
        raise WasmtimeError._from_ptr(error)
    return wc.Component._from_ptr(ptr)
