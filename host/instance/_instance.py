"""Instances: a component instantiated in its own store, called under budgets.

The call path is written against wasmtime's C API directly (through wasmtime-py's ctypes
bindings), not ``wasmtime.component.Func.__call__``: that one re-reads the function type and
rebuilds converters on every call and converts ``list<u8>`` one element at a time. Here the
export is resolved and its codec compiled once, on first use.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from wasmtime import component as wc

from mighty._errors import Closed, ExportNotFound, GuestTrap
from mighty._wasmtime import error_from_ptr, ffi, maybe_raise_last_exn
from mighty.abi import FuncCodec, FuncSig
from mighty.budget import Budget, CancelScope, Meter, Usage
from mighty.engine import (
    MAX_GAP,
    Component,
    MemoryState,
    SignalShield,
    capture_memory,
    get_engine,
    learn_hot_pages,
    populate_memory,
    restore_memory,
    rewind_memory,
    shielded,
)
from mighty.gate import CallHook, Gate, GuestContext, Handle, Seed
from mighty.instance._recording import Recording, RecordSink
from mighty.wasi import WASI_POLICY, CaptureOutput, Policy, WasiProvider, outputs

__all__ = ["Instance", "call_once", "default_gate"]

_default_gate: Gate | None = None
_default_gate_lock = threading.Lock()


def default_gate() -> Gate:
    """The gate every instance uses unless given another: mighty's Python WASI 0.2."""
    global _default_gate  # noqa: PLW0603 - one shared gate caches one linker per component
    with _default_gate_lock:
        if _default_gate is None:
            _default_gate = Gate([WasiProvider()])
        return _default_gate


_ERROR_PTR = ctypes.POINTER(ffi.wasmtime_error_t)


def _raise_call_error(error: Any) -> NoReturn:
    """Raise what a failed ``wasmtime_component_func_call`` returned (``error``, a pointer to
    its ``wasmtime_error_t``): a Python exception a host function parked first, else the
    error itself."""
    err = error_from_ptr(error)
    maybe_raise_last_exn()
    raise err


@dataclass(eq=False, slots=True)
class _Export:
    func: wc.Func
    codec: FuncCodec


class Instance:
    """One live instance of a component, with its own store, memory account and budget.

    Not thread-safe: use it from one thread at a time. ``close()`` frees the store; use it as a
    context manager.
    """

    # Shielded: making an instance drops wasmtime objects whose finalizers would swallow a
    # Ctrl-C that lands in them; the whole construction defers it instead.
    @shielded
    def __init__(
        self,
        component: Component,
        *,
        budget: Budget | None = None,
        cancel: CancelScope | None = None,
        policy: Policy | None = None,
        gate: Gate | None = None,
        hooks: Sequence[CallHook] = (),
        record: RecordSink | None = None,
        slots: Iterable[Seed] = (),
        agent: str | None = None,
        agent_name: str | None = None,
        prefault: bool = False,
        memory: MemoryState | None = None,
    ) -> None:
        """Instantiate ``component`` under ``budget`` (instantiation runs guest code too).

        Every import is served by ``gate`` (default: mighty's Python WASI) under ``policy``
        (default: nothing granted). ``hooks`` wrap every import call (telemetry, replay).
        With ``record``, every import and export call of this instance goes into that trace.
        ``slots`` fill the gate context's typed slots before the providers set up (for example
        ``[LOG_SINK.of(sink)]``). ``agent`` and ``agent_name`` say which agent the instance is,
        for its trace records.
        With ``prefault``, the pages earlier instances were seen to write
        (:meth:`learn_hot_pages`) are copied from the memory image at once, so the first call
        does not take a copy-on-write fault for each: for instances that are about to work
        (a code-mode run), not for ones that will sit idle (they would hold those copies).
        ``memory`` (from :meth:`capture_memory` of an instance of the same component) makes the
        linear memory start as that one was, copy-on-write; everything else starts fresh.
        """
        self.component = component
        self.budget = budget or Budget()
        self.policy = policy or Policy()
        self.last_usage: Usage | None = None
        self._exports: dict[str, _Export] = {}
        self._poisoned: str | None = None
        self._closed = True
        self._gate = gate or default_gate()
        linker = self._gate.linker_for(
            get_engine(), component.imports, component.origin, component.modules
        )
        self._recording: Recording | None = None
        if record is not None:
            self._recording = record.attach(
                component, asdict(self.budget), self.policy, agent=agent, name=agent_name
            )
            self._recording.fuel_limit = self.budget.fuel
            hooks = (self._recording, *hooks)
        self._meter = Meter(self.budget)
        self._ctx = self._gate.context(
            self._meter.store, hooks, seed=(*slots, WASI_POLICY.of(self.policy))
        )
        self._closed = False

        def instantiate() -> wc.Instance:
            states = () if memory is None else (memory,)
            with component.instantiating(self._meter.account, prefault=prefault, states=states):
                return linker.instantiate(self._meter.store, component.wasm)

        try:
            self._instance, self.instantiate_usage = self._meter.run(
                instantiate, self.budget, cancel, self._stderr_note, self._ctx
            )
        except BaseException:
            self.close()
            raise

    @property
    def stdout(self) -> CaptureOutput:
        """What the guest wrote to stdout (kept up to the policy's cap)."""
        return self._outputs()[0]

    @property
    def stderr(self) -> CaptureOutput:
        """What the guest wrote to stderr (kept up to the policy's cap)."""
        return self._outputs()[1]

    def _outputs(self) -> tuple[CaptureOutput, CaptureOutput]:
        # A gate without WASI: two empty captures (the guest has no stdout or stderr at all).
        return outputs(self._ctx)

    @property
    def memory(self) -> tuple[int, int]:
        """(bytes of linear memory the instance holds now, its ceiling); safe from any thread
        (introspection reads it while a worker runs the guest)."""
        account = self._meter.account
        return account.current, account.limit

    @property
    def poisoned(self) -> str | None:
        """Why the instance refuses further calls (the first failure inside a call), or None
        while it is usable."""
        return self._poisoned

    @property
    def context(self) -> GuestContext:
        """The gate's per-instance context (resource tables, provider slots, counters)."""
        return self._ctx

    # -- calling -----------------------------------------------------------------------------

    # Shielded as a whole, not only while the guest runs: the Python around the guest call
    # (codecs, export lookup) drops wasmtime objects whose finalizers would swallow a Ctrl-C.
    @shielded
    def call(
        self,
        name: str,
        *args: Any,
        budget: Budget | None = None,
        cancel: CancelScope | None = None,
    ) -> Any:
        """Call export ``name`` with ``args`` under ``budget`` (default: the instance's budget).

        Returns the export's result as a Python value (see :mod:`mighty.abi`). Guest failures
        raise a :class:`~mighty.GuestError` subclass; afterwards the instance is unusable and
        every further call raises ``GuestTrap`` naming the first failure. ``last_usage`` holds
        the usage of the latest call, failed or not.
        """
        if self._closed:
            raise Closed("instance is closed")
        if self._poisoned is not None:
            raise GuestTrap(
                f"instance is unusable after an earlier failure ({self._poisoned}); "
                "create a new instance",
                trap_code="cannot_enter_instance",
                wasm_backtrace="",
            )
        export = self._export(name)
        budget = budget or self.budget
        codec = export.codec
        native = codec.native
        if native is not None:
            lowered = native.lower(args)
            if lowered is not None:
                return self._call_native(name, export, native, lowered, args, budget, cancel)
        # A Handle (from this instance's ``context.new``) goes to the guest as its own resource.
        lowered_args = [
            wc.ResourceHost.own(a.rep, a.kind.type_id) if type(a) is Handle else a for a in args
        ]
        params = codec.lower_params(self._meter.store, lowered_args)
        recording = self._recording
        if recording is not None:
            recording.begin_export(name, args, asdict(budget))
        func_ref = ctypes.byref(export.func._func)
        has_result = codec.has_result
        result = ffi.wasmtime_component_val_t()
        result_ref = ctypes.byref(result) if has_result else None

        def enter() -> None:
            context = self._meter.store._context()
            error = ffi.wasmtime_component_func_call(
                func_ref, context, params.array, params.size, result_ref, int(has_result)
            )
            if error:
                _raise_call_error(error)

        try:
            _, usage = self._meter.run(enter, budget, cancel, self._stderr_note, self._ctx)
        except BaseException as exc:
            self._failed(name, exc, recording)
            raise
        finally:
            codec.free_params(params.array, params.size)
        self.last_usage = usage
        value = codec.lift_result(result) if has_result else None
        if recording is not None:
            recording.end_export(name, value, None, usage.fuel, usage.memory_peak)
        return value

    def _call_native(
        self,
        name: str,
        export: _Export,
        native: Any,
        lowered: Any,
        args: tuple[Any, ...],
        budget: Budget,
        cancel: CancelScope | None,
    ) -> Any:
        """:meth:`call` through the compiled codec (``mighty.abi``'s ``FuncCodec.native``):
        the arguments are lowered already; the call and the result's lifting are one C call.
        The same outcomes as the Python path, which :meth:`call` takes for anything else."""
        recording = self._recording
        if recording is not None:
            recording.begin_export(name, args, asdict(budget))
        func = export.func._func
        store = self._meter.store

        fuel = budget.fuel

        def enter() -> tuple[Any, int]:
            # The compiled call sets the fuel and the epoch deadline and reads the fuel left
            # (see Meter.run's ``fueled``).
            error, value, left = native.call(func, store._context(), lowered, fuel)
            if error:
                _raise_call_error(ctypes.cast(error, _ERROR_PTR))
            assert left is not None  # given a fuel, the call says what is left
            return value, left

        try:
            value, usage = self._meter.run(
                enter, budget, cancel, self._stderr_note, self._ctx, fueled=True
            )
        except BaseException as exc:
            self._failed(name, exc, recording)
            raise
        finally:
            lowered.free()
        self.last_usage = usage
        if recording is not None:
            recording.end_export(name, value, None, usage.fuel, usage.memory_peak)
        return value

    def _failed(self, name: str, exc: BaseException, recording: Any) -> None:
        """What a failed call leaves: its usage, its record, and a poisoned instance."""
        self.last_usage = getattr(exc, "usage", None)
        if recording is not None:
            usage_seen = self.last_usage
            recording.end_export(
                name,
                None,
                exc,
                usage_seen.fuel if usage_seen is not None else None,
                usage_seen.memory_peak if usage_seen is not None else None,
            )
        if self._meter.entered:
            # wasmtime poisons an instance that trapped; a host exception raised inside a
            # call may have left guest state half-updated. Either way: no more calls.
            self._poisoned = f"{type(exc).__name__}: {exc}".splitlines()[0]

    def call_with_usage(
        self,
        name: str,
        *args: Any,
        budget: Budget | None = None,
        cancel: CancelScope | None = None,
    ) -> tuple[Any, Usage]:
        """Like :meth:`call`, also returning the call's :class:`Usage`."""
        value = self.call(name, *args, budget=budget, cancel=cancel)
        assert self.last_usage is not None
        return value, self.last_usage

    def signature(self, name: str) -> FuncSig:
        """The WIT signature of export ``name`` (``params`` and ``result``)."""
        return self._export(name).codec.sig

    def exports(self) -> dict[str, FuncSig]:
        """Every exported function with its WIT signature."""
        return {
            name: FuncSig.from_func_type(fty)
            for name, fty in self.component.export_functions().items()
        }

    def _export(self, name: str) -> _Export:
        found = self._exports.get(name)
        if found is not None:
            return found
        func = self._lookup(name)
        if func is None:
            available = sorted(self.component.export_functions())
            raise ExportNotFound(
                f"{self.component.origin} has no exported function {name!r}; "
                f"it exports: {', '.join(available) or 'no functions'}",
                name=name,
                available=available,
            )
        with func.type(self._meter.store) as fty:
            codec = FuncCodec.from_func_type(fty)
        found = _Export(func, codec)
        self._exports[name] = found
        return found

    def _lookup(self, name: str) -> wc.Func | None:
        store = self._meter.store
        if "#" in name:
            outer, inner = name.split("#", 1)
            parent = self._instance.get_export_index(store, outer)
            if parent is None:
                return None
            index = self._instance.get_export_index(store, inner, parent)
            if index is None:
                return None
            return self._instance.get_func(store, index)
        return self._instance.get_func(store, name)

    def learn_hot_pages(self) -> int:
        """Note on the component's memory images which pages this instance has written, for
        later instances made with ``prefault`` (learned once per image; returns the pages)."""
        if self._closed:
            raise Closed("instance is closed")
        return learn_hot_pages(self._meter.account)

    def capture_memory(self, *, exact: bool = False, gap: int | None = None) -> MemoryState:
        """Freeze this instance's linear memory (between calls): its component's image plus a
        sealed copy of the pages that differ (``exact``: only those, else close ranges merged
        so that the state maps in fewer calls; ``gap``: merged when at most that many bytes
        apart). Instances made with ``memory=`` start from it."""
        if self._closed:
            raise Closed("instance is closed")
        merge = 0 if exact else MAX_GAP if gap is None else gap
        # A snapshot's exact pages are frozen whole; a fork's state may be a layer over the
        # last state this memory held (only what changed since is copied).
        return capture_memory(self._meter.account, gap=merge, layered=not exact)

    def restore_memory(self, state: MemoryState) -> None:
        """Make this instance's linear memory hold ``state`` (between calls; same component,
        and the memory already of the state's size). Nothing but the memory changes."""
        if self._closed:
            raise Closed("instance is closed")
        restore_memory(self._meter.account, state)

    def populate_memory(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Copy ``(offset, length)`` ranges of the linear memory in now rather than on the
        guest's first writes (between calls; for an instance readied ahead of its use, see
        :func:`mighty.engine.populate_memory`). Nothing the guest can see changes."""
        if self._closed:
            raise Closed("instance is closed")
        populate_memory(self._meter.account, ranges)

    def rewind(self, state: MemoryState) -> bool:
        """Make this live instance's linear memory hold ``state`` again, copying back only the
        pages it may have changed (:func:`mighty.engine.rewind_memory`: the instance must have
        been made with ``memory=`` a state of the same image and size), and forget its captured
        stdout and stderr. Returns False, changing nothing, when it cannot (closed, poisoned,
        recording, the memory grew, no page map). Between calls only. What is not memory (the
        resources the guest holds, wasm globals) is the caller's to check: see
        ``mighty.sandbox``'s pool, the one user."""
        if self._closed or self._poisoned is not None or self._recording is not None:
            return False
        if not rewind_memory(self._meter.account, state):
            return False
        for capture in self._outputs():
            capture.clear()
        return True

    def holdings(self) -> frozenset[tuple[str, int]]:
        """The host resources the guest holds right now, as ``(kind, rep)`` pairs."""
        return self._ctx.holdings()

    def _stderr_note(self) -> str:
        stderr = self.stderr
        if not stderr.total:
            return ""
        tail = stderr.getvalue()[-2000:].decode("utf-8", "replace")
        return "guest stderr (tail):\n" + tail

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Free the store and everything in it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._exports.clear()
        if self._recording is not None:
            self._recording.close(self.stdout.getvalue(), self.stderr.getvalue())
        # Freeing the store calls back into Python (memory finalizers): no signal handler may
        # raise in there; what one raised comes out here instead.
        with SignalShield() as shield:
            self._meter.store.close()
        self._gate.release(self._ctx)
        if shield.pending is not None:
            raise shield.pending

    def __enter__(self) -> Instance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def call_once(
    component: Component,
    name: str,
    args: Sequence[Any],
    *,
    budget: Budget | None = None,
    cancel: CancelScope | None = None,
    policy: Policy | None = None,
) -> tuple[Any, Usage]:
    """Instantiate, call one export, close."""
    with Instance(component, budget=budget, cancel=cancel, policy=policy) as instance:
        return instance.call_with_usage(name, *args, budget=budget, cancel=cancel)
