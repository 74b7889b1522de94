"""The gate's view of wasmtime's C values: our own prototypes of the few C functions an import
calls, the offsets of ``wasmtime_component_val_t``, and the records a linked import is compiled
into (:class:`_Registered`, the per-call :class:`_CallStore`).

Shared by the trampoline (``_gate.py``) and the frames it compiles (``_frames.py``); nothing
here calls Python code of the gate, so both import it and it imports neither.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mighty._errors import Closed
from mighty._wasmtime import ffi
from mighty.abi import FuncCodec, WitType
from mighty.gate._context import Binding, GuestContext, ResourceKind

__all__: list[str] = []


def _raw(name: str, restype: Any, *argtypes: Any, gil: bool = False) -> Any:
    """Our own prototype of a wasmtime C function (``dll[name]`` is a new function object,
    so wasmtime-py's own prototype stays as it is): pointers as plain ``c_void_p``, which takes
    ints and ctypes pointers alike, and no Python wrapper frame around the call. ``gil``: call
    it without releasing the GIL (only for functions that return at once)."""
    fn = (_HOLDING_GIL if gil else ffi.dll)[name]
    fn.restype = restype
    fn.argtypes = list(argtypes)
    return fn


_HOLDING_GIL = ctypes.PyDLL(ffi.dll._name)
_VP = ctypes.c_void_p
_get_data = _raw("wasmtime_context_get_data", _VP, _VP, gil=True)
_any_to_host = _raw("wasmtime_component_resource_any_to_host", _VP, _VP, _VP, _VP, gil=True)
_host_type = _raw("wasmtime_component_resource_host_type", ctypes.c_uint32, _VP, gil=True)
_host_rep = _raw("wasmtime_component_resource_host_rep", ctypes.c_uint32, _VP, gil=True)
_host_delete = _raw("wasmtime_component_resource_host_delete", None, _VP, gil=True)
_val_new = _raw("wasmtime_component_val_new", _VP, _VP, gil=True)
_val_clone = _raw("wasmtime_component_val_clone", None, _VP, _VP, gil=True)
_val_delete = _raw("wasmtime_component_val_delete", None, _VP, gil=True)
_vallist_new = _raw(
    "wasmtime_component_vallist_new", None, _VP, ctypes.c_size_t, ctypes.c_char_p, gil=True
)
_add_func_raw = _raw(
    "wasmtime_component_linker_instance_add_func", _VP, _VP, _VP, ctypes.c_size_t, _VP, _VP, _VP
)
_byref = ctypes.byref
_string_at = ctypes.string_at

_VAL = ffi.wasmtime_component_val_t
_VAL_SIZE = ctypes.sizeof(_VAL)
_PAYLOAD = _VAL.of.offset
_VAL_AT = _VAL.from_address
_PTR_AT = _VP.from_address
_PAIR_AT = (ctypes.c_uint64 * 2).from_address
_SLOT_AT = (ctypes.c_char * _VAL_SIZE).from_address
_BYTE_AT = (ctypes.c_char * 1).from_address
_ENTRY_SIZE = ctypes.sizeof(ffi.wasmtime_component_valrecord_entry_t)
_ENTRY_VAL = ffi.wasmtime_component_valrecord_entry_t.val.offset
_RECORD_DATA = _PAYLOAD + ffi.wasmtime_component_valrecord_t.data.offset  # type: ignore[attr-defined]  # a field descriptor on the class
_ZERO_VAL = _VAL()
_ZERO_REF = ctypes.addressof(_ZERO_VAL)
_CONTEXT_PTR = ctypes.POINTER(ffi.wasmtime_context_t)
_FUNC_TYPE_PTR = ctypes.POINTER(ffi.wasmtime_component_func_type_t)
_ERROR_PTR = ctypes.POINTER(ffi.wasmtime_error_t)
assert _VAL_SIZE == 32
assert _PAYLOAD == 8
assert ffi.wasmtime_component_valresult_t.val.offset == 8  # type: ignore[attr-defined]  # a field descriptor on the class
# A list<u8> of up to this many bytes is copied out of wasmtime's value array in one C call
# and sliced; a longer one is read in place (no copy of 32 bytes per byte).
_SMALL_LIST = 4096


class _CallStore:
    """``ctx.call_store`` while an import is served: the store context of that call.

    One per instance, pointed at the call's context when it begins and cleared when it ends
    (an import never re-enters its own instance). ``ptr`` is the raw context pointer for our
    own C prototypes; ``_context()`` is the wasmtime-py ``Storelike`` side (for
    ``ResourceHost.to_any`` and the like), and refuses once the call is over, as wasmtime-py's
    own ``StoreContext`` does."""

    __slots__ = ("host", "host_ref", "ptr", "slots", "slots_at")

    def __init__(self) -> None:
        self.ptr: int | None = None
        # The element slots of this instance's list<u8> results (``_fused``), made when needed.
        self.slots: bytearray | None = None
        self.slots_at = 0
        # The out-parameter of resource lookups during this instance's calls (one at a time).
        self.host = _VP()
        self.host_ref = _byref(self.host)

    def _context(self) -> Any:
        if self.ptr is None:
            raise Closed("caller is no longer valid (the import's call is over)")
        return ctypes.cast(self.ptr, _CONTEXT_PTR)


_Lift = Callable[["GuestContext", Any, Any, int], list[Any]]
_Lower = Callable[["GuestContext", Any, Any, Any], None]
_Serve = Callable[["GuestContext", Any, Any, Any, int, Any], None]


@dataclass(eq=False)
class _Registered:
    """One host function as linked: everything a call needs, made once (``_compile``) when
    the import is first called, then shared by every instance of the linker."""

    binding: Binding
    codec: FuncCodec | None = None
    # Lifts the raw arguments straight into what the implementation takes (resources as the
    # host objects behind them): the path of a call no hook watches, one walk of the args.
    lift_objects: _Lift | None = None
    # Lifts them into what hooks see (resources as Handles); ``resolve`` then turns those
    # Handles into host objects for the implementation (None when there are no resources).
    lift: _Lift | None = None
    resolve: Callable[[GuestContext, list[Any]], list[Any]] | None = None
    # Turns Handles in the result into guest-owned resources (None: nothing to turn).
    to_guest: Callable[[GuestContext, Any], Any] | None = None
    # Writes the result into wasmtime's result slot: ``lower(ctx, store, result, address)``.
    lower: _Lower | None = None
    # The call no hook watches, in one frame where the import's shape allows: lift the
    # arguments into what the implementation takes, run it, lower its result.
    serve: _Serve | None = None
    # For a ``[method]R.f``: the kind of R, the resource of the binding's own interface that
    # ``self`` always is (wasmtime checks a handle's type when the guest passes it, and reps
    # are unique across kinds within an instance, so a wrong one would not be found anyway).
    self_kind: ResourceKind | None = None
    # The parameter types and each one's reader (for the hooked frames).
    params: Sequence[WitType] = ()
    getters: Sequence[Callable[[int], Any]] = ()


def _error_ptr(message: str) -> int:
    ptr = ffi.wasmtime_error_new(message.encode())
    return int(ctypes.cast(ptr, ctypes.c_void_p).value or 0)


_INT_AT: dict[str, Any] = {
    "bool": ctypes.c_bool.from_address,
    "s8": ctypes.c_int8.from_address,
    "u8": ctypes.c_uint8.from_address,
    "s16": ctypes.c_int16.from_address,
    "u16": ctypes.c_uint16.from_address,
    "s32": ctypes.c_int32.from_address,
    "u32": ctypes.c_uint32.from_address,
    "s64": ctypes.c_int64.from_address,
    "u64": ctypes.c_uint64.from_address,
}


_KINDS: dict[int, ResourceKind] = {}
