"""The on-disk cache of compiled components (and of the core modules they share, ``_shared``).

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
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import wasmtime
from wasmtime import WasmtimeError
from wasmtime import component as wc

from mighty._cachedir import atomic_write_bytes, cache_root
from mighty._wasmtime import component_from_ptr, error_from_ptr, ffi, module_from_ptr
from mighty.engine._engine import SETTINGS, get_engine, wasmtime_version

__all__ = ["CompiledCache"]

_C = TypeVar("_C")
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

    def module_path_for(self, module_sha256: str) -> Path:
        return self.directory / f"module-{module_sha256}.cwasm"

    def load(self, component_sha256: str) -> wc.Component | None:
        """The cached compiled component, or None if absent or unusable (then it is removed)."""
        return self._load(self.path_for(component_sha256), _deserialize)

    def load_module(self, module_sha256: str) -> wasmtime.Module | None:
        """The cached compiled core module (a shared one), or None, as :meth:`load`."""
        return self._load(self.module_path_for(module_sha256), _deserialize_module)

    def _load(self, path: Path, deserialize: Callable[[bytearray], _C]) -> _C | None:
        payload = self._read(path)
        if payload is None:
            return None
        try:
            return deserialize(payload)
        except WasmtimeError:
            # Verified bytes that wasmtime still refuses: written by another build of wasmtime
            # with the same version string. Rebuild.
            self._discard(path)
            return None

    def store(self, component_sha256: str, compiled: wc.Component) -> Path:
        return self._write(self.path_for(component_sha256), bytes(compiled.serialize()))

    def store_module(self, module_sha256: str, compiled: wasmtime.Module) -> Path:
        return self._write(self.module_path_for(module_sha256), bytes(compiled.serialize()))

    def _read(self, path: Path) -> bytearray | None:
        """A verified entry's payload, or None if absent or unusable (then it is removed)."""
        try:
            with path.open("rb") as f:
                header = f.read(_HEADER.size)
                if len(header) != _HEADER.size:
                    raise _Corrupt
                magic, fmt, digest, length = _HEADER.unpack(header)
                if magic != _MAGIC or fmt != _FORMAT:
                    raise _Corrupt
                # The header's length is believed only if the file is that long.
                if length != os.fstat(f.fileno()).st_size - len(header):
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
        return payload

    def _write(self, path: Path, payload: bytes) -> Path:
        header = _HEADER.pack(_MAGIC, _FORMAT, hashlib.sha256(payload).digest(), len(payload))
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
        raise error_from_ptr(error)
    return component_from_ptr(ptr)


def _deserialize_module(payload: bytearray) -> wasmtime.Module:
    buffer = (ctypes.c_uint8 * len(payload)).from_buffer(payload)
    ptr = ctypes.POINTER(ffi.wasmtime_module_t)()
    error = ffi.wasmtime_module_deserialize(
        get_engine().ptr(), buffer, len(payload), ctypes.byref(ptr)
    )
    if error:
        raise error_from_ptr(error)
    return module_from_ptr(ptr)
