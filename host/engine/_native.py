"""Keeping C callbacks valid for the whole life of the process.

wasmtime calls back into Python (memory growth, epoch deadlines, host functions, finalizers)
until the last store, linker and engine are gone, and at interpreter exit those can be freed
after Python has already torn down the modules that hold the ctypes callback objects. A freed
callback object is a dangling function pointer: a segfault at exit. :func:`immortal` leaks one
reference to each callback object on purpose, so its trampoline outlives every wasmtime object.
"""

from __future__ import annotations

import ctypes
from typing import TypeVar

__all__ = ["immortal"]

_T = TypeVar("_T")


def immortal(callback: _T) -> _T:
    """Return ``callback`` after making sure it is never freed."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(callback))
    return callback
