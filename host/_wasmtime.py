"""The one seam to wasmtime-py's private parts.

mighty calls parts of wasmtime's C API that wasmtime-py does not wrap (raw host functions on the
component linker, memory creators, the fuel and epoch calls of a store, serialised components,
resources by pointer, ...), through ``wasmtime._ffi``, and builds wasmtime-py objects from raw
pointers with their private ``_from_ptr`` constructors. Those are private to the pinned
wasmtime-py release and may change with any other: every module of mighty reaches them through
here and nowhere else, so an upgrade has one import list to read, and tests/test_wasmtime_seam.py
checks that nothing else imports them and that each attribute mighty uses of them exists in the
installed wasmtime-py (a rename fails there, not in some rarely taken path at run time).

Rejected: wrapping each C function in a typed function of ours (~80 of them, on the hottest
paths: a Python call more per use for nothing a test cannot check).
"""

from __future__ import annotations

from wasmtime import Module, WasmtimeError
from wasmtime import _ffi as ffi
from wasmtime.component import Component, ResourceAny, ResourceType
from wasmtime.component import _linker as component_linker
from wasmtime.component import _types as component_types
from wasmtime.component._enter import maybe_raise_last_exn
from wasmtime.component._types import FuncType

__all__ = [
    "component_from_ptr",
    "component_linker",
    "component_types",
    "error_from_ptr",
    "ffi",
    "func_type_from_ptr",
    "maybe_raise_last_exn",
    "module_from_ptr",
    "resource_any_from_ptr",
    "resource_type_from_ptr",
]

# wasmtime-py's constructors from a raw pointer (each takes ownership as its class documents).
error_from_ptr = WasmtimeError._from_ptr
component_from_ptr = Component._from_ptr
module_from_ptr = Module._from_ptr
func_type_from_ptr = FuncType._from_ptr
resource_type_from_ptr = ResourceType._from_ptr
resource_any_from_ptr = ResourceAny._from_ptr
