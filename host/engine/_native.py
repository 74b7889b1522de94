"""Keeping C callbacks valid for the whole life of the process; C calls that keep the GIL.

wasmtime calls back into Python (memory growth, epoch deadlines, host functions, finalizers)
until the last store, linker and engine are gone, and at interpreter exit those can be freed
after Python has already torn down the modules that hold the ctypes callback objects. A freed
callback object is a dangling function pointer: a segfault at exit. :func:`immortal` leaks one
reference to each callback object on purpose, so its trampoline outlives every wasmtime object.

:func:`quick_call` is a prototype of one of wasmtime's C functions that runs without releasing
the GIL. ctypes releases it around every foreign call; when another thread waits for it (two
workers), the waiter takes it and the caller must wait to get it back, at every call, however
short. Only for calls that return at once (set or read fuel, an epoch deadline, allocate or
free a value): never for one that runs guest code or can wait.
"""

from __future__ import annotations

import ctypes
from typing import Any, TypeVar

from mighty._wasmtime import ffi

__all__ = ["immortal", "quick_call"]

_T = TypeVar("_T")


def immortal(callback: _T) -> _T:
    """Return ``callback`` after making sure it is never freed."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(callback))
    return callback


_HOLDING_GIL = ctypes.PyDLL(ffi.dll._name)


def quick_call(name: str, restype: Any, *argtypes: Any) -> Any:
    """wasmtime's C function ``name`` as a prototype that keeps the GIL (see the module note).

    ``dll[name]`` is a new function object each time, so wasmtime-py's own stays as it is.
    """
    fn = _HOLDING_GIL[name]
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn
