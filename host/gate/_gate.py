"""The gate: the one place where host functions are registered and every guest import is served.

Every import a guest makes (WASI and mighty's own interfaces alike) arrives here, in
:func:`_dispatch`, through one ctypes trampoline registered with
``wasmtime_component_linker_instance_add_func``. The gate

1. finds the instance's :class:`GuestContext` from the store,
2. lifts the arguments with the import's codec (compiled once per binding and linker),
3. turns resource handles into the host objects they stand for (and stale ones into an error),
4. runs the hooks (recording, replay, telemetry plug in here) around the implementation,
5. turns returned :class:`Handle` objects into resources the guest owns, and lowers the result.

An implementation refuses a call by returning the interface's own error value (``Err(...)``);
it never raises for something the guest did. An exception escaping an implementation is a host
bug: the guest traps, and the call raises :class:`HostFunctionFailed` carrying the exception.

Rejected: wasmtime-py's ``LinkerInstance.add_func``. It rebuilds the function type and its
converters on every call, guesses variant cases from Python types, and parks exceptions in a
module global shared by every thread.
"""

from __future__ import annotations

import ctypes
import itertools
import re
import struct
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import wasmtime
from wasmtime import component as wc

from mighty._errors import Closed, HostError, InvalidComponent, MissingImports
from mighty._wasmtime import component_linker as wc_linker
from mighty._wasmtime import error_from_ptr, ffi, func_type_from_ptr
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
from mighty.engine import immortal
from mighty.gate._scope import UNSCOPED, MissingSlot, Scope, Seed, Slot

__all__ = [
    "Binding",
    "CallHook",
    "Direct",
    "Gate",
    "GuestContext",
    "GuestExitRequest",
    "GuestViolation",
    "Handle",
    "HostFunctionFailed",
    "Provider",
    "ResourceKind",
    "StaleHandle",
    "request_exit",
    "resource_kind",
    "unversioned",
]

_VERSION = re.compile(r"@[0-9][^/#]*$")


def unversioned(name: str) -> str:
    """``wasi:io/streams@0.2.9`` -> ``wasi:io/streams``."""
    return _VERSION.sub("", name)


class HostFunctionFailed(HostError):
    """A host function raised instead of answering; the guest was stopped. ``__cause__`` is it."""

    kind = "host_error"


class GuestViolation(Exception):
    """Raise from a host function when the guest broke an interface's contract (the WIT says
    "traps", e.g. ``poll`` of an empty list): the guest traps and the call fails with
    ``GuestTrap(trap_code="contract_violation")`` carrying this message."""


class StaleHandle(HostError):
    """A guest handle named a host object that no longer exists (a host bookkeeping bug)."""


_NEXT_TYPE_ID = itertools.count(1)


@dataclass(frozen=True, eq=False)
class ResourceKind:
    """A host-defined resource type, e.g. ``wasi:io/streams`` ``output-stream``.

    ``on_drop(ctx, obj)`` runs when the guest drops its last handle; the gate has already removed
    the object from the instance's table.
    """

    interface: str
    name: str
    on_drop: Callable[[GuestContext, Any], None] | None = None
    type_id: int = field(default_factory=lambda: next(_NEXT_TYPE_ID))

    def __repr__(self) -> str:
        return f"ResourceKind({self.interface}/{self.name})"


@dataclass(frozen=True, slots=True)
class Handle:
    """A host object handed to the guest as an owned resource; ``GuestContext.new`` makes one."""

    kind: ResourceKind
    rep: int


@dataclass(frozen=True, slots=True)
class Direct:
    """A host function's state-taking form, for the calls no hook watches.

    ``call(state, *args)``, where ``state`` is what the instance holds in ``slot``, answers
    exactly what the binding's ``fn(ctx, *args)`` answers, except that a record comes back as
    the tuple of its fields' values in the WIT's order (no dict to build and read again). The
    gate uses it where it serves an import in one fused frame (a clock's ``now``,
    ``get-random-bytes``); hooks always see ``fn``. The simplest way to keep the two equal is
    to write ``fn`` as ``call(ctx.slot(slot), *args)``.
    """

    slot: Slot[Any]
    call: Callable[..., Any]


@dataclass(frozen=True, slots=True)
class Binding:
    """One host function: ``fn(ctx, *args)`` serving ``interface#name``.

    ``name`` follows the component model: ``get-stdout``, ``[method]output-stream.write``,
    ``[static]descriptor.x``, ``[constructor]x``. ``interface`` is unversioned; the gate binds it
    under whatever version a component imports. ``direct``: the same function taking its
    provider's state instead of the context (see :class:`Direct`), optional. ``hooked``
    False: no hook sees the calls of this binding (recorders, replayers, journals): they are
    served as if the instance had none, so they take no step of a trace and replay needs no
    record of them (``mighty:agent/debug``, the guest's source positions, is such a binding).
    """

    interface: str
    name: str
    fn: Callable[..., Any]
    direct: Direct | None = None
    hooked: bool = True


class Provider(Protocol):
    """A set of interfaces implemented on the host (WASI, mighty:agent, sandbox tools)."""

    def resources(self) -> Iterable[ResourceKind]: ...

    def bindings(self) -> Iterable[Binding]: ...

    def setup(self, ctx: GuestContext) -> None:
        """Fill this provider's slots of ``ctx`` (called once per instance)."""

    # A provider may also define ``teardown(ctx)``: called once when the instance closes, to
    # release what its state holds (file descriptors, sockets).


class CallHook(Protocol):
    """Wraps every import call: ``around(ctx, binding, args, call)`` returns the result.

    ``call()`` runs the implementation (or the next hook). A replayer returns recorded results
    without calling it; a recorder calls it and writes down what came back.

    A hook that only watches may also define ``watch_import(ctx, binding, args, value,
    failed)``: when it is the only hook, the gate runs the implementation itself and then calls
    that with the result (``failed`` False) or with the exception it raised (``failed`` True,
    raised again after). It must do what ``__call__`` would have done around ``call()``.

    Such a hook may also define ``tap_import(binding, nparams, self_kind)``, asked once per
    instance and import when the hook is the only one: it returns None, or a *tap* that the
    gate calls instead of ``watch_import`` after each call of that import that returned
    (a failed one still goes to ``watch_import``), as ``tap(context_ptr, result, *args)``:
    ``context_ptr`` is the raw store context of the call (an int), ``args`` the arguments as
    ``watch_import`` would see them, except that for a method on a borrowed resource of
    ``self_kind`` the first is its rep (an int) instead of a :class:`Handle`. The gate taps
    only imports of the common shapes (up to two plain arguments; a method with up to one), in
    one frame that lifts, calls, taps and lowers, with no list or Handle made per call; the
    other imports go to ``watch_import``.

    Two optional members serve ``mighty:agent/debug`` (``_source.py``): ``keeps_positions``
    (true on every hook: the guest is told to send its source positions) and
    ``take_position(file, line, function)`` (receives one, bounded, for the next import).
    """

    def __call__(
        self,
        ctx: GuestContext,
        binding: Binding,
        args: Sequence[Any],
        call: Callable[[], Any],
    ) -> Any: ...


_T = TypeVar("_T")


class GuestContext:
    """Per-instance host state: resource tables, provider slots, hooks, the call's scope."""

    def __init__(self, store: wasmtime.Store, hooks: Sequence[CallHook] = ()) -> None:
        self.store = store
        self.hooks = tuple(hooks)
        self.scope: Scope = UNSCOPED
        """The guest call being served (the budget layer's ``CallScope``); UNSCOPED between."""
        self._slots: dict[Slot[Any], Any] = {}
        self._store_key: int | None = None
        self._address = 0
        """The address of the store's context (what each import of this store comes with)."""
        self.failure: BaseException | None = None
        """An exception raised by a host function during the current call, if any."""
        self.exit_code: int | None = None
        """Set by ``wasi:cli/exit``: the guest asked to exit with this status."""
        self.calls = 0
        """How many imports this instance has made."""
        self.replaying = False
        """True while a replayer answers the imports: resources are stand-ins, not objects."""
        self.call_store: Any = store
        """The store context of the import being served (set by the gate for each call)."""
        self._tables: dict[int, dict[int, Any]] = {}
        self._known_kinds: dict[int, ResourceKind] = {}
        self.made = 0
        """How many resources the guest has been given so far (each one's rep is its number)."""
        # The hooked call of each import, made on its first call (None: the hook chain).
        self._frames: dict[_Registered, _Serve | None] = {}

    # -- slots: typed per-instance state of the providers -------------------------------------

    def slot(self, key: Slot[_T]) -> _T:
        """The value in slot ``key``; :class:`MissingSlot` if nothing was put there."""
        try:
            value: _T = self._slots[key]
        except KeyError:
            raise MissingSlot(f"this instance has nothing in {key!r}") from None
        return value

    def find(self, key: Slot[_T]) -> _T | None:
        """The value in slot ``key``, or None."""
        value: _T | None = self._slots.get(key)
        return value

    def put(self, key: Slot[_T], value: _T) -> None:
        """Fill slot ``key`` with ``value`` (replacing what was there)."""
        self._slots[key] = value

    def take(self, key: Slot[_T]) -> _T | None:
        """Empty slot ``key``; what it held, or None."""
        value: _T | None = self._slots.pop(key, None)
        return value

    # -- resources ---------------------------------------------------------------------------

    def new(self, kind: ResourceKind, obj: Any) -> Handle:
        """Store ``obj`` as a new resource of ``kind``; return it from a host function."""
        self._known_kinds[kind.type_id] = kind
        self.made += 1
        rep = self.made
        self._tables.setdefault(kind.type_id, {})[rep] = obj
        return Handle(kind, rep)

    def get(self, kind: ResourceKind, rep: int) -> Any:
        """The host object behind a handle; StaleHandle if it is gone."""
        try:
            return self._tables[kind.type_id][rep]
        except KeyError:
            raise StaleHandle(f"no live {kind.name} with handle {rep}") from None

    def live(self, kind: ResourceKind) -> int:
        """How many resources of ``kind`` the guest holds (for leak tests)."""
        return len(self._tables.get(kind.type_id, {}))

    def holdings(self) -> frozenset[tuple[str, int]]:
        """Every resource the guest holds, as ``(interface/name, rep)`` (reps count from 1 in
        the order resources were made, so two instances that made the same resources in the
        same order hold the same pairs)."""
        names = {key: f"{kind.interface}/{kind.name}" for key, kind in self._known_kinds.items()}
        return frozenset(
            (names.get(type_id, str(type_id)), rep)
            for type_id, table in self._tables.items()
            for rep in table
        )

    def _drop(self, type_id: int, rep: int) -> Any:
        return self._tables.get(type_id, {}).pop(rep, None)


# -- the trampoline -------------------------------------------------------------------------
#
# The cost of one import is mostly fixed Python and ctypes work, so the trampoline keeps it
# to the least (measured on the print path: 6.2 us per import before, see benchmarks/README):
# - wasmtime's pointers arrive as plain ints (our own callback prototype, all ``c_void_p``),
#   not as four ctypes pointer objects made per call; values are read at their addresses;
# - the few tiny C functions called per import run without releasing the GIL (``PyDLL``):
#   each is shorter than a GIL hand-over;
# - everything that depends only on the import's type (how each argument is read, how the
#   result is written, the common results' bytes) is decided once, in ``_compile``;
# - the instance is found by the address of its store's context, which every import of that
#   store arrives with (``_BY_ADDRESS``: one dict access, not a ``get_data`` C call);
# - a call no hook watches runs in one frame per import shape (``_server``: no arguments, one
#   integer, plain arguments, a method on a borrowed resource), lifting, calling and lowering;
#   a clock's ``now`` and ``get-random-bytes`` in a fused frame (``_fused``) that also writes
#   the result itself through ``_MEMORY`` and, given the binding's ``Direct`` form, reads the
#   provider's slot and takes a record as a tuple (no ``ctx.slot`` frame, no dict);
# - a record of integers (wasi:clocks' datetime) is one clone of a template lowered once, its
#   integers then written in place: its field names are C byte vectors that wasmtime frees with
#   the value, so every result needs its own, and one clone makes them in one C call; a
#   ``list<u8>`` result is its element slots built in one buffer and copied in one C call.
# The floor under all this (benchmarks/bench_wasi.py): a bare ctypes callback that only writes a
# prepared result costs 0.3-0.4 us per import, 0.6 us for a datetime and 1.1 us for 16 random
# bytes (wasmtime converts a list element by element); the gate adds 0.2-0.7 us to those, and
# mighty's WASI functions with it 0.3 (monotonic now), 0.75 (wall now), 0.8 us (16 random bytes).
# Rejected: caching the (type, rep) of a resource by the address of its handle box. wasmtime
# allocates a fresh box per call and reuses freed addresses, so a cache would hand one call's
# resource to another. Rejected: a value slot kept ready to box an ``Ok`` payload:
# ``wasmtime_component_val_new`` moves its source into the box and zeroes the source.


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

# Weak: an instance dropped without close() must not keep its store (and memory) alive here.
# A plain dict of weak references (not a WeakValueDictionary) so that the lookup on every
# import is one dict access and one call, with no Python-level __getitem__.
_CONTEXTS: dict[int, weakref.ref[GuestContext]] = {}
# The same references by the address of their store's context, which is the pointer every
# import of that store arrives with (wasmtime's store context lives as long as its store, and
# the context of a host call is the store's own): one dict access instead of a C call
# (``wasmtime_context_get_data``, ~0.1 us) per import. An entry is made when a context is
# attached, so a new store at a freed store's address replaces the old entry before its first
# import; it goes when its context is released or collected (if it is still that context's:
# the address may be another's by then). An address not found here is looked up by the key in
# the store's data, as before. The one case this cannot tell apart: a store that never had a
# context made for it (not how mighty uses a gate's linker: an Instance makes one before it
# instantiates) at the address of a closed store whose context is not yet released would be
# served as that context; an Instance releases its context right after closing its store.
_BY_ADDRESS: dict[int, weakref.ref[GuestContext]] = {}
_NEXT_STORE_KEY = itertools.count(1)
_contexts_lock = threading.Lock()


def _attach(ctx: GuestContext) -> int:
    key = next(_NEXT_STORE_KEY)
    context = ctx.store._context()
    address = ctypes.cast(context, _VP).value or 0

    def forget(ref: weakref.ref[GuestContext], key: int = key, address: int = address) -> None:
        _CONTEXTS.pop(key, None)
        if _BY_ADDRESS.get(address) is ref:
            _BY_ADDRESS.pop(address, None)

    ref = weakref.ref(ctx, forget)
    ctx._address = address
    with _contexts_lock:
        _CONTEXTS[key] = ref
        _BY_ADDRESS[address] = ref
    ffi.wasmtime_context_set_data(context, key)
    return key


def _detach(key: int, address: int) -> None:
    with _contexts_lock:
        ref = _CONTEXTS.pop(key, None)
        if ref is not None and _BY_ADDRESS.get(address) is ref:
            del _BY_ADDRESS[address]


def _context_of(context_ptr: Any) -> GuestContext:
    ctx = _CONTEXTS[_get_data(context_ptr) or 0]()
    if ctx is None:
        raise KeyError("the instance is gone")
    return ctx


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


_REGISTERED: dict[int, _Registered] = {}
_NEXT_BINDING_KEY = itertools.count(1)


def _error_ptr(message: str) -> int:
    ptr = ffi.wasmtime_error_new(message.encode())
    return int(ctypes.cast(ptr, ctypes.c_void_p).value or 0)


def _dispatch(
    key: int | None,
    context_ptr: int | None,
    type_ptr: int | None,
    args_ptr: int | None,
    nargs: int,
    results_ptr: int | None,
    _nresults: int,
) -> int:
    try:
        reg = _REGISTERED[key or 0]
        # _context_of, inline (one frame fewer on every import), by the context's address.
        ref = _BY_ADDRESS.get(context_ptr)  # type: ignore[arg-type]  # an int, not None
        if ref is None:
            ref = _CONTEXTS[_get_data(context_ptr) or 0]
        found = ref()
        if found is None:
            raise KeyError("the instance is gone")
        ctx = found
    except KeyError:
        return _error_ptr("mighty: host function called outside a mighty instance")
    store = ctx.call_store
    try:
        serve = reg.serve
        if serve is None:
            serve = _compile(reg, type_ptr)
        # Resource handles must be resolved through the context of this very call: wasmtime
        # tracks the guest's borrows per call, not per store.
        if type(store) is not _CallStore:
            store = ctx.call_store = _CallStore()
        store.ptr = context_ptr
        ctx.calls += 1
        if not ctx.hooks:
            serve(ctx, store, context_ptr, args_ptr, nargs, results_ptr)
        else:
            frame = ctx._frames.get(reg, _UNMADE)
            if frame is _UNMADE:
                frame = _hooked_frame(reg, ctx)
            if frame is not None:
                frame(ctx, store, context_ptr, args_ptr, nargs, results_ptr)
            else:
                assert reg.lower is not None
                result = _run_hooked(reg, ctx, ctx.hooks, context_ptr, args_ptr, nargs)
                reg.lower(ctx, store, result, results_ptr)
        store.ptr = None
        return 0
    except GuestExitRequest as exit_request:
        _end_call(store)
        ctx.exit_code = exit_request.code
        return _exit_error(exit_request.code)
    except BaseException as exc:  # noqa: BLE001 - nothing may unwind into wasmtime
        _end_call(store)
        if ctx.failure is None:
            ctx.failure = exc
        return _error_ptr(f"mighty: host function {reg.binding.name} failed: {exc!r}")


def _end_call(store: Any) -> None:
    if type(store) is _CallStore:
        store.ptr = None


def _run_hooked(
    reg: _Registered,
    ctx: GuestContext,
    hooks: tuple[CallHook, ...],
    context_ptr: Any,
    args_ptr: Any,
    nargs: int,
) -> Any:
    # Hooks see resources as Handles (what a trace can record); the implementation gets the
    # host objects behind them.
    assert reg.lift is not None
    args = reg.lift(ctx, context_ptr, args_ptr, nargs)
    fn = reg.binding.fn
    resolve = reg.resolve
    if len(hooks) == 1:
        watch = getattr(hooks[0], "watch_import", None)
        if watch is not None:
            # A hook that only watches (the recorder): no closure, no frame around the call.
            try:
                result = fn(ctx, *(args if resolve is None else resolve(ctx, args)))
            except BaseException as exc:
                watch(ctx, reg.binding, args, exc, True)
                raise
            watch(ctx, reg.binding, args, result, False)
            return result

    def call() -> Any:
        return fn(ctx, *(args if resolve is None else resolve(ctx, args)))

    if len(hooks) == 1:  # a recorder or a replayer: no chain to build
        return hooks[0](ctx, reg.binding, args, call)
    run = call
    for hook in reversed(hooks):
        run = _wrap(hook, ctx, reg.binding, args, run)
    return run()


def _wrap(
    hook: CallHook,
    ctx: GuestContext,
    binding: Binding,
    args: Sequence[Any],
    inner: Callable[[], Any],
) -> Callable[[], Any]:
    return lambda: hook(ctx, binding, args, inner)


_UNMADE: Any = object()


def _hooked_frame(reg: _Registered, ctx: GuestContext) -> _Serve | None:
    """The hooked call of ``reg`` for ``ctx`` (made on its first call, kept in the context):
    a tapped frame where the only hook taps this import (see ``CallHook``), else None (the
    hook chain, ``_run_hooked``)."""
    if not reg.binding.hooked:
        ctx._frames[reg] = reg.serve  # served as if the instance had no hook
        return reg.serve
    frame = None
    hooks = ctx.hooks
    if len(hooks) == 1:
        tap_import = getattr(hooks[0], "tap_import", None)
        watch = getattr(hooks[0], "watch_import", None)
        if tap_import is not None and watch is not None:
            frame = _tapped_frame(reg, tap_import, watch)
    ctx._frames[reg] = frame
    return frame


def _tapped_frame(
    reg: _Registered, tap_import: Callable[..., Any], watch: Callable[..., None]
) -> _Serve | None:
    """The call of an import that one hook taps, in one frame for the shapes ``_server``
    serves in one (no arguments; one or two plain ones; a method on a borrowed resource with
    up to one plain argument): the same checks, the implementation, the tap, the lowering. A
    call that raises goes to ``watch`` with the arguments as Handles, as ``_run_hooked`` does.
    None for any other shape (and when the hook does not tap this import)."""
    binding, fn, lower, getters = reg.binding, reg.binding.fn, reg.lower, reg.getters
    nparams = len(getters)
    plain = [
        not isinstance(t, OwnType | BorrowType) and not _mentions_resources(t) for t in reg.params
    ]
    self_kind = reg.self_kind
    method = (
        self_kind is not None
        and 1 <= nparams <= 2
        and isinstance(reg.params[0], BorrowType)
        and all(plain[1:])
    )
    if not method and (nparams > 2 or not all(plain)):
        return None
    tap = tap_import(binding, nparams, self_kind if method else None)
    if tap is None:
        return None
    assert lower is not None

    def arity(nargs: int) -> None:
        raise GuestViolation(f"expected {nparams} arguments, got {nargs}")

    if method:
        assert self_kind is not None
        return _tapped_method(binding, fn, lower, getters, self_kind, tap, watch, arity)
    return _tapped_plain(binding, fn, lower, reg.params, getters, tap, watch, arity)


def _tapped_plain(  # noqa: PLR0915 - one frame per import shape, as _server
    binding: Binding,
    fn: Callable[..., Any],
    lower: _Lower,
    params: Sequence[WitType],
    getters: Sequence[Callable[[int], Any]],
    tap: Callable[..., None],
    watch: Callable[..., None],
    arity: Callable[[int], None],
) -> _Serve:
    """A tapped import of up to two plain arguments (``_tapped_frame``)."""
    nparams = len(getters)
    if nparams == 0:

        def tapped_none(
            ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
        ) -> None:
            if nargs:
                arity(nargs)
            try:
                result = fn(ctx)
            except BaseException as exc:
                watch(ctx, binding, [], exc, True)
                raise
            tap(context_ptr, result)
            lower(ctx, store, result, res)

        return tapped_none
    if nparams == 1:
        first = params[0]
        get0 = getters[0]
        if isinstance(first, PrimitiveType) and first.name in _INT_AT:
            # One integer (get-random-bytes' length): read in place, as serve_int does.
            int_at = _INT_AT[first.name]

            def tapped_int(
                ctx: GuestContext,
                store: Any,
                context_ptr: Any,
                args_ptr: Any,
                nargs: int,
                res: Any,
            ) -> None:
                if nargs != 1:
                    arity(nargs)
                a0 = int_at(args_ptr + _PAYLOAD).value
                try:
                    result = fn(ctx, a0)
                except BaseException as exc:
                    watch(ctx, binding, [a0], exc, True)
                    raise
                tap(context_ptr, result, a0)
                lower(ctx, store, result, res)

            return tapped_int

        def tapped_one(
            ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
        ) -> None:
            if nargs != 1:
                arity(nargs)
            a0 = get0(args_ptr)
            try:
                result = fn(ctx, a0)
            except BaseException as exc:
                watch(ctx, binding, [a0], exc, True)
                raise
            tap(context_ptr, result, a0)
            lower(ctx, store, result, res)

        return tapped_one
    get_0, get_1 = getters

    def tapped_two(
        ctx: GuestContext, store: Any, context_ptr: Any, args_ptr: Any, nargs: int, res: Any
    ) -> None:
        if nargs != 2:
            arity(nargs)
        a0 = get_0(args_ptr)
        a1 = get_1(args_ptr + _VAL_SIZE)
        try:
            result = fn(ctx, a0, a1)
        except BaseException as exc:
            watch(ctx, binding, [a0, a1], exc, True)
            raise
        tap(context_ptr, result, a0, a1)
        lower(ctx, store, result, res)

    return tapped_two


def _tapped_method(
    binding: Binding,
    fn: Callable[..., Any],
    lower: _Lower,
    getters: Sequence[Callable[[int], Any]],
    self_kind: ResourceKind,
    tap: Callable[..., None],
    watch: Callable[..., None],
    arity: Callable[[int], None],
) -> _Serve:
    """A tapped method on a borrowed resource with at most one plain argument: the rep and
    the object found as ``_method_server`` finds them; the tap gets the rep."""
    type_id, kind_name = self_kind.type_id, self_kind.name
    nparams = len(getters)
    get_arg = getters[1] if nparams == 2 else None

    def tapped_method(
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
        if get_arg is None:
            try:
                obj = ctx._tables[type_id][rep]
            except KeyError:
                raise StaleHandle(f"no live {kind_name} with handle {rep}") from None
            try:
                result = fn(ctx, obj)
            except BaseException as exc:
                watch(ctx, binding, [Handle(self_kind, rep)], exc, True)
                raise
            tap(context_ptr, result, rep)
        else:
            a1 = get_arg(args_ptr + _VAL_SIZE)
            try:
                obj = ctx._tables[type_id][rep]
            except KeyError:
                raise StaleHandle(f"no live {kind_name} with handle {rep}") from None
            try:
                result = fn(ctx, obj, a1)
            except BaseException as exc:
                watch(ctx, binding, [Handle(self_kind, rep), a1], exc, True)
                raise
            tap(context_ptr, result, rep, a1)
        lower(ctx, store, result, res)

    return tapped_method


class GuestExitRequest(Exception):
    """Raised by :func:`request_exit`; hooks see it pass (a recorder writes it down)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def request_exit(code: int) -> None:
    """Stop the guest as ``wasi:cli/exit`` does: call from a host function."""
    raise GuestExitRequest(code)


def _exit_error(code: int) -> int:
    # wasmtime recognises its own I32Exit error as an exit status; a plain error message with a
    # known marker is what the Meter looks for instead (the C API cannot build an I32Exit).
    return _error_ptr(f"mighty: guest exit {code}")


# wasmtime-py's own prototype of this callback takes four pointers as ctypes pointer objects
# (made anew on every call); ours takes them as ints.
_CALLBACK = ctypes.CFUNCTYPE(
    ffi.wasmtime_component_func_callback_t._restype_,
    _VP,
    _VP,
    _VP,
    _VP,
    ctypes.c_size_t,
    _VP,
    ctypes.c_size_t,
)
_C_DISPATCH = immortal(_CALLBACK(_dispatch))


def _finalize(key: int | None) -> None:
    # wasmtime drops a registration with its linker.
    _REGISTERED.pop(key or 0, None)


_C_FINALIZE = immortal(ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_finalize))
# add_resource registers wasmtime-py's own destructor trampolines; they must outlive stores too.
immortal(wc_linker.resource_dtor_impl)
immortal(wc_linker.resource_dtor_finalize)


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


def _resource_drop(type_id: int) -> Callable[[wasmtime.StoreContext, int], None]:
    def drop(store: wasmtime.StoreContext, rep: int) -> None:
        ctx = _context_of(store._context())
        obj = ctx._drop(type_id, rep)
        kind = _KINDS.get(type_id)
        if ctx.replaying:
            return  # the objects are stand-ins; the real ones were released when recorded
        if obj is not None and kind is not None and kind.on_drop is not None:
            kind.on_drop(ctx, obj)

    return drop


_KINDS: dict[int, ResourceKind] = {}


def resource_kind(interface: str, name: str) -> ResourceKind | None:
    """The resource kind ``interface``/``name`` that a gate of this process defines, or None
    (a replayer makes stand-ins of the kinds a trace names)."""
    for kind in list(_KINDS.values()):
        if kind.interface == interface and kind.name == name:
            return kind
    return None


# -- the gate -------------------------------------------------------------------------------


class Gate:
    """The host functions one component instance may call, and the linker serving them.

    A Gate is built from providers. :meth:`linker_for` builds (once per component) a wasmtime
    linker holding exactly the interfaces the component imports, each under the version it
    imports; anything it imports that no provider offers is a :class:`MissingImports` naming
    every such import.
    """

    def __init__(self, providers: Sequence[Provider]) -> None:
        self.providers = tuple(providers)
        self._lock = threading.Lock()
        self._linkers: dict[tuple[tuple[str, ...], tuple[str, ...]], wc.Linker] = {}
        self._bindings: dict[str, dict[str, Binding]] = {}
        self._resources: dict[str, dict[str, ResourceKind]] = {}
        self._type_only: set[str] = set()
        for provider in self.providers:
            # Interfaces that only define types (WIT records, variants) still get imported.
            self._type_only.update(getattr(provider, "type_interfaces", ()))
            for kind in provider.resources():
                self._resources.setdefault(kind.interface, {})[kind.name] = kind
                _KINDS[kind.type_id] = kind
            for binding in provider.bindings():
                self._bindings.setdefault(binding.interface, {})[binding.name] = binding
        # Every gate serves ``mighty:agent/debug`` (the guest's source positions, for the
        # debugger) unless a provider does: an agent built with the SDK imports it wherever
        # it runs, and it answers from the context's hooks alone (``_source.py``).
        from mighty.gate._source import INTERFACE, SourceProvider

        if INTERFACE not in self._bindings:
            source = SourceProvider()
            self.providers = (*self.providers, source)
            for binding in source.bindings():
                self._bindings.setdefault(binding.interface, {})[binding.name] = binding

    def interfaces(self) -> frozenset[str]:
        """Every interface some provider implements (unversioned)."""
        return frozenset(self._bindings) | frozenset(self._resources) | frozenset(self._type_only)

    def missing(self, imports: Iterable[str]) -> list[str]:
        """The imports of a component that no provider implements."""
        known = self.interfaces()
        return [name for name in imports if unversioned(name) not in known]

    def linker_for(
        self,
        engine: wasmtime.Engine,
        imports: Sequence[str],
        origin: str,
        modules: Sequence[tuple[str, wasmtime.Module]] = (),
    ) -> wc.Linker:
        """A linker defining every import in ``imports`` (full names with versions), and the
        core ``modules`` a component imports by name (``Component.modules``).

        Linkers are cached per import list and module names (a shared module's name is its
        hash): they hold no per-instance state, and building one registers every host function.
        """
        key = (tuple(imports), tuple(name for name, _ in modules))
        with self._lock:
            cached = self._linkers.get(key)
            if cached is not None:
                return cached
            linker = self._build_linker(engine, imports, origin, modules)
            self._linkers[key] = linker
            return linker

    def _build_linker(
        self,
        engine: wasmtime.Engine,
        imports: Sequence[str],
        origin: str,
        modules: Sequence[tuple[str, wasmtime.Module]],
    ) -> wc.Linker:
        missing = self.missing(imports)
        if missing:
            raise MissingImports(
                f"{origin} imports what nothing provides: {', '.join(missing)}", missing=missing
            )
        linker = wc.Linker(engine)
        try:
            with linker.root() as root:
                for name in imports:
                    interface = unversioned(name)
                    with root.add_instance(name) as instance:
                        for kind in self._resources.get(interface, {}).values():
                            instance.add_resource(
                                kind.name,
                                wc.ResourceType.host(kind.type_id),
                                _resource_drop(kind.type_id),
                            )
                        for binding in self._bindings.get(interface, {}).values():
                            _add_func(instance, binding, self._resources.get(interface, {}))
                for name, module in modules:
                    root.add_module(name, module)
        except wasmtime.WasmtimeError as exc:
            # What wasmtime refuses here is the import list (a name given twice): said as
            # ours, with wasmtime's words and error kept.
            raise InvalidComponent(f"{origin}: its imports cannot be linked: {exc}") from exc
        return linker

    def context(
        self,
        store: wasmtime.Store,
        hooks: Sequence[CallHook] = (),
        seed: Iterable[Seed] = (),
    ) -> GuestContext:
        """A new per-instance context attached to ``store``, with every provider set up.

        ``seed`` fills slots before the providers' ``setup`` reads them (for example
        ``[WASI_POLICY.of(policy)]``).
        """
        ctx = GuestContext(store, hooks)
        for filled in seed:
            ctx._slots[filled.slot] = filled.value
        ctx._store_key = _attach(ctx)
        for provider in self.providers:
            provider.setup(ctx)
        return ctx

    def release(self, ctx: GuestContext) -> None:
        """Tear down every provider's state and forget ``ctx`` (after its store is closed)."""
        for provider in self.providers:
            teardown = getattr(provider, "teardown", None)
            if callable(teardown):
                teardown(ctx)
        key, ctx._store_key = ctx._store_key, None
        if key is not None:
            _detach(key, ctx._address)


def _add_func(
    instance: wc.LinkerInstance, binding: Binding, kinds: Mapping[str, ResourceKind]
) -> None:
    key = next(_NEXT_BINDING_KEY)
    self_kind = None
    if binding.name.startswith("[method]"):
        self_kind = kinds.get(binding.name[len("[method]") :].partition(".")[0])
    _REGISTERED[key] = _Registered(binding, self_kind=self_kind)
    name = binding.name.encode()
    error = _add_func_raw(
        instance.ptr(), ctypes.create_string_buffer(name), len(name), _C_DISPATCH, key, _C_FINALIZE
    )
    if error:
        raise error_from_ptr(ctypes.cast(error, _ERROR_PTR))
