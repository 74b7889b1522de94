"""Recording: every import and every export call of an instance, appended to a trace as it happens.

The recorder is a gate hook, so it sees exactly what the guest sees: the arguments as they
crossed (resources as :class:`HandleRef`), the result, and how the call ended (a value, an exit
request, a contract violation, a host failure). Export calls are written by the instance as a
``call`` record before the guest runs and an ``export`` record after, so a replayer knows what
to call before it meets the imports that call makes.

Fuel is part of every record: the fuel the guest has used since its export call began. It is
deterministic, so replay can check it exactly, and it is the trace's logical clock.

Source positions (``Recorder(positions=True)``, or ``MTY_TRACE_POSITIONS=1`` in the
environment): the instance record says ``"positions": true``, the agent SDK is told so through
``mighty:agent/debug#positions`` (see ``mighty.gate``'s ``_source.py``) and sends its caller's
``(file, line, function)`` before each import it makes; the next import record carries it as
``"src": [file, line, function]``, a side field the replayer does not compare. Bounded: each
position is cut by the gate (160 + 80 characters), and an instance keeps at most
``POSITION_BYTES`` of them (later ones are dropped, their count in ``positions_dropped``). Such an
instance's imports are recorded by ``watch_import`` (no taps: they encode a fixed record shape).
Rejected: a record kind of its own for a position (every replayer would have to skip it, and
one that does not know it stops at "record order"); positions in the compared import payload
(a replay would then demand the same positions of the guest, see ``_source.py``).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mighty._wasmtime import ffi
from mighty.abi import Err, Ok, Some, Variant
from mighty.engine import SETTINGS, Component
from mighty.gate import (
    Binding,
    GuestContext,
    GuestExitRequest,
    GuestViolation,
    Handle,
    ResourceKind,
)
from mighty.trace._emit import (
    ARRAY_HEADS,
    BYTES_HEADS,
    UINTS,
    Refused,
    emit,
    emit_args,
    emit_item,
    emit_result,
    emit_simple,
    head,
    text,
    uint,
)
from mighty.trace._format import BUFFER_BYTES, FLUSH_INTERVAL, MAX_ITEMS, FlushMode, TraceWriter
from mighty.trace._native import native
from mighty.trace._values import TAG_HANDLE, HandleRef

__all__ = [
    "POSITIONS_ENV",
    "POSITION_BYTES",
    "InstanceRecording",
    "Recorder",
    "default_trace_path",
    "to_refs",
]

POSITIONS_ENV = "MTY_TRACE_POSITIONS"
"""Set to ``1`` to keep source positions in every recording made without ``positions=``."""
POSITION_BYTES = 1 << 22
"""Most bytes of source positions one instance's records carry (4 MiB)."""


# Our own prototype (dll[name] is a new function object): c_void_p takes the context pointer
# as it is, and there is no Python wrapper frame around the call.
# It returns at once, so it runs holding the GIL (no hand-over per import).
_get_fuel = ctypes.PyDLL(ffi.dll._name)["wasmtime_context_get_fuel"]
_get_fuel.restype = ctypes.c_void_p
_get_fuel.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
# The same function without argument conversion (0.2 us less per call): only ever given a
# ctypes pointer object (a c_void_p, or the POINTER a Storelike's _context() returns) and the
# byref of a c_uint64, which ctypes passes as the pointers they hold.
_get_fuel_raw = ctypes.PyDLL(ffi.dll._name)["wasmtime_context_get_fuel"]
_get_fuel_raw.restype = ctypes.c_void_p
_get_fuel_raw.argtypes = None  # type: ignore[assignment]  # ctypes allows it: no conversion

# The addresses of the same function and of wasmtime_error_delete, for the compiled taps.
_GET_FUEL_AT = ctypes.cast(_get_fuel_raw, ctypes.c_void_p).value or 0
_ERROR_DELETE_AT = ctypes.cast(ffi.dll.wasmtime_error_delete, ctypes.c_void_p).value or 0

_MAP9, _MAP10, _MAP11 = head(5, 9), head(5, 10), head(5, 11)
_K_IMPORT = text("k") + text("import") + text("i")
_K_S, _K_IF, _K_FN, _K_ARGS = text("s"), text("if"), text("fn"), text("args")
_K_RES, _K_OUT, _K_FUEL, _K_A = text("res"), text("out"), text("fuel"), text("a")
_K_SRC = text("src")
_ARRAY, _BYTES, _UINT, head_of = ARRAY_HEADS, BYTES_HEADS, UINTS, head
_HANDLES_KEPT = 4096
_T_OK_NONE = emit(Ok(None))
_T_HANDLE = head(6, TAG_HANDLE) + ARRAY_HEADS[3]
_U32, _U64 = 0xFFFFFFFF, 2**64 - 1
_B4 = struct.Struct(">BI").pack
_B2 = struct.Struct(">BH").pack


def _fuel_failed(error: int) -> int:
    """-1, the fuel of a record whose reading failed (the error freed)."""
    ffi.wasmtime_error_delete(ctypes.cast(error, ctypes.POINTER(ffi.wasmtime_error_t)))
    return -1


def default_trace_path(directory: Path | None = None) -> Path:
    """``mty-trace-<UTC timestamp>.bin`` in ``directory`` (default: the current directory)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return (directory or Path.cwd()) / f"mty-trace-{stamp}.bin"


def to_refs(value: Any) -> Any:
    """``value`` with every gate :class:`Handle` replaced by a recordable :class:`HandleRef`."""
    if isinstance(value, Handle):
        return HandleRef(value.kind.interface, value.kind.name, value.rep)
    if isinstance(value, list):
        return [to_refs(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_refs(v) for v in value)
    if isinstance(value, Ok):
        return Ok(to_refs(value.value))
    if isinstance(value, Err):
        return Err(to_refs(value.value))
    if isinstance(value, Some):
        return Some(to_refs(value.value))
    if isinstance(value, Variant):
        return Variant(value.case, to_refs(value.value))
    if isinstance(value, dict):
        return {k: to_refs(v) for k, v in value.items()}
    return value


def describe_policy(policy: Any) -> dict[str, Any]:
    """A policy as plain data for the trace (host paths and sink functions by name only)."""
    if not is_dataclass(policy) or isinstance(policy, type):
        return {}
    data = asdict(policy)
    for stream in ("stdout", "stderr"):
        sink = data.get(stream, {}).get("sink")
        if sink is not None:
            data[stream]["sink"] = getattr(sink, "__qualname__", type(sink).__name__)
    data["dirs"] = [
        {k: str(v) if isinstance(v, Path) else v for k, v in d.items() if k != "files"}
        for d in data.get("dirs", [])
    ]
    return data


class _Counters:
    """An instance's step and fuel limit, for the pure-Python taps (``_speedups.Core`` holds
    them for the compiled ones)."""

    __slots__ = ("fuel_limit", "step")

    def __init__(self) -> None:
        self.step = 0
        self.fuel_limit = 0


class Recorder:
    """Writes one trace file; many instances (even on several threads) may record into it.

    ``flush`` is the durability setting (docs/determinism.md says what each promises):
    ``"call"`` (the default) hands an export call's records to the operating system when the
    call begins and ends, so a crash of this process loses at most the records of the calls in
    flight; ``"record"`` hands over each record as it is made; ``"os"`` only when
    ``buffer_bytes`` have gathered or the oldest is ``flush_interval`` seconds old.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        flush: FlushMode = "call",
        buffer_bytes: int = BUFFER_BYTES,
        flush_interval: float = FLUSH_INTERVAL,
        positions: bool | None = None,
        **header: Any,
    ) -> None:
        self.path = Path(path) if path is not None else default_trace_path()
        if positions is None:
            positions = os.environ.get(POSITIONS_ENV, "") in ("1", "true", "yes")
        self.positions = positions
        """Whether the agents it records send their source positions (see the module doc)."""
        self._ids = itertools.count(1)
        self._writer = TraceWriter(
            self.path,
            {"engine": SETTINGS.describe(), **header},
            flush=flush,
            buffer_bytes=buffer_bytes,
            flush_interval=flush_interval,
        )
        self._imports = self._writer.import_records()
        """How the instances' import records reach the writer (encoded here, see
        ``ImportRecords``)."""

    @property
    def flush_mode(self) -> FlushMode:
        """The durability setting this recorder writes with."""
        return self._writer.flush_mode

    def append(self, record: dict[str, Any]) -> None:
        """Append one record (the writer takes the lock)."""
        self._writer.append(record)

    def boundary(self) -> None:
        """An export call began or ended (see ``flush``)."""
        self._writer.boundary()

    def flush(self) -> None:
        """Hand every record so far to the operating system, whatever ``flush`` says."""
        self._writer.flush()

    def attach(
        self,
        component: Component,
        budget: dict[str, Any],
        policy: Any,
        *,
        agent: str | None = None,
        name: str | None = None,
    ) -> InstanceRecording:
        """Start recording a new instance of ``component``; returns its recording.

        ``agent`` (an address such as ``kv:3``) goes into every record of the instance, and
        ``name`` (the agent's registered name) into its start record, so one agent can be
        replayed alone across its restarts and swaps. The component is named by its sha256
        (found again in the component store) and by the absolute path it was loaded from.
        """
        instance_id = next(self._ids)
        record: dict[str, Any] = {
            "k": "instance",
            "i": instance_id,
            "component": component.sha256,
            "path": _absolute(component.origin),
            "size": component.size,
            "budget": budget,
            "policy": describe_policy(policy),
        }
        if agent is not None:
            record["a"] = agent
        if name is not None:
            record["name"] = name
        if self.positions:
            record["positions"] = True
        self.append(record)
        return InstanceRecording(self, instance_id, agent, positions=self.positions)

    def close(self, *, sync: bool = True) -> None:
        """Write out what waits, sync the file to disk (unless ``sync`` is false: a file about
        to be deleted, such as a durable agent's import log at its checkpoint) and close it."""
        self._writer.close(sync=sync)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _absolute(origin: str) -> str:
    """``origin`` made absolute when it is a path (``<bytes>`` and the like stay as they are)."""
    if origin.startswith("<"):
        return origin
    return str(Path(origin).absolute())


class InstanceRecording:
    """The recording of one instance: its gate hook and its export calls."""

    def __init__(
        self,
        recorder: Recorder,
        instance_id: int,
        agent: str | None = None,
        *,
        positions: bool = False,
    ) -> None:
        self.recorder = recorder
        self.instance_id = instance_id
        self.agent = agent
        self.keeps_positions = positions
        """Tells ``mighty:agent/debug#positions`` to ask the guest for its positions."""
        self.positions_dropped = 0
        """Positions not kept: past ``POSITION_BYTES`` for this instance."""
        self._position: list[Any] | None = None
        self._position_bytes = 0
        self._imports = recorder._imports
        # The step and fuel limit the taps share with the other paths: in C when the writer
        # has the compiled queue (its taps are then compiled too), else in Python.
        self._core: _Counters | native.Core
        if self._imports.native_queue is not None:
            self._core = native.Core(_GET_FUEL_AT, _ERROR_DELETE_AT)
        else:
            self._core = _Counters()
        # An import record's bytes, but for its step, args, result, outcome and fuel, are the
        # same for every call of one import: made once per binding (see _import_payload).
        self._head = (_MAP10 if agent is not None else _MAP9) + _K_IMPORT + uint(instance_id) + _K_S
        self._tail = b"" if agent is None else _K_A + text(agent)
        # The same with one field more, "src" (a source position), before the tail.
        self._head_src = (
            (_MAP11 if agent is not None else _MAP10) + _K_IMPORT + uint(instance_id) + _K_S
        )
        self._mids: dict[int, tuple[Binding, bytes]] = {}
        self._ok = _K_OUT + text("ok") + _K_FUEL
        # One instance makes one import at a time: one out-parameter for the fuel reading.
        self._left = ctypes.c_uint64()
        self._left_ref = ctypes.byref(self._left)
        # The gate's call store's context pointer (an int), and a c_void_p holding it.
        self._ptr: int | None = None
        self._cptr = ctypes.c_void_p()

    @property
    def step(self) -> int:
        """The instance's last step (every record but ``instance`` and ``close`` takes one)."""
        return self._core.step

    @step.setter
    def step(self, value: int) -> None:
        self._core.step = value

    @property
    def fuel_limit(self) -> int:
        """The fuel of the export call in flight (fuel used = fuel_limit - fuel left)."""
        return self._core.fuel_limit

    @fuel_limit.setter
    def fuel_limit(self, value: int) -> None:
        self._core.fuel_limit = value

    def _append(self, record: dict[str, Any]) -> None:
        if self.agent is not None:
            record["a"] = self.agent
        self.recorder.append(record)

    def _next_step(self) -> int:
        self.step += 1
        return self.step

    # -- the gate hook -----------------------------------------------------------------------

    def take_position(self, file: str, line: int, function: str) -> None:
        """The guest's position for its next import (bounded by the gate; see the module doc)."""
        if not self.keeps_positions:
            return
        size = len(file) + len(function) + 8
        if self._position_bytes + size > POSITION_BYTES:
            self.positions_dropped += 1
            return
        self._position_bytes += size
        self._position = [file, line, function]

    def __call__(
        self,
        ctx: GuestContext,
        binding: Binding,
        args: Sequence[Any],
        call: Callable[[], Any],
    ) -> Any:
        step = self._next_step()
        outcome = "ok"
        result: Any = None
        try:
            result = call()
        except GuestExitRequest as exc:
            outcome, result = "exit", exc.code
            raise
        except GuestViolation as exc:
            outcome, result = "violation", str(exc)
            raise
        except BaseException as exc:
            outcome, result = "host_error", repr(exc)
            raise
        finally:
            if self._position is not None:
                self._record_positioned(step, binding, args, result, outcome, self._fuel_used(ctx))
            else:
                self._record_import(step, binding, args, result, outcome, self._fuel_used(ctx))
        return result

    def watch_import(
        self, ctx: GuestContext, binding: Binding, args: Sequence[Any], value: Any, failed: bool
    ) -> None:
        """The gate's watching side of ``__call__`` (see ``CallHook``): the same record."""
        core = self._core
        core.step = step = core.step + 1
        if self._position is not None:
            self._watch_positioned(ctx, step, binding, args, value, failed)
            return
        if failed:
            result: Any
            if isinstance(value, GuestExitRequest):
                outcome, result = "exit", value.code
            elif isinstance(value, GuestViolation):
                outcome, result = "violation", str(value)
            else:
                outcome, result = "host_error", repr(value)
            self._record_import(step, binding, args, result, outcome, self._fuel_used(ctx))
            return
        # The fuel reading, as _fuel_used does, inline: this runs for every import.
        store = ctx.call_store
        ptr = getattr(store, "ptr", None)
        if ptr is None:
            error = _get_fuel(store._context(), self._left_ref)
        else:
            if ptr != self._ptr:
                self._ptr = ptr
                self._cptr = ctypes.c_void_p(ptr)
            error = _get_fuel_raw(self._cptr, self._left_ref)
        if error:
            ffi.wasmtime_error_delete(ctypes.cast(error, ctypes.POINTER(ffi.wasmtime_error_t)))
            fuel = -1
        else:
            fuel = self._core.fuel_limit - self._left.value
        imports = self._imports
        mid = self._mids.get(id(binding))
        if mid is not None and mid[0] is binding and imports.queued:
            # Most import records hold only handles, short bytes and small ints: encoded here
            # in one go, byte for byte what append_parts writes (tests/trace/test_emit.py),
            # and queued without the writer's lock (framed and written in batches).
            blob_min = imports.blob_min
            head_args = emit_args(args, blob_min)
            if head_args is not None:
                res = emit_simple(value, blob_min)
                if res is not None:
                    payload = b"".join(
                        (
                            self._head,
                            uint(step),
                            mid[1],
                            head_args,
                            _K_RES,
                            res,
                            self._ok,
                            uint(fuel),
                            self._tail,
                        )
                    )
                    if len(payload) <= MAX_ITEMS:
                        imports.queue(payload)
                        return
        self._record_import(step, binding, args, value, "ok", fuel)

    def tap_import(
        self, binding: Binding, nparams: int, self_kind: ResourceKind | None
    ) -> Callable[..., None] | None:
        """The gate's tap of ``binding`` (see ``CallHook``): the record ``watch_import`` makes,
        byte for byte, from a prefix made here once, the step, the encoded arguments and
        result and the fuel; anything its one-go encoding does not take goes the general way.
        The tap is the compiled one (``_speedups.Tap``, see ``_tap_compiled``) when the writer
        has the compiled queue, else the pure-Python ``_tap_plain``/``_tap_method``.
        """
        if nparams > 2 or (self_kind is not None and nparams == 0) or self.keeps_positions:
            return None
        mid = self._mid(binding)[1] + _ARRAY[nparams]
        core = self._core
        if not isinstance(core, _Counters):
            return self._tap_compiled(core, binding, nparams, self_kind, mid)
        if self_kind is not None:
            return self._tap_method(binding, nparams, self_kind, mid)
        return self._tap_plain(binding, nparams, mid)

    def _tap_compiled(
        self,
        core: native.Core,
        binding: Binding,
        nparams: int,
        self_kind: ResourceKind | None,
        mid: bytes,
    ) -> Callable[..., None]:
        """The compiled tap (``_speedups.Tap``): the same record as ``_tap_plain`` and
        ``_tap_method`` make, byte for byte; it hands what it does not encode to the general
        path (``_record_import``), as they do."""
        record = self._record_import
        if self_kind is None:

            def general(step: int, fuel: int, result: Any, *args: Any) -> None:
                record(step, binding, args, result, "ok", fuel)

        else:
            kind = self_kind
            # The handle's bytes but its rep: _emit's handle encoding, which the tap ends.
            mid += _T_HANDLE + text(kind.interface) + text(kind.name)

            def general(step: int, fuel: int, result: Any, *args: Any) -> None:
                record(step, binding, [Handle(kind, args[0]), *args[1:]], result, "ok", fuel)

        queue = self._imports.native_queue
        assert queue is not None
        return native.Tap(
            core,
            queue,
            Ok,
            self._head,
            mid,
            _K_RES,
            self._ok,
            self._tail,
            nparams,
            self_kind is not None,
            general,
        )

    def _fuel_at(self, context_ptr: int) -> int:
        """The fuel used since the export call began, read through the call's context (the
        taps do the same inline)."""
        if context_ptr != self._ptr:
            self._point_at(context_ptr)
        error = _get_fuel_raw(self._cptr, self._left_ref)
        if error:
            return _fuel_failed(error)
        return self._core.fuel_limit - self._left.value

    def _point_at(self, context_ptr: int) -> None:
        self._ptr = context_ptr
        self._cptr = ctypes.c_void_p(context_ptr)

    def _tap_plain(self, binding: Binding, nparams: int, mid: bytes) -> Callable[..., None]:  # noqa: PLR0915 - one tap per import shape
        imports = self._imports
        core = self._core
        blob_min = imports.blob_min
        head, ok, tail = self._head, self._ok, self._tail
        fuel_at, record = self._fuel_at, self._record_import
        get_fuel, left, left_ref = _get_fuel_raw, self._left, self._left_ref
        queue = imports.queue
        join = b"".join
        mid_res = mid + _K_RES

        if nparams == 0:

            def tap_none(context_ptr: int, result: Any) -> None:
                core.step = step = core.step + 1
                if context_ptr != self._ptr:
                    self._point_at(context_ptr)
                error = get_fuel(self._cptr, left_ref)
                fuel = _fuel_failed(error) if error else core.fuel_limit - left.value
                if type(result) is int and 0 <= result <= _U64:
                    rb: bytes | None = uint(result)  # a clock's instant
                else:
                    rb = emit_result(result, blob_min)
                if rb is not None:
                    payload = join(
                        (
                            head,
                            _UINT[step]
                            if step < 256
                            else _B2(25, step)
                            if step < 65536
                            else uint(step),
                            mid_res,
                            rb,
                            ok,
                            _B4(26, fuel) if 65536 <= fuel <= _U32 else uint(fuel),
                            tail,
                        )
                    )
                    if len(payload) <= MAX_ITEMS:
                        queue(payload)
                        return
                record(step, binding, (), result, "ok", fuel)

            return tap_none

        if nparams == 1:

            def tap_one(context_ptr: int, result: Any, arg: Any) -> None:
                core.step = step = core.step + 1
                if context_ptr != self._ptr:
                    self._point_at(context_ptr)
                error = get_fuel(self._cptr, left_ref)
                fuel = _fuel_failed(error) if error else core.fuel_limit - left.value
                if type(arg) is int and 0 <= arg < 256:
                    ab: bytes | None = _UINT[arg]  # get-random-bytes' length
                else:
                    ab = emit_item(arg, blob_min)
                rb = emit_result(result, blob_min)
                if ab is not None and rb is not None:
                    payload = join(
                        (
                            head,
                            _UINT[step]
                            if step < 256
                            else _B2(25, step)
                            if step < 65536
                            else uint(step),
                            mid,
                            ab,
                            _K_RES,
                            rb,
                            ok,
                            _B4(26, fuel) if 65536 <= fuel <= _U32 else uint(fuel),
                            tail,
                        )
                    )
                    if len(payload) <= MAX_ITEMS:
                        queue(payload)
                        return
                record(step, binding, [arg], result, "ok", fuel)

            return tap_one

        def tap(context_ptr: int, result: Any, *args: Any) -> None:
            core.step = step = core.step + 1
            fuel = fuel_at(context_ptr)
            rb = emit_result(result, blob_min)
            if rb is not None:
                parts = [head, uint(step), mid]
                for arg in args:
                    part = emit_item(arg, blob_min)
                    if part is None:
                        break
                    parts.append(part)
                else:
                    parts += (_K_RES, rb, ok, uint(fuel), tail)
                    payload = join(parts)
                    if len(payload) <= MAX_ITEMS:
                        queue(payload)
                        return
            record(step, binding, args, result, "ok", fuel)

        return tap

    def _tap_method(  # noqa: PLR0915 - one tap per import shape
        self, binding: Binding, nparams: int, self_kind: ResourceKind, mid: bytes
    ) -> Callable[..., None]:
        imports = self._imports
        core = self._core
        blob_min = imports.blob_min
        head, ok, tail = self._head, self._ok, self._tail
        record = self._record_import
        get_fuel, left, left_ref = _get_fuel_raw, self._left, self._left_ref
        queue = imports.queue
        join = b"".join
        # By rep: the record's bytes from its args key to its result (the handle, then for a
        # method of no other argument the res key).
        middles: dict[int, bytes] = {}
        interface, name = self_kind.interface, self_kind.name
        after = _K_RES if nparams == 1 else b""

        def middle(rep: int) -> bytes:
            data = mid + emit(HandleRef(interface, name, rep)) + after
            if len(middles) >= _HANDLES_KEPT:
                middles.clear()
            middles[rep] = data
            return data

        if nparams == 1:

            def tap_self(context_ptr: int, result: Any, rep: int) -> None:
                core.step = step = core.step + 1
                if context_ptr != self._ptr:
                    self._point_at(context_ptr)
                error = get_fuel(self._cptr, left_ref)
                fuel = _fuel_failed(error) if error else core.fuel_limit - left.value
                if type(result) is Ok and result.value is None:
                    rb: bytes | None = _T_OK_NONE  # a stream's flush
                else:
                    rb = emit_result(result, blob_min)
                if rb is not None:
                    payload = join(
                        (
                            head,
                            _UINT[step]
                            if step < 256
                            else _B2(25, step)
                            if step < 65536
                            else uint(step),
                            middles.get(rep) or middle(rep),
                            rb,
                            ok,
                            _B4(26, fuel) if 65536 <= fuel <= _U32 else uint(fuel),
                            tail,
                        )
                    )
                    if len(payload) <= MAX_ITEMS:
                        queue(payload)
                        return
                record(step, binding, [Handle(self_kind, rep)], result, "ok", fuel)

            return tap_self

        def tap_self_arg(context_ptr: int, result: Any, rep: int, arg: Any) -> None:
            core.step = step = core.step + 1
            if context_ptr != self._ptr:
                self._point_at(context_ptr)
            error = get_fuel(self._cptr, left_ref)
            fuel = _fuel_failed(error) if error else core.fuel_limit - left.value
            if type(arg) is bytes and len(arg) < blob_min:
                size = len(arg)
                ab: bytes | None = (_BYTES[size] if size < 256 else head_of(2, size)) + arg
            else:
                ab = emit_item(arg, blob_min)
            if type(result) is Ok and result.value is None:
                rb: bytes | None = _T_OK_NONE  # a stream's write
            else:
                rb = emit_result(result, blob_min)
            if ab is not None and rb is not None:
                payload = join(
                    (
                        head,
                        _UINT[step]
                        if step < 256
                        else _B2(25, step)
                        if step < 65536
                        else uint(step),
                        middles.get(rep) or middle(rep),
                        ab,
                        _K_RES,
                        rb,
                        ok,
                        _B4(26, fuel) if 65536 <= fuel <= _U32 else uint(fuel),
                        tail,
                    )
                )
                if len(payload) <= MAX_ITEMS:
                    queue(payload)
                    return
            record(step, binding, [Handle(self_kind, rep), arg], result, "ok", fuel)

        return tap_self_arg

    def _mid(self, binding: Binding) -> tuple[Binding, bytes]:
        mid = self._mids.get(id(binding))
        if mid is None or mid[0] is not binding:
            mid = (binding, _K_IF + text(binding.interface) + _K_FN + text(binding.name) + _K_ARGS)
            self._mids[id(binding)] = mid
        return mid

    def _record_import(
        self, step: int, binding: Binding, args: Sequence[Any], result: Any, outcome: str, fuel: int
    ) -> None:
        mid = self._mid(binding)
        values = list(args)
        imports = self._imports
        # Most import records hold only handles, short bytes and small ints: encoded here in
        # one go, byte for byte what append_parts writes (tests/trace/test_emit.py).
        blob_min = imports.blob_min
        head_args = emit_simple(values, blob_min)
        if head_args is not None:
            res = emit_simple(result, blob_min)
            if res is not None:
                imports.append(
                    b"".join(
                        (
                            self._head,
                            uint(step),
                            mid[1],
                            head_args,
                            _K_RES,
                            res,
                            _K_OUT,
                            text(outcome),
                            _K_FUEL,
                            uint(fuel),
                            self._tail,
                        )
                    )
                )
                return
        try:
            # Byte for byte the dict below through TraceWriter.append (tests/trace/test_emit.py).
            imports.append_parts(
                self._head + uint(step) + mid[1],
                values,
                _K_RES,
                result,
                _K_OUT + text(outcome) + _K_FUEL + uint(fuel) + self._tail,
            )
        except Refused:
            # Not a value the fast encoder takes: the writer's own path names what is wrong.
            self._append(
                {
                    "k": "import",
                    "i": self.instance_id,
                    "s": step,
                    "if": binding.interface,
                    "fn": binding.name,
                    "args": to_refs(values),
                    "res": to_refs(result),
                    "out": outcome,
                    "fuel": fuel,
                }
            )

    def _watch_positioned(
        self,
        ctx: GuestContext,
        step: int,
        binding: Binding,
        args: Sequence[Any],
        value: Any,
        failed: bool,
    ) -> None:
        outcome, result = "ok", value
        if failed:
            if isinstance(value, GuestExitRequest):
                outcome, result = "exit", value.code
            elif isinstance(value, GuestViolation):
                outcome, result = "violation", str(value)
            else:
                outcome, result = "host_error", repr(value)
        self._record_positioned(step, binding, args, result, outcome, self._fuel_used(ctx))

    def _record_positioned(
        self, step: int, binding: Binding, args: Sequence[Any], result: Any, outcome: str, fuel: int
    ) -> None:
        """An import record with the pending source position as its ``src`` (the dict path:
        the encoders in one go write a fixed set of fields)."""
        position, self._position = self._position, None
        values = list(args)
        blob_min = self._imports.blob_min
        head_args = emit_simple(values, blob_min)
        res = None if head_args is None else emit_simple(result, blob_min)
        src = None if res is None else emit_simple(position, blob_min)
        if head_args is not None and res is not None and src is not None:
            # Byte for byte the dict below (tests/trace/test_positions.py), in one go.
            self._imports.append(
                b"".join(
                    (
                        self._head_src,
                        uint(step),
                        self._mid(binding)[1],
                        head_args,
                        _K_RES,
                        res,
                        _K_OUT,
                        text(outcome),
                        _K_FUEL,
                        uint(fuel),
                        _K_SRC,
                        src,
                        self._tail,
                    )
                )
            )
            return
        self._append(
            {
                "k": "import",
                "i": self.instance_id,
                "s": step,
                "if": binding.interface,
                "fn": binding.name,
                "args": to_refs(values),
                "res": to_refs(result),
                "out": outcome,
                "fuel": fuel,
                "src": position,
            }
        )

    def _fuel_used(self, ctx: GuestContext) -> int:
        store = ctx.call_store
        # The gate's call store has the raw context pointer; any other Storelike its own.
        ptr = getattr(store, "ptr", None)
        error = _get_fuel(ptr if ptr is not None else store._context(), self._left_ref)
        if error:
            ffi.wasmtime_error_delete(ctypes.cast(error, ctypes.POINTER(ffi.wasmtime_error_t)))
            return -1
        return self._core.fuel_limit - self._left.value

    # -- export calls (the instance calls these) ----------------------------------------------

    def begin_export(self, name: str, args: Sequence[Any], budget: dict[str, Any]) -> None:
        self.fuel_limit = int(budget["fuel"])
        self._append(
            {
                "k": "call",
                "i": self.instance_id,
                "s": self._next_step(),
                "fn": name,
                # A host resource passed in (wasi:http serve's request) as its HandleRef.
                "args": [to_refs(a) if type(a) is Handle else a for a in args],
                "budget": budget,
            }
        )
        self.recorder.boundary()

    def end_export(
        self,
        name: str,
        result: Any,
        error: BaseException | None,
        fuel: int | None,
        memory_peak: int | None,
    ) -> None:
        failure = None
        if error is not None:
            failure = {
                "kind": str(getattr(error, "kind", type(error).__name__)),
                "message": str(getattr(error, "message", error)),
            }
        self._append(
            {
                "k": "export",
                "i": self.instance_id,
                "s": self._next_step(),
                "fn": name,
                "res": result if error is None else None,
                "ok": error is None,
                "error": failure,
                "fuel": fuel,
                "memory_peak": memory_peak,
            }
        )
        self.recorder.boundary()

    def close(self, stdout: bytes, stderr: bytes) -> None:
        self._append({"k": "close", "i": self.instance_id, "stdout": stdout, "stderr": stderr})
        self.recorder.boundary()
