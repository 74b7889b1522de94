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

The gate's vocabulary (``GuestContext``, ``Binding``, resource kinds and handles, its errors)
is in ``_context.py``; the frames compiled once per import (how each argument is read, how the
result is written, which frame serves a call) in ``_frames.py``; the C-level values both read
in ``_native.py``. This module is the trampoline, the hooks' frames and the :class:`Gate`.

Rejected: wasmtime-py's ``LinkerInstance.add_func``. It rebuilds the function type and its
converters on every call, guesses variant cases from Python types, and parks exceptions in a
module global shared by every thread.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import wasmtime
from wasmtime import component as wc

from mighty._errors import InvalidComponent, MissingImports
from mighty._wasmtime import component_linker as wc_linker
from mighty._wasmtime import error_from_ptr, ffi
from mighty.abi import BorrowType, OwnType, PrimitiveType, WitType
from mighty.engine import immortal
from mighty.gate._context import (
    Binding,
    CallHook,
    GuestContext,
    GuestViolation,
    Handle,
    Provider,
    ResourceKind,
    StaleHandle,
    unversioned,
)
from mighty.gate._frames import _compile, _mentions_resources
from mighty.gate._native import (
    _ERROR_PTR,
    _INT_AT,
    _KINDS,
    _PAYLOAD,
    _PTR_AT,
    _VAL_SIZE,
    _VP,
    _add_func_raw,
    _any_to_host,
    _CallStore,
    _error_ptr,
    _get_data,
    _host_delete,
    _host_rep,
    _Lower,
    _Registered,
    _Serve,
)
from mighty.gate._scope import Seed

__all__ = [
    "Gate",
    "GuestExitRequest",
    "request_exit",
    "resource_kind",
]

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


_REGISTERED: dict[int, _Registered] = {}
_NEXT_BINDING_KEY = itertools.count(1)


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
        ctx.scope.guest_exited(exit_request.code)
        return _exit_error(exit_request.code)
    except BaseException as exc:  # noqa: BLE001 - nothing may unwind into wasmtime
        _end_call(store)
        ctx.scope.host_failed(exc)
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
