"""How one import is served: the frames the gate compiles once per import and linker.

``_compile`` decides, from the import's WIT type and the binding, how each argument is read
from wasmtime's value array, how the result is written back, and which frame serves a call no
hook watches: a fused frame for a clock's ``now`` and ``get-random-bytes``, one frame per
common shape (``_server``, ``_method_server``) otherwise; ``_direct_lifter`` turns arguments
into what the implementation takes, resources included. The trampoline (``_gate.py``) calls
the compiled frame; hooks see the same arguments through the lifts made here.

Rejected: deciding per call (what wasmtime-py's ``add_func`` does: it rebuilds the type's
converters on every call). The measurements behind each shape are in ``_gate.py``'s notes on
the trampoline and in benchmarks/README.md.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from typing import Any

from wasmtime import component as wc

from mighty._errors import HostError
from mighty._wasmtime import error_from_ptr, func_type_from_ptr
from mighty.abi import (
    BorrowType,
    FuncCodec,
    FuncSig,
    ListType,
    MapType,
    OptionType,
    OwnType,
    PrimitiveType,
    RecordType,
    ResultType,
    TupleType,
    VariantType,
    WitType,
)
from mighty.abi import Err as ErrValue
from mighty.abi import Ok as OkValue
from mighty.abi import Some as SomeValue
from mighty.abi import Variant as VariantValue
from mighty.gate._context import (
    Direct,
    GuestContext,
    GuestViolation,
    Handle,
    ResourceKind,
    StaleHandle,
)
from mighty.gate._native import (
    _BYTE_AT,
    _ENTRY_SIZE,
    _ENTRY_VAL,
    _ERROR_PTR,
    _FUNC_TYPE_PTR,
    _INT_AT,
    _KINDS,
    _PAIR_AT,
    _PAYLOAD,
    _PTR_AT,
    _RECORD_DATA,
    _SLOT_AT,
    _SMALL_LIST,
    _VAL,
    _VAL_SIZE,
    _VP,
    _ZERO_REF,
    _any_to_host,
    _byref,
    _CallStore,
    _host_delete,
    _host_rep,
    _host_type,
    _Lift,
    _Lower,
    _raw,
    _Registered,
    _Serve,
    _string_at,
    _val_clone,
    _val_delete,
    _val_new,
    _vallist_new,
)

__all__: list[str] = []


def _compile(reg: _Registered, type_ptr: Any) -> _Serve:
    fty = func_type_from_ptr(ctypes.cast(type_ptr, _FUNC_TYPE_PTR), owner=object())
    codec = FuncCodec.from_func_type(fty)
    param_types = [t for _, t in codec.sig.params]
    converters = [_handle_converter(t, _to_handle) for t in param_types]
    resolvers = [
        _handle_converter(t, _to_object_owned if isinstance(t, OwnType) else _to_object)
        for t in param_types
    ]

    # A top-level own/borrow parameter (most WASI calls: the stream, the descriptor) is read
    # straight off wasmtime's value: no ResourceAny/ResourceHost objects, no clone. Resources
    # nested in lists, options and records go through the codec and then the converter.
    getters = [
        _getter(t, lift, compiled)
        for t, lift, compiled in zip(
            param_types, codec.address_lifters(), codec.compiled_params, strict=True
        )
    ]
    nparams = len(getters)
    top = [isinstance(t, OwnType | BorrowType) for t in param_types]

    def arity(nargs: int) -> None:
        raise GuestViolation(f"expected {nparams} arguments, got {nargs}")

    # What hooks see: Handles.
    steps: list[tuple[Callable[[int], Any] | None, _Conv | None]] = [
        (None, None) if is_top else (get, conv)
        for is_top, get, conv in zip(top, getters, converters, strict=True)
    ]

    def lift_all(ctx: GuestContext, context_ptr: Any, args_ptr: Any, nargs: int) -> list[Any]:
        if nargs != nparams:
            arity(nargs)
        out = []
        for i, (get, conv) in enumerate(steps):
            at = args_ptr + i * _VAL_SIZE
            if get is None:
                out.append(_handle_at(context_ptr, _PTR_AT(at + _PAYLOAD)))
            elif conv is None:
                out.append(get(at))
            else:
                out.append(conv(ctx, get(at)))
        return out

    self_kind = reg.self_kind
    if (
        self_kind is not None
        and top
        and top[0]
        and not any(top[1:])
        and all(c is None for c in converters[1:])
    ):
        # A method with plain arguments (every stream call): its resource, then the rest.
        rest = [(i * _VAL_SIZE, get) for i, get in enumerate(getters) if i]

        def lift_method(
            ctx: GuestContext, context_ptr: Any, args_ptr: Any, nargs: int
        ) -> list[Any]:
            if nargs != nparams:
                arity(nargs)
            rep = _rep_at(ctx.call_store, context_ptr, _PTR_AT(args_ptr + _PAYLOAD))
            out = [Handle(self_kind, rep)]
            for offset, get in rest:
                out.append(get(args_ptr + offset))
            return out

        lift = lift_method
    else:
        lift = lift_all

    def resolve(ctx: GuestContext, values: list[Any]) -> list[Any]:
        return [
            conv(ctx, v) if conv is not None else v
            for conv, v in zip(resolvers, values, strict=True)
        ]

    def resolve_self(ctx: GuestContext, values: list[Any]) -> list[Any]:
        # A method on a borrowed resource with plain arguments: only the first one to turn.
        out = list(values)
        out[0] = _to_object(ctx, out[0])
        return out

    if resolvers and resolvers[0] is _to_object and all(r is None for r in resolvers[1:]):
        reg.resolve = resolve_self
    else:
        reg.resolve = resolve if any(r is not None for r in resolvers) else None
    reg.to_guest = None if codec.sig.result is None else _guest_converter(codec.sig.result)
    reg.lift = lift
    reg.lift_objects = lift_objects = _direct_lifter(param_types, getters, resolvers, reg.self_kind)
    reg.codec = codec
    reg.params, reg.getters = param_types, getters
    reg.lower = lower = _lowerer(codec, reg.to_guest)
    fused = _fused(reg.binding.fn, lower, param_types, codec.sig.result, reg.binding.direct)
    reg.serve = serve = fused or _server(
        reg.binding.fn, lift_objects, lower, param_types, getters, resolvers, reg.self_kind
    )
    return serve


def _getter(t: WitType, lift_at: Callable[[int], Any], compiled: bool) -> Callable[[int], Any]:
    """Reads one argument of type ``t`` (not a top-level resource) from its value's address:
    through the compiled codec when it serves the type (``compiled``), else the integers,
    bools and ``list<u8>`` directly and everything else through the Python codec."""
    if compiled:
        return lift_at
    if isinstance(t, PrimitiveType) and t.name in _INT_AT:
        at = _INT_AT[t.name]
        return lambda addr: at(addr + _PAYLOAD).value
    if isinstance(t, ListType) and t.element == PrimitiveType("u8"):
        return _bytes_at
    return lift_at


def _bytes_at(addr: int) -> bytes:
    """A ``list<u8>`` value: wasmtime hands it over as one 32-byte value per byte."""
    size, data = _PAIR_AT(addr + _PAYLOAD)
    if not size:
        return b""
    if size <= _SMALL_LIST:
        return _string_at(data, size * _VAL_SIZE)[_PAYLOAD::_VAL_SIZE]
    whole = (ctypes.c_char * (size * _VAL_SIZE)).from_address(data)
    return memoryview(whole).cast("B")[_PAYLOAD::_VAL_SIZE].tobytes()


_OK_EMPTY = bytes((19,)) + bytes(7) + b"\x01" + bytes(_VAL_SIZE - 9)
"""The value ``result`` ``Ok`` with no payload (kind 19, is_ok, no box), as wasmtime lays it."""
_RESULT_HEAD = struct.Struct("<B7x?7xQ8x").pack
_PRIM_KINDS = {"s8": 1, "u8": 2, "s16": 3, "u16": 4, "s32": 5, "u32": 6, "s64": 7, "u64": 8}
_PRIM_CODES = {"s8": "b", "u8": "B", "s16": "h", "u16": "H", "s32": "i", "u32": "I"}
_PRIM_CODES.update({"s64": "q", "u64": "Q"})


def _int_slot(name: str) -> tuple[int, int, int, Callable[[int, int], bytes]]:
    """(lowest, highest, value kind, packer of a whole value slot) of integer type ``name``:
    the slot is its kind byte, padding, then the integer, zero-filled to the slot's size."""
    lo, hi = _int_range(name)
    code = _PRIM_CODES[name]
    pack = struct.Struct(f"<B7x{code}{_VAL_SIZE - 8 - struct.calcsize(code)}x").pack
    return lo, hi, _PRIM_KINDS[name], pack


def _int_range(name: str) -> tuple[int, int]:
    bits = 8 * struct.calcsize(_PRIM_CODES[name])
    if name[0] == "s":
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def _lowerer(codec: FuncCodec, to_guest: _Conv | None) -> _Lower:
    """How this import's result reaches wasmtime's result slot. The common results are
    written as bytes: ``Ok`` of nothing (``result<_, E>``, most WASI stream calls) and ``Ok``
    of an integer (``check-write``'s permit); anything else, or a value that is not one of
    those exactly, goes through the codec (which checks it and names what is wrong)."""

    def generic(ctx: GuestContext, store: Any, result: Any, results_ptr: Any) -> None:
        if to_guest is not None:
            result = to_guest(ctx, result)
        if results_ptr is None:
            codec.lower_result(store, result, None)
        else:
            codec.lower_result_at(store, result, results_ptr)

    wt = codec.sig.result
    if (
        isinstance(wt, RecordType)
        and wt.fields
        and all(isinstance(t, PrimitiveType) and t.name in _PRIM_KINDS for _, t in wt.fields)
    ):
        return _int_record_lowerer(codec, wt, generic)
    if isinstance(wt, ListType) and wt.element == PrimitiveType("u8"):
        # The compiled codec writes the element slots in one C call: faster than building them
        # in a Python buffer, at every size.
        return generic if codec.compiled_result else _bytes_lowerer(generic)
    if isinstance(wt, PrimitiveType) and wt.name in _PRIM_KINDS:
        # A bare integer (a clock's instant): the whole slot in one write.
        lo, hi, kind, pack_slot = _int_slot(wt.name)

        def bare_int(ctx: GuestContext, store: Any, result: Any, results_ptr: Any) -> None:
            if type(result) is int and lo <= result <= hi:
                _SLOT_AT(results_ptr).raw = pack_slot(kind, result)
            else:
                generic(ctx, store, result, results_ptr)

        return bare_int
    if not isinstance(wt, ResultType):
        return generic
    if wt.ok is None:

        def ok_empty(ctx: GuestContext, store: Any, result: Any, results_ptr: Any) -> None:
            if type(result) is OkValue and result.value is None:
                _SLOT_AT(results_ptr).raw = _OK_EMPTY
            else:
                generic(ctx, store, result, results_ptr)

        return ok_empty
    ok = wt.ok
    if isinstance(ok, PrimitiveType) and ok.name in _PRIM_KINDS:
        lo, hi, kind, pack_int = _int_slot(ok.name)

        def ok_int(ctx: GuestContext, store: Any, result: Any, results_ptr: Any) -> None:
            if type(result) is OkValue:
                value = result.value
                if type(value) is int and lo <= value <= hi:
                    # val_new moves its source into the box and zeroes it: the source must
                    # be a zero slot written after, never a kept one.
                    box = _val_new(_ZERO_REF)
                    _SLOT_AT(box).raw = pack_int(kind, value)
                    _SLOT_AT(results_ptr).raw = _RESULT_HEAD(19, True, box)
                    return
            generic(ctx, store, result, results_ptr)

        return ok_int
    return generic


class _Template:
    """A value lowered once by the codec and kept (freed with this object), to be cloned."""

    def __init__(self, codec: FuncCodec, value: Any) -> None:
        self.val = _VAL()
        codec.lower_result_into(None, value, self.val)
        self.address = ctypes.addressof(self.val)

    def __del__(self, delete: Any = _val_delete, ref: Any = _byref) -> None:
        # Bound at definition: at interpreter exit the module's globals may be gone first.
        delete(ref(self.val))


def _int_record_lowerer(codec: FuncCodec, wt: RecordType, generic: _Lower) -> _Lower:
    """A record whose fields are all integers (``wasi:clocks`` ``datetime``): one C call
    clones a template lowered once (its field names are C byte vectors wasmtime frees with
    the value, so each result needs its own), then each field's integer is written in place.
    A value that is not exactly a dict of in-range ints goes through the codec."""
    names = tuple(name for name, _ in wt.fields)
    template = _Template(codec, dict.fromkeys(names, 0))
    fields = []
    for i, (name, t) in enumerate(wt.fields):
        assert isinstance(t, PrimitiveType)
        lo, hi = _int_range(t.name)
        at = _INT_AT[t.name]
        fields.append((name, lo, hi, at, i * _ENTRY_SIZE + _ENTRY_VAL + _PAYLOAD))
    count = len(names)
    source = template.address
    if count == 2:
        # wasi:clocks' datetime: the same steps, unrolled (half the cost of the loop below).
        (name0, lo0, hi0, at0, off0), (name1, lo1, hi1, at1, off1) = fields

        def int_pair(ctx: GuestContext, store: Any, result: Any, results_ptr: Any) -> None:
            if type(result) is dict and len(result) == 2:
                v0 = result.get(name0)
                v1 = result.get(name1)
                if type(v0) is int and type(v1) is int and lo0 <= v0 <= hi0 and lo1 <= v1 <= hi1:
                    _val_clone(source, results_ptr)
                    entries = _PTR_AT(results_ptr + _RECORD_DATA).value or 0
                    at0(entries + off0).value = v0
                    at1(entries + off1).value = v1
                    return
            generic(ctx, store, result, results_ptr)

        int_pair.template = template  # type: ignore[attr-defined]  # kept as long as the lowerer
        return int_pair

    def int_record(ctx: GuestContext, store: Any, result: Any, results_ptr: Any) -> None:
        if type(result) is dict and len(result) == count:
            values = []
            for name, lo, hi, _, _ in fields:
                value = result.get(name)
                if type(value) is not int or not lo <= value <= hi:
                    break
                values.append(value)
            else:
                _val_clone(source, results_ptr)
                entries = _PTR_AT(results_ptr + _RECORD_DATA).value or 0
                for (_, _, _, at, offset), value in zip(fields, values, strict=True):
                    at(entries + offset).value = value
                return
        generic(ctx, store, result, results_ptr)

    int_record.template = template  # type: ignore[attr-defined]  # kept as long as the lowerer
    return int_record


# Element slots of a list<u8>: kind u8 (2) and padding, payload at 8, for up to _SMALL_LIST.
_U8_SLOTS = (bytes((2,)) + bytes(_VAL_SIZE - 1)) * _SMALL_LIST
_LIST_KIND = bytes((13,))


def _bytes_lowerer(generic: _Lower) -> _Lower:
    """A ``list<u8>`` result (``get-random-bytes``, a read) given as ``bytes`` of up to
    ``_SMALL_LIST``: the element slots built in one buffer, copied by one C call."""

    def bytes_list(ctx: GuestContext, store: Any, result: Any, results_ptr: Any) -> None:
        if type(result) is bytes:
            size = len(result)
            if size <= _SMALL_LIST:
                slots = bytearray(_U8_SLOTS[: size * _VAL_SIZE])
                slots[_PAYLOAD::_VAL_SIZE] = result
                _vallist_new(results_ptr + _PAYLOAD, size, bytes(slots))
                _BYTE_AT(results_ptr).raw = _LIST_KIND
                return
        generic(ctx, store, result, results_ptr)

    return bytes_list


# -- fused frames: the call no hook watches for the commonest shapes of WASI's small imports
#
# A clock's ``now`` (no arguments, an integer or a datetime record) and ``get-random-bytes``
# (an integer argument, a ``list<u8>``) are served each in one frame that reads the argument,
# calls the host function and writes the result, with no lowerer call in between; a value that
# is not exactly what the fast write takes goes to the import's lowerer (the codec's checks
# and errors). Memory is read and written through ``_MEMORY``, a view of the whole address
# space: ``struct.pack_into``/``unpack_from`` at an absolute address cost half of making a
# ctypes object at that address and setting its value (what ``from_address`` does, and no
# less safe: both reach any address they are given).
_MEMORY = memoryview((ctypes.c_char * (1 << 62)).from_address(0)).cast("B")
_ADDRESS_AT = struct.Struct("<Q").unpack_from
_READ_CODES = {**_PRIM_CODES, "bool": "?"}
# A list<u8> result of up to this many bytes is built in the instance's own slots buffer
# (``_CallStore.slots``, made at the first such result): its element slots are written once and
# only their payload bytes change, so a result is one extended-slice write and one C call.
_SLOTS_LIST = 256
_U8_LIST_SLOTS = _U8_SLOTS[: _SLOTS_LIST * _VAL_SIZE]
_vallist_new_at = _raw("wasmtime_component_vallist_new", None, _VP, ctypes.c_size_t, _VP, gil=True)


def _fused(
    fn: Callable[..., Any],
    lower: _Lower,
    param_types: Sequence[WitType],
    wt: WitType | None,
    direct: Direct | None = None,
) -> _Serve | None:
    """The one-frame serve of ``fn`` for an import of these types, or None (no fused shape).

    With ``direct`` the frame finds the provider's state itself and calls ``direct.call`` on
    it (no ``ctx.slot`` frame; a record as a tuple, no dict); a missing slot is the
    :class:`MissingSlot` that ``ctx.slot`` raises."""
    nparams = len(param_types)
    first = param_types[0] if param_types else None

    def arity(nargs: int) -> None:
        raise GuestViolation(f"expected {nparams} arguments, got {nargs}")

    if nparams == 0 and isinstance(wt, PrimitiveType) and wt.name in _PRIM_KINDS:
        return _fused_int(fn, lower, wt, arity, direct)
    if (
        nparams == 0
        and isinstance(wt, RecordType)
        and len(wt.fields) == 2
        and all(isinstance(t, PrimitiveType) and t.name in _PRIM_KINDS for _, t in wt.fields)
    ):
        return _fused_pair(fn, lower, wt, arity, direct)
    if (
        nparams == 1
        and isinstance(first, PrimitiveType)
        and first.name in _READ_CODES
        and isinstance(wt, ListType)
        and wt.element == PrimitiveType("u8")
    ):
        return _fused_bytes(fn, lower, first, arity, direct)
    return None


def _fused_int(
    fn: Callable[..., Any],
    lower: _Lower,
    wt: PrimitiveType,
    arity: Callable[[int], None],
    direct: Direct | None,
) -> _Serve:
    """An integer from no arguments (a clock's ``now``): its whole slot in one write."""
    slot = direct.slot if direct is not None else None
    call = direct.call if direct is not None else fn
    kind = _PRIM_KINDS[wt.name]
    code = _PRIM_CODES[wt.name]
    put = struct.Struct(f"<B7x{code}{_VAL_SIZE - 8 - struct.calcsize(code)}x").pack_into
    memory = _MEMORY
    struct_error = struct.error

    def serve_int(
        ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
    ) -> None:
        if nargs:
            arity(nargs)
        if slot is None:
            result = fn(ctx)
        else:
            try:
                state = ctx._slots[slot]
            except KeyError:
                state = ctx.slot(slot)
            result = call(state)
        if type(result) is int:
            try:
                # struct checks the range (``lo``..``hi`` exactly: the type's own code)
                put(memory, res, kind, result)
                return
            except struct_error:
                pass  # out of range: the codec refuses it, by name
        lower(ctx, store, result, res)

    return serve_int


def _fused_bytes(
    fn: Callable[..., Any],
    lower: _Lower,
    param: PrimitiveType,
    arity: Callable[[int], None],
    direct: Direct | None,
) -> _Serve:
    """A ``list<u8>`` from one integer (``get-random-bytes``): the argument read in place, the
    result's element slots written into the instance's slots buffer and copied by one C call."""
    slot = direct.slot if direct is not None else None
    call = direct.call if direct is not None else fn
    get = struct.Struct("<" + _READ_CODES[param.name]).unpack_from
    memory = _MEMORY
    at = _PAYLOAD
    size_of = _VAL_SIZE
    most = _SLOTS_LIST
    list_new = _vallist_new_at

    def serve_bytes(
        ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
    ) -> None:
        if nargs != 1:
            arity(nargs)
        if slot is None:
            result = fn(ctx, get(memory, args_ptr + at)[0])
        else:
            try:
                state = ctx._slots[slot]
            except KeyError:
                state = ctx.slot(slot)
            result = call(state, get(memory, args_ptr + at)[0])
        if type(result) is bytes:
            size = len(result)
            if size <= most:
                slots = store.slots
                if slots is None:
                    slots = store.slots = bytearray(_U8_LIST_SLOTS)
                    store.slots_at = ctypes.addressof(ctypes.c_char.from_buffer(slots))
                slots[at : size * size_of : size_of] = result
                list_new(res + at, size, store.slots_at)
                memory[res] = 13  # the list's kind, written after the list (as the codec)
                return
        lower(ctx, store, result, res)

    return serve_bytes


def _fused_pair(
    fn: Callable[..., Any],
    lower: _Lower,
    wt: RecordType,
    arity: Callable[[int], None],
    direct: Direct | None,
) -> _Serve:
    """A record of two integers (``wasi:clocks`` ``datetime``) from no arguments: the lowerer's
    template cloned and both integers written in place, in the serving frame."""
    template = _Template(FuncCodec(FuncSig((), wt)), {name: 0 for name, _ in wt.fields})
    source = template.address
    (name0, t0), (name1, t1) = wt.fields
    assert isinstance(t0, PrimitiveType)
    assert isinstance(t1, PrimitiveType)
    lo0, hi0 = _int_range(t0.name)
    lo1, hi1 = _int_range(t1.name)
    put0 = struct.Struct("<" + _PRIM_CODES[t0.name]).pack_into
    put1 = struct.Struct("<" + _PRIM_CODES[t1.name]).pack_into
    off0 = _ENTRY_VAL + _PAYLOAD
    off1 = _ENTRY_SIZE + _ENTRY_VAL + _PAYLOAD
    memory = _MEMORY
    data = _RECORD_DATA
    address_at = _ADDRESS_AT
    clone = _val_clone

    def serve_pair(
        ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
    ) -> None:
        if nargs:
            arity(nargs)
        result = fn(ctx)
        if type(result) is dict and len(result) == 2:
            v0 = result.get(name0)
            v1 = result.get(name1)
            if type(v0) is int and type(v1) is int and lo0 <= v0 <= hi0 and lo1 <= v1 <= hi1:
                clone(source, res)
                entries = address_at(memory, res + data)[0]
                put0(memory, entries + off0, v0)
                put1(memory, entries + off1, v1)
                return
        lower(ctx, store, result, res)

    if direct is not None:
        slot, call = direct.slot, direct.call

        def serve_pair_direct(
            ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
        ) -> None:
            if nargs:
                arity(nargs)
            try:
                state = ctx._slots[slot]
            except KeyError:
                state = ctx.slot(slot)
            result = call(state)
            if type(result) is tuple and len(result) == 2:
                v0, v1 = result
                if type(v0) is int and type(v1) is int and lo0 <= v0 <= hi0 and lo1 <= v1 <= hi1:
                    clone(source, res)
                    entries = address_at(memory, res + data)[0]
                    put0(memory, entries + off0, v0)
                    put1(memory, entries + off1, v1)
                    return
                # What fn would have answered, for the codec to check and refuse.
                result = {name0: v0, name1: v1}
            lower(ctx, store, result, res)

        serve_pair_direct.template = template  # type: ignore[attr-defined]  # as below
        return serve_pair_direct

    serve_pair.template = template  # type: ignore[attr-defined]  # kept as long as the frame
    return serve_pair


def _server(
    fn: Callable[..., Any],
    lift_objects: _Lift,
    lower: _Lower,
    param_types: Sequence[WitType],
    getters: Sequence[Callable[[int], Any]],
    resolvers: Sequence[_Conv | None],
    self_kind: ResourceKind | None,
) -> _Serve:
    """The unhooked call in one frame for the common shapes (no arguments; one or two plain
    ones; a method on a borrowed resource with up to one plain argument), each doing the same
    checks as ``lift_objects``; anything else calls ``lift_objects``."""
    nparams = len(getters)

    def arity(nargs: int) -> None:
        raise GuestViolation(f"expected {nparams} arguments, got {nargs}")

    plain = [
        not isinstance(t, OwnType | BorrowType) and conv is None
        for t, conv in zip(param_types, resolvers, strict=True)
    ]
    if nparams == 0:

        def serve_none(
            ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
        ) -> None:
            if nargs:
                arity(nargs)
            lower(ctx, store, fn(ctx), res)

        return serve_none
    first = param_types[0] if param_types else None
    if nparams == 1 and isinstance(first, PrimitiveType) and first.name in _INT_AT:
        # One integer (get-random-bytes' length): read in place, no getter frame.
        int_at = _INT_AT[first.name]

        def serve_int(
            ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
        ) -> None:
            if nargs != 1:
                arity(nargs)
            lower(ctx, store, fn(ctx, int_at(args_ptr + _PAYLOAD).value), res)

        return serve_int
    if nparams == 1 and plain[0]:
        get0 = getters[0]

        def serve_one(
            ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
        ) -> None:
            if nargs != 1:
                arity(nargs)
            lower(ctx, store, fn(ctx, get0(args_ptr)), res)

        return serve_one
    if nparams == 2 and all(plain):
        get0, get1 = getters

        def serve_two(
            ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
        ) -> None:
            if nargs != 2:
                arity(nargs)
            lower(ctx, store, fn(ctx, get0(args_ptr), get1(args_ptr + _VAL_SIZE)), res)

        return serve_two
    if (
        self_kind is not None
        and nparams <= 2
        and isinstance(param_types[0], BorrowType)
        and all(plain[1:])
    ):
        return _method_server(fn, lower, getters, self_kind, arity)

    def serve_any(
        ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
    ) -> None:
        lower(ctx, store, fn(ctx, *lift_objects(ctx, context_ptr, args_ptr, nargs)), res)

    return serve_any


def _method_server(
    fn: Callable[..., Any],
    lower: _Lower,
    getters: Sequence[Callable[[int], Any]],
    self_kind: ResourceKind,
    arity: Callable[[int], None],
) -> _Serve:
    """A method on a borrowed resource with at most one plain argument (every stream call):
    its rep read through the call's context, the object looked up in the instance's table of
    that kind, the same checks as ``lift_objects``."""
    type_id, kind_name = self_kind.type_id, self_kind.name
    nparams = len(getters)
    get_arg = getters[1] if nparams == 2 else None

    def serve_method(
        ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
    ) -> None:
        if nargs != nparams:
            arity(nargs)
        host = store.host
        error = _any_to_host(context_ptr, _PTR_AT(args_ptr + _PAYLOAD), store.host_ref)
        if error:
            err = ctypes.cast(error, _ERROR_PTR)
            raise StaleHandle(f"not a host resource: {error_from_ptr(err)}")
        try:
            rep = _host_rep(host)
        finally:
            _host_delete(host)
        try:
            obj = ctx._tables[type_id][rep]
        except KeyError:
            raise StaleHandle(f"no live {kind_name} with handle {rep}") from None
        if get_arg is None:
            lower(ctx, store, fn(ctx, obj), res)
        else:
            lower(ctx, store, fn(ctx, obj, get_arg(args_ptr + _VAL_SIZE)), res)

    return serve_method


def _direct_lifter(
    param_types: Sequence[WitType],
    getters: Sequence[Callable[[int], Any]],
    resolvers: Sequence[_Conv | None],
    self_kind: ResourceKind | None = None,
) -> _Lift:
    """What the implementation takes, in one pass: a top-level resource goes from its rep
    straight to the host object, with no Handle made in between."""
    nparams = len(getters)

    def arity(nargs: int) -> None:
        raise GuestViolation(f"expected {nparams} arguments, got {nargs}")

    direct: list[tuple[int, Any]] = []
    for t, get, conv in zip(param_types, getters, resolvers, strict=True):
        if isinstance(t, OwnType):
            direct.append((_OWN, None))
        elif isinstance(t, BorrowType):
            direct.append((_BORROW, None))
        elif conv is None:
            direct.append((_PLAIN, get))
        else:
            direct.append((_NESTED, (get, _handle_converter(t, _to_handle), conv)))

    if not direct:

        def lift_none(ctx: GuestContext, context_ptr: Any, args_ptr: Any, nargs: int) -> list[Any]:
            if nargs:
                arity(nargs)
            return _NO_ARGS

        return lift_none

    if all(kind == _PLAIN for kind, _ in direct):
        plain = [get for _, get in direct]

        def lift_plain(ctx: GuestContext, context_ptr: Any, args_ptr: Any, nargs: int) -> list[Any]:
            if nargs != nparams:
                arity(nargs)
            return [get(args_ptr + i * _VAL_SIZE) for i, get in enumerate(plain)]

        return lift_plain

    if (
        self_kind is not None
        and direct[0][0] == _BORROW
        and all(kind == _PLAIN for kind, _ in direct[1:])
    ):
        # A method on a borrowed resource with plain arguments (every stream call).
        rest = [(i * _VAL_SIZE, get) for i, (_, get) in enumerate(direct) if i]
        type_id, kind_name = self_kind.type_id, self_kind.name

        def lift_method(
            ctx: GuestContext, context_ptr: Any, args_ptr: Any, nargs: int
        ) -> list[Any]:
            if nargs != nparams:
                arity(nargs)
            rep = _rep_at(ctx.call_store, context_ptr, _PTR_AT(args_ptr + _PAYLOAD))
            table = ctx._tables.get(type_id)
            if table is None or rep not in table:
                raise StaleHandle(f"no live {kind_name} with handle {rep}")
            out = [table[rep]]
            for offset, get in rest:
                out.append(get(args_ptr + offset))
            return out

        return lift_method

    def lift_objects(ctx: GuestContext, context_ptr: Any, args_ptr: Any, nargs: int) -> list[Any]:
        if nargs != nparams:
            arity(nargs)
        out = []
        for i, (kind, how) in enumerate(direct):
            at = args_ptr + i * _VAL_SIZE
            if kind == _PLAIN:
                out.append(how(at))
            elif kind == _NESTED:
                get, to_handle, to_object = how
                out.append(to_object(ctx, to_handle(ctx, get(at))))
            else:
                out.append(_object_at(ctx, context_ptr, _PTR_AT(at + _PAYLOAD), kind))
        return out

    return lift_objects


_PLAIN, _NESTED, _OWN, _BORROW = range(4)
_NO_ARGS: list[Any] = []  # only ever unpacked into a call, never changed


_Conv = Callable[[GuestContext, Any], Any]


def _host_at(context_ptr: Any, resource: Any) -> tuple[int, int]:
    """(type id, rep) of the host resource ``resource`` points to (a ResourceAny box)."""
    host = _VP()
    error = _any_to_host(context_ptr, resource, _byref(host))
    if error:
        err = ctypes.cast(error, _ERROR_PTR)
        raise StaleHandle(f"not a host resource: {error_from_ptr(err)}")
    try:
        return _host_type(host), _host_rep(host)
    finally:
        _host_delete(host)


def _rep_at(store: _CallStore, context_ptr: Any, resource: Any) -> int:
    """The rep of the host resource ``resource`` points to, for a caller that knows its type."""
    host = store.host
    error = _any_to_host(context_ptr, resource, store.host_ref)
    if error:
        err = ctypes.cast(error, _ERROR_PTR)
        raise StaleHandle(f"not a host resource: {error_from_ptr(err)}")
    try:
        rep: int = _host_rep(host)
        return rep
    finally:
        _host_delete(host)


def _handle_at(context_ptr: Any, resource: Any) -> Handle:
    """The Handle of the host resource ``resource`` points to."""
    type_id, rep = _host_at(context_ptr, resource)
    kind = _KINDS.get(type_id)
    if kind is None:
        raise StaleHandle(f"a resource of unknown host type {type_id}")
    return Handle(kind, rep)


def _object_at(ctx: GuestContext, context_ptr: Any, resource: Any, kind: int) -> Any:
    """The host object behind the resource ``resource`` points to; an owned one leaves the
    instance's table (the guest gave its handle away). Same checks as Handle + ``ctx.get``."""
    type_id, rep = _host_at(context_ptr, resource)
    table = ctx._tables.get(type_id)
    if table is None or rep not in table:
        found = _KINDS.get(type_id)
        if found is None:
            raise StaleHandle(f"a resource of unknown host type {type_id}")
        raise StaleHandle(f"no live {found.name} with handle {rep}")
    return table.pop(rep) if kind == _OWN else table[rep]


def _to_handle(ctx: GuestContext, value: Any) -> Handle:
    # A ResourceAny the codec lifted (nested in a list, an option): its box, through the
    # call's context.
    return _handle_at(ctx.call_store.ptr, value.ptr())


def _to_object(ctx: GuestContext, handle: Handle) -> Any:
    return ctx.get(handle.kind, handle.rep)


def _to_object_owned(ctx: GuestContext, handle: Handle) -> Any:
    obj = ctx.get(handle.kind, handle.rep)
    # The guest gave its handle away: the host owns the object now.
    ctx._drop(handle.kind.type_id, handle.rep)
    return obj


def _handle_converter(wt: WitType, at_handle: _Conv) -> _Conv | None:
    """A function applying ``at_handle`` to every resource inside a value of type ``wt``."""
    if isinstance(wt, OwnType | BorrowType):
        return at_handle
    if isinstance(wt, ListType):
        element = _handle_converter(wt.element, at_handle)
        return None if element is None else _each(element)
    if isinstance(wt, OptionType):
        payload = _handle_converter(wt.payload, at_handle)
        return None if payload is None else _unless_none(payload)
    if isinstance(wt, TupleType):
        parts = [_handle_converter(t, at_handle) for t in wt.elements]
        if all(p is None for p in parts):
            return None
        return lambda ctx, v: tuple(
            p(ctx, x) if p is not None else x for p, x in zip(parts, v, strict=True)
        )
    if isinstance(wt, ResultType) and _mentions_resources(wt):
        # wasi:http's response-outparam.set takes result<own<outgoing-response>, error-code>.
        ok = _handle_converter(wt.ok, at_handle) if wt.ok is not None else None
        err = _handle_converter(wt.err, at_handle) if wt.err is not None else None
        return lambda ctx, v: (
            OkValue(ok(ctx, v.value))
            if ok is not None and isinstance(v, OkValue)
            else ErrValue(err(ctx, v.value))
            if err is not None and isinstance(v, ErrValue)
            else v
        )
    if isinstance(wt, RecordType | VariantType | ResultType | MapType):
        if _mentions_resources(wt):
            raise HostError(f"mighty's gate does not pass resources inside {wt} to the host yet")
        return None
    return None


def _each(inner: _Conv) -> _Conv:
    return lambda ctx, v: [inner(ctx, x) for x in v]


def _unless_none(inner: _Conv) -> _Conv:
    return lambda ctx, v: None if v is None else inner(ctx, v)


def _some(inner: _Conv) -> _Conv:
    return lambda ctx, v: v if v is None else SomeValue(inner(ctx, v.value))


def _mentions_resources(wt: WitType) -> bool:
    return "own<" in str(wt) or "borrow<" in str(wt)


def _guest_converter(wt: WitType) -> _Conv | None:
    """A function turning :class:`Handle` objects inside a result into guest-owned resources."""
    if isinstance(wt, OwnType | BorrowType):
        return lambda _ctx, h: wc.ResourceHost.own(h.rep, h.kind.type_id)
    if not _mentions_resources(wt):
        return None
    if isinstance(wt, ListType):
        element = _guest_converter(wt.element)
        return None if element is None else _each(element)
    if isinstance(wt, OptionType):
        payload = _guest_converter(wt.payload)
        if payload is None:
            return None
        if isinstance(wt.payload, OptionType):
            return _some(payload)
        return _unless_none(payload)
    if isinstance(wt, TupleType):
        parts = [_guest_converter(t) for t in wt.elements]
        return lambda ctx, v: tuple(
            p(ctx, x) if p is not None else x for p, x in zip(parts, v, strict=True)
        )
    if isinstance(wt, ResultType):
        ok = _guest_converter(wt.ok) if wt.ok is not None else None
        err = _guest_converter(wt.err) if wt.err is not None else None

        def result(ctx: GuestContext, v: Any) -> Any:
            if isinstance(v, OkValue):
                return OkValue(ok(ctx, v.value)) if ok is not None else v
            if isinstance(v, ErrValue):
                return ErrValue(err(ctx, v.value)) if err is not None else v
            return v

        return result
    if isinstance(wt, VariantType):
        cases = {name: _guest_converter(t) if t is not None else None for name, t in wt.cases}

        def variant(ctx: GuestContext, v: Any) -> Any:
            conv = cases.get(v.case) if isinstance(v, VariantValue) else None
            return VariantValue(v.case, conv(ctx, v.value)) if conv is not None else v

        return variant
    if isinstance(wt, RecordType):
        fields = {name: _guest_converter(t) for name, t in wt.fields}
        return lambda ctx, v: {
            k: (fields[k](ctx, x) if fields.get(k) is not None else x)  # type: ignore[misc]
            for k, x in v.items()
        }
    return None
