"""Instances: a component instantiated in its own store, called under budgets.

The call path is written against wasmtime's C API directly (through wasmtime-py's ctypes
bindings), not ``wasmtime.component.Func.__call__``: that one re-reads the function type and
rebuilds converters on every call and converts ``list<u8>`` one element at a time. Here the
export is resolved and its codec compiled once, on first use.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import wasmtime
from wasmtime import WasmtimeError
from wasmtime import _ffi as ffi
from wasmtime import component as wc
from wasmtime.component._enter import maybe_raise_last_exn

from mighty._errors import ExportNotFound, GuestTrap, MissingImports
from mighty.abi import FuncCodec, FuncSig
from mighty.budget import Budget, CancelScope, Meter, Usage
from mighty.engine import Component, get_engine, instantiating_into

__all__ = ["DEFAULT_OUTPUT_CAP", "Instance", "OutputBuffer", "call_once"]

DEFAULT_OUTPUT_CAP = 1 << 20

# What wasmtime's built-in WASI 0.2 provides (any 0.2.x version). Until mighty's own gate and
# virtual WASI land, guests get this with nothing granted: no files, network, env or args.
_WASIP2 = frozenset(
    {
        "wasi:io/error",
        "wasi:io/poll",
        "wasi:io/streams",
        "wasi:clocks/monotonic-clock",
        "wasi:clocks/wall-clock",
        "wasi:random/random",
        "wasi:random/insecure",
        "wasi:random/insecure-seed",
        "wasi:cli/environment",
        "wasi:cli/exit",
        "wasi:cli/stdin",
        "wasi:cli/stdout",
        "wasi:cli/stderr",
        "wasi:cli/terminal-input",
        "wasi:cli/terminal-output",
        "wasi:cli/terminal-stdin",
        "wasi:cli/terminal-stdout",
        "wasi:cli/terminal-stderr",
        "wasi:filesystem/types",
        "wasi:filesystem/preopens",
        "wasi:sockets/network",
        "wasi:sockets/instance-network",
        "wasi:sockets/tcp",
        "wasi:sockets/tcp-create-socket",
        "wasi:sockets/udp",
        "wasi:sockets/udp-create-socket",
        "wasi:sockets/ip-name-lookup",
    }
)
_VERSION = re.compile(r"@(\d+)\.(\d+)\.(\d+).*$")
_NOT_FOUND = re.compile(r"import `([^`]+)`|instance `([^`]+)`")

_linker: wc.Linker | None = None
_linker_lock = threading.Lock()


def _shared_linker() -> wc.Linker:
    global _linker  # noqa: PLW0603 - a linker is engine-wide and immutable once built
    with _linker_lock:
        if _linker is None:
            linker = wc.Linker(get_engine())
            linker.add_wasip2()
            _linker = linker
        return _linker


def _provided(name: str) -> bool:
    match = _VERSION.search(name)
    bare = name[: match.start()] if match else name
    if bare not in _WASIP2:
        return False
    return match is None or (match.group(1), match.group(2)) == ("0", "2")


class OutputBuffer:
    """Bytes a guest wrote to one stream, kept up to ``cap``; the rest is counted, not kept."""

    __slots__ = ("_chunks", "_kept", "cap", "total")

    def __init__(self, cap: int = DEFAULT_OUTPUT_CAP) -> None:
        self.cap = cap
        self.total = 0
        self._kept = 0
        self._chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - self._kept
        if room > 0:
            piece = data[:room]
            self._chunks.append(piece)
            self._kept += len(piece)

    @property
    def truncated(self) -> bool:
        return self.total > self._kept

    def getvalue(self) -> bytes:
        return b"".join(self._chunks)

    def tail(self, limit: int = 2000) -> str:
        return self.getvalue()[-limit:].decode("utf-8", "replace")


@dataclass(eq=False, slots=True)
class _Export:
    func: wc.Func
    codec: FuncCodec


class Instance:
    """One live instance of a component, with its own store, memory account and budget.

    Not thread-safe: use it from one thread at a time. ``close()`` frees the store; use it as a
    context manager.
    """

    def __init__(
        self,
        component: Component,
        *,
        budget: Budget | None = None,
        cancel: CancelScope | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> None:
        """Instantiate ``component`` under ``budget`` (instantiation runs guest code too)."""
        self.component = component
        self.budget = budget or Budget()
        self.stdout = OutputBuffer(output_cap)
        self.stderr = OutputBuffer(output_cap)
        self.last_usage: Usage | None = None
        self._exports: dict[str, _Export] = {}
        self._poisoned: str | None = None
        self._closed = False
        missing = [name for name in component.imports if not _provided(name)]
        if missing:
            raise MissingImports(
                f"{component.origin} imports what nothing provides: {', '.join(missing)}",
                missing=missing,
            )
        self._meter = Meter(self.budget)
        wasi = wasmtime.WasiConfig()
        wasi.stdout_custom = self.stdout.write
        wasi.stderr_custom = self.stderr.write
        self._meter.store.set_wasi(wasi)
        linker = _shared_linker()

        def instantiate() -> wc.Instance:
            with instantiating_into(self._meter.account):
                return linker.instantiate(self._meter.store, component.wasm)

        try:
            self._instance, self.instantiate_usage = self._meter.run(
                instantiate, self.budget, cancel, self._stderr_note
            )
        except GuestTrap as exc:
            names = [m.group(1) or m.group(2) for m in _NOT_FOUND.finditer(exc.message)]
            if "matching implementation was not found" in str(exc.__cause__) and names:
                raise MissingImports(
                    f"{component.origin} imports what nothing provides: {', '.join(names)}",
                    missing=names,
                ) from exc
            raise

    # -- calling -----------------------------------------------------------------------------

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
            raise ValueError("instance is closed")
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
        params = codec.lower_params(self._meter.store, args)
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
                err = WasmtimeError._from_ptr(error)
                maybe_raise_last_exn()
                raise err

        try:
            _, usage = self._meter.run(enter, budget, cancel, self._stderr_note)
        except BaseException as exc:
            self.last_usage = getattr(exc, "usage", None)
            if self._meter.entered:
                # wasmtime poisons an instance that trapped; a host exception raised inside
                # a call may have left guest state half-updated. Either way: no more calls.
                self._poisoned = f"{type(exc).__name__}: {exc}".splitlines()[0]
            raise
        finally:
            codec.free_params(params.array, params.size)
        self.last_usage = usage
        return codec.lift_result(result) if has_result else None

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

    def _stderr_note(self) -> str:
        if not self.stderr.total:
            return ""
        return "guest stderr (tail):\n" + self.stderr.tail()

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Free the store and everything in it. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._exports.clear()
        self._meter.store.close()

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
) -> tuple[Any, Usage]:
    """Instantiate, call one export, close: the `mty call` path."""
    with Instance(component, budget=budget, cancel=cancel) as instance:
        return instance.call_with_usage(name, *args, budget=budget, cancel=cancel)
