"""The value codec's compiled speedups (``_speedups.c``), when they are there and wanted.

``native`` is the compiled module, set up for the wasmtime library wasmtime-py loaded (None
when it was not built: no compiler, or a build with ``MIGHTY_PURE_PYTHON=1``). ``use_native()``
says whether to use it now: not when ``MIGHTY_PURE_PYTHON`` is set (to anything but ``0``).
Each :class:`~mighty.abi.FuncCodec` asks once, when it is made, so one process can hold codecs
of either kind (the tests hold the two to the same values and the same errors).
"""

from __future__ import annotations

import ctypes
import os

from mighty._errors import HostError
from mighty._wasmtime import ffi

from ._values import Err, Ok, Some, Variant

__all__ = ["native", "use_native"]

_FUNCTIONS = (
    "wasm_byte_vec_new",
    "wasmtime_component_vallist_new_uninit",
    "wasmtime_component_valrecord_new_uninit",
    "wasmtime_component_valtuple_new_uninit",
    "wasmtime_component_val_new",
    "wasmtime_component_val_free",
    "wasmtime_component_val_delete",
    "wasmtime_component_func_call",
    "wasmtime_context_set_fuel",
    "wasmtime_context_get_fuel",
    "wasmtime_context_set_epoch_deadline",
    "wasmtime_error_delete",
)

try:
    from mighty.abi import _speedups as native
except ImportError:  # not built: the pure-Python codec
    native = None  # type: ignore[assignment]
else:
    _VAL = ffi.wasmtime_component_val_t
    _ENTRY = ffi.wasmtime_component_valrecord_entry_t
    native.init(
        functions={
            name: ctypes.cast(getattr(ffi.dll, name), ctypes.c_void_p).value or 0
            for name in _FUNCTIONS
        },
        sizes=(ctypes.sizeof(_VAL), _VAL.of.offset, ctypes.sizeof(_ENTRY), _ENTRY.val.offset),
        some=Some,
        ok=Ok,
        err=Err,
        variant=Variant,
        mismatch=HostError,
    )


def use_native() -> bool:
    """Whether the compiled codec is there and wanted."""
    return native is not None and os.environ.get("MIGHTY_PURE_PYTHON", "") in ("", "0")
