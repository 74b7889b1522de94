"""Budgets: every call into a guest runs with fuel, a memory ceiling, a deadline and a cancel scope.

Mechanisms, one per budget:
- fuel: set on the store before each call; what is left afterwards gives the fuel used, and a
  trap with no fuel left is ``OutOfFuel`` (fuel is deterministic, so this is exact);
- memory: the store's :class:`~mighty.engine.MemoryAccount`, enforced by mighty's own memory
  creator. A refused grow returns -1 to the guest (plain wasm semantics) and the call then ends
  in ``OutOfMemory`` at the next epoch check or when it returns, whichever comes first: the
  ceiling is a hard limit, and a guest that catches its ``MemoryError`` does not get around it;
- deadline and cancellation: the engine's epoch advances every ``EPOCH_TICK``; each store has an
  epoch-deadline callback that, once a tick, checks the call's deadline and its cancel scope and
  either extends the deadline by one tick or stops the guest. Cancellation from another thread is
  therefore noticed within about one tick, whatever the guest is doing.

Each call runs in a :class:`~mighty.budget.CallScope` (``_scope``): its deadline, its cancel
scope, the signal that interrupted it and the pause for host time, checked by the epoch callback
while guest code runs and by host functions (``ctx.scope``) while the guest waits in the host.
Rejected: ``Engine.increment_epoch`` from the cancelling thread with a deadline of one tick
(that interrupts every store of the engine, not just the cancelled one).

Fuel after an epoch stop. Wasmtime keeps a function's fuel count in a local and writes it to the
store only at calls, returns and fuel checks that run out, never at an epoch check or a trap
(bytecodealliance/wasmtime#13802): a call stopped by its deadline, a cancel or a signal while
it ran a loop without calls (CPython's ``while True: pass`` is one function's loop) reported
the fuel of its last call, ~500k for a second of work, and 0 for a WAT ``(loop (br 0))``.
Nothing outside the guest can read that local. So the epoch callback notes, at each tick, when
the count last moved (in the thread's CPU time, which a loaded machine does not stretch), and a
call it stops is charged, on top of what wasmtime counted, the CPU time since then at the rate
of a reference loop shaped like an interpreter's dispatch (a byte load, a ``br_table``, a few
locals and a store), measured once per process. Exact when the guest makes calls; otherwise an
estimate, never below what was counted and never above the budget: CPython's own loops burn
about 0.8x the reference's fuel a CPU second, a bare ``(loop (br 0))`` 0.1x. Rejected: reading
the count at the stop alone (the bug); the rate of the call's counted fuel (it counts the set-up
before the loop, not the loop) or of the store's earlier calls (their wall time is mostly host
work: 7 M fuel a second for the sandbox's); wall time (a second of it on a loaded machine is
not a second of the guest's work).

Every running call's scope is in one registry (``_ACTIVE``, keyed by its Meter), which the epoch
callback reads. :func:`interrupting` uses it to stop them all at once: a process that is shutting
down after a signal (`mty run`'s Ctrl-C) marks every running call interrupted, and every call
that starts while the block is open, so each stops at its next epoch tick or host check instead
of being waited for. Rejected: waiting for running calls up to a shutdown timeout and then
abandoning them (a busy agent held a Ctrl-C'd `mty run` for the whole timeout, 10 s), and
cancel scopes handed out per agent by the runtime (a call made by a host function, a restart's
``init`` or a hibernation has none of its own, and a registry of them would be this one again).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import math
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar, overload

import wasmtime

from mighty._errors import (
    BadInput,
    GuestError,
    GuestExit,
    GuestTrap,
    MightyError,
    Misuse,
    OutOfFuel,
    OutOfMemory,
    WrongType,
)
from mighty._usage import Usage
from mighty._wasmtime import error_from_ptr, ffi
from mighty.budget._scope import CallScope, CancelScope
from mighty.engine import MemoryAccount, SignalShield, get_engine, immortal, quick_call
from mighty.gate import UNSCOPED, GuestContext, GuestViolation, HostFunctionFailed

__all__ = [
    "DEFAULT_FUEL",
    "DEFAULT_MEMORY",
    "DEFAULT_TIMEOUT",
    "Budget",
    "Meter",
    "Usage",
    "interrupting",
    "split_wasmtime_error",
    "trap_code_of",
]

DEFAULT_FUEL = 10_000_000_000
"""About a second of CPython-in-wasm work; a componentize-py instantiation takes a few million."""
DEFAULT_MEMORY = 256 * 1024 * 1024
DEFAULT_TIMEOUT = 10.0
_MAX_FUEL = (1 << 63) - 1
_MAX_MEMORY = 1 << 32  # the whole wasm32 address space, per memory
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Budget:
    """What one call into a guest may use. Frozen; ``replace`` returns a changed copy.

    ``fuel``: wasm fuel units (roughly instructions). ``memory``: ceiling in bytes on the total
    linear memory of the instance. ``timeout``: wall-clock seconds, re-armed for every call.
    """

    fuel: int = DEFAULT_FUEL
    memory: int = DEFAULT_MEMORY
    timeout: float = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        if isinstance(self.fuel, bool) or not isinstance(self.fuel, int):
            raise WrongType(f"Budget.fuel must be an int, got {type(self.fuel).__name__}")
        if not 0 < self.fuel <= _MAX_FUEL:
            raise BadInput(f"Budget.fuel must be in 1..{_MAX_FUEL}, got {self.fuel}")
        if isinstance(self.memory, bool) or not isinstance(self.memory, int):
            raise WrongType(f"Budget.memory must be an int, got {type(self.memory).__name__}")
        if not self.memory > 0:
            raise BadInput(f"Budget.memory must be positive, got {self.memory}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, int | float):
            raise WrongType(f"Budget.timeout must be a number, got {type(self.timeout).__name__}")
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise BadInput(
                f"Budget.timeout must be a positive number of seconds, got {self.timeout}"
            )

    def replace(self, **changes: Any) -> Budget:
        """A copy with the given fields changed (validated like the original)."""
        return replace(self, **changes)


_EPOCH_CALLBACK_T = ctypes.CFUNCTYPE(
    ctypes.c_size_t,
    ctypes.POINTER(ffi.wasmtime_context_t),
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_uint64),
    ctypes.POINTER(ctypes.c_uint8),
)
_UPDATE_DEADLINE_CONTINUE = 0
_ACTIVE: dict[int, CallScope] = {}
_NEXT_KEY = itertools.count(1)


class _Interrupting:
    """The signal that :func:`interrupting` stops every call with (None: calls run as usual)."""

    signum: int | None = None
    depth = 0


@contextmanager
def interrupting(signum: int) -> Iterator[int]:
    """While open, every guest call in the process is interrupted as if ``signum`` had come.

    Running calls stop at their next epoch tick (or their next host check, when they wait in a
    host function) and calls that start meanwhile stop at their first, each with ``Cancelled``
    (``reason="interrupted"``, ``by="signal"``). Yields how many calls were running. For a
    shutdown after a signal: nothing is waited for. Any thread; blocks nest.
    """
    if isinstance(signum, bool) or not isinstance(signum, int) or signum <= 0:
        raise BadInput(f"interrupting() takes a signal number, got {signum!r}")
    with _INTERRUPTING_LOCK:
        _Interrupting.depth += 1
        if _Interrupting.signum is None:
            _Interrupting.signum = signum
        # Set before the registry is read (Meter._run reads them the other way round), so a
        # call that starts now is either in the list below or sees the signal itself.
        current = _Interrupting.signum
    running = list(_ACTIVE.values())
    for scope in running:
        scope.interrupt(current)
    try:
        yield len(running)
    finally:
        with _INTERRUPTING_LOCK:
            _Interrupting.depth -= 1
            if _Interrupting.depth == 0:
                _Interrupting.signum = None


_INTERRUPTING_LOCK = threading.Lock()
_now = time.monotonic
_cpu = time.thread_time

_STOP_MESSAGES = {
    "interrupt": "mighty: call interrupted by a signal",
    "cancel": "mighty: call cancelled",
    "deadline": "mighty: deadline exceeded",
}


def _stop(message: str) -> int:
    ptr = ffi.wasmtime_error_new(message.encode())
    return int(ctypes.cast(ptr, ctypes.c_void_p).value or 0)


def _on_epoch(context: Any, key: int | None, delta: Any, kind: Any) -> int:
    state = None
    try:
        state = _ACTIVE.get(key or 0)
        if state is not None:
            _mark_fuel(context, state)
            account = state.account
            if account is not None and account.denied is not None:
                # The guest saw its grow fail (-1) and carried on; the ceiling is a hard limit.
                state.stopped = "memory"
                return _stop("mighty: memory limit exceeded")
            reason = state.stop_reason()
            if reason is not None:
                state.stopped = reason
                return _stop(_STOP_MESSAGES[reason])
        delta[0] = 1
        kind[0] = _UPDATE_DEADLINE_CONTINUE
        return 0
    except BaseException as exc:  # noqa: BLE001 - nothing may unwind into wasmtime
        # A bug here (or a signal the shield did not cover): stop the call, keep the cause.
        if state is not None:
            state.stopped = "failure"
            state.failure = exc
        return _stop(f"mighty: epoch check failed: {exc!r}")


def _mark_fuel(context: Any, state: CallScope) -> None:
    """Note when the fuel count last moved (once a tick, in the epoch callback).

    ``state.fuel_marks``: [fuel left at the latest move, its CPU time, the latest tick's CPU
    time, the first tick's wall time].
    """
    fuel = ctypes.c_uint64()
    error = _get_fuel(context, ctypes.byref(fuel))
    if error:
        ffi.wasmtime_error_delete(error)
        return
    left, cpu = float(fuel.value), _cpu()
    marks = state.fuel_marks
    if marks is None:
        state.fuel_marks = [left, cpu, cpu, _now()]
        return
    if left != marks[0]:
        marks[0] = left
        marks[1] = cpu
    marks[2] = cpu


def _uncounted(state: CallScope, budget: Budget, counted: int, started: float) -> int:
    """Fuel a call the epoch callback stopped spent past what wasmtime counted (see the module
    docstring): the CPU time since the count last moved, at the reference rate."""
    marks = state.fuel_marks
    if marks is None:
        return 0
    left, moved, last, first_tick = marks
    stale = last - moved
    if left >= budget.fuel:
        # Nothing counted since the call began: the loop ran from its start (before the first
        # tick no CPU time was noted: the wall clock stands in for it).
        stale += max(0.0, first_tick - started)
    return max(0, min(budget.fuel - counted, int(_reference_rate() * max(0.0, stale))))


_REFERENCE_LOOP = """
(module
  (memory 1)
  (data (i32.const 0) "\\00\\01\\02\\03\\01\\00\\02\\03\\03\\02\\01\\00\\00\\02\\01\\03")
  (func (export "run") (local $pc i32) (local $acc i32) (local $sp i32)
    (loop $next
      (block $op3 (block $op2 (block $op1 (block $op0
        (br_table $op0 $op1 $op2 $op3
          (i32.load8_u (i32.and (local.get $pc) (i32.const 15)))))
        (i32.store (i32.and (local.get $sp) (i32.const 0xffc)) (local.get $acc))
        (local.set $sp (i32.add (local.get $sp) (i32.const 4)))
        (local.set $pc (i32.add (local.get $pc) (i32.const 1)))
        (br $next))
        (local.set $acc
          (i32.add (local.get $acc) (i32.load (i32.and (local.get $sp) (i32.const 0xffc)))))
        (local.set $pc (i32.add (local.get $pc) (i32.const 1)))
        (br $next))
        (local.set $sp (i32.sub (local.get $sp) (i32.const 4)))
        (local.set $pc (i32.add (local.get $pc) (i32.const 1)))
        (br $next))
      (local.set $pc (i32.add (local.get $pc)
        (select (i32.const 2) (i32.const 1) (i32.and (local.get $acc) (i32.const 1)))))
      (br $next))))
"""
_REFERENCE_FUEL = 50_000_000


class _Reference:
    rate: float | None = None
    lock = threading.Lock()


def _reference_rate() -> float:
    """Fuel a CPU second of the reference loop burns: measured once per process (the fastest
    of three runs out of fuel, where wasmtime's count is exact)."""
    with _Reference.lock:
        if _Reference.rate is None:
            engine = get_engine()
            store = wasmtime.Store(engine)
            store.set_epoch_deadline(1 << 62)
            store.set_fuel(_REFERENCE_FUEL)  # instantiating copies the data segment
            run = wasmtime.Instance(store, wasmtime.Module(engine, _REFERENCE_LOOP), [])
            func = run.exports(store)["run"]
            assert isinstance(func, wasmtime.Func)
            best = 0.0
            for _ in range(3):
                store.set_fuel(_REFERENCE_FUEL)
                began = _cpu()
                with contextlib.suppress(wasmtime.Trap, wasmtime.WasmtimeError):
                    func(store)
                spent = _REFERENCE_FUEL - store.get_fuel()
                best = max(best, spent / max(_cpu() - began, 1e-6))
            _Reference.rate = best
        return _Reference.rate


# Fuel and the epoch deadline are set and read around every call: without the GIL released.
_ERROR_P = ctypes.POINTER(ffi.wasmtime_error_t)
_set_fuel = quick_call("wasmtime_context_set_fuel", _ERROR_P, ctypes.c_void_p, ctypes.c_uint64)
_get_fuel = quick_call("wasmtime_context_get_fuel", _ERROR_P, ctypes.c_void_p, ctypes.c_void_p)
_set_epoch_deadline = quick_call(
    "wasmtime_context_set_epoch_deadline", None, ctypes.c_void_p, ctypes.c_uint64
)

# Kept for the life of the process: every store's epoch callback points at it.
_C_ON_EPOCH = immortal(_EPOCH_CALLBACK_T(_on_epoch))
_NO_FINALIZER = ctypes.cast(0, ctypes.CFUNCTYPE(None, ctypes.c_void_p))


class Meter:
    """Owns one wasmtime Store and runs work in it under budgets.

    One Meter (so one Store) must only be used by one thread at a time; the runtime guarantees
    that, and :meth:`run` checks it.
    """

    def __init__(self, budget: Budget) -> None:
        self.store = wasmtime.Store(get_engine())
        self.account = MemoryAccount(limit=budget.memory)
        self._key = next(_NEXT_KEY)
        self._busy = threading.Lock()
        self.entered = False
        """Whether the latest :meth:`run` got as far as entering the guest."""
        # No finalizer: run() removes the call state itself.
        ffi.wasmtime_store_epoch_deadline_callback(
            self.store.ptr(), _C_ON_EPOCH, self._key, _NO_FINALIZER
        )

    @overload
    def run(
        self,
        work: Callable[[], _T],
        budget: Budget,
        cancel: CancelScope | None = None,
        describe: Callable[[], str] | None = None,
        ctx: GuestContext | None = None,
        *,
        fueled: Literal[False] = False,
    ) -> tuple[_T, Usage]: ...

    @overload
    def run(
        self,
        work: Callable[[], tuple[_T, int]],
        budget: Budget,
        cancel: CancelScope | None = None,
        describe: Callable[[], str] | None = None,
        ctx: GuestContext | None = None,
        *,
        fueled: Literal[True],
    ) -> tuple[_T, Usage]: ...

    def run(
        self,
        work: Callable[[], Any],
        budget: Budget,
        cancel: CancelScope | None = None,
        describe: Callable[[], str] | None = None,
        ctx: GuestContext | None = None,
        *,
        fueled: bool = False,
    ) -> tuple[Any, Usage]:
        """Run ``work`` (which enters the guest) under ``budget``; translate how it stopped.

        ``describe`` returns extra context for a trap message (for example the guest's stderr).
        ``ctx`` is the instance's gate context: it knows whether the guest asked to exit and
        whether a host function failed. On failure the raised error carries ``usage``.

        ``fueled``: ``work`` sets the store's fuel to ``budget.fuel`` and its epoch deadline to
        the next tick itself, right before it enters the guest, and returns ``(result, fuel
        left)`` (the compiled call does all of it in one C call: mighty.abi's
        ``FuncCodec.native``); otherwise this sets them and reads the fuel left afterwards.
        """
        if not self._busy.acquire(blocking=False):
            raise Misuse("a mighty instance is being used by two threads at once")
        self.entered = False
        state = CallScope(budget.timeout, cancel, self.account)
        try:
            # A signal's handler marks this call interrupted: it stops at the next epoch tick.
            return SignalShield(state.interrupt).run(
                self._run, work, state, budget, describe, ctx, fueled
            )
        finally:
            self._busy.release()

    def _run(
        self,
        work: Callable[[], Any],
        state: CallScope,
        budget: Budget,
        describe: Callable[[], str] | None,
        ctx: GuestContext | None,
        fueled: bool,
    ) -> tuple[Any, Usage]:
        cancel = state.cancel
        if cancel is not None and cancel.cancel_called:
            err = state.error("cancel", before_start=True)
            err.usage = Usage(0, self.account.current, 0.0)
            raise err
        if not fueled:
            context = self.store._context()
            error = _set_fuel(context, budget.fuel)
            if error:
                raise error_from_ptr(error)
        self.account.start_call(budget.memory)
        if not fueled:
            _set_epoch_deadline(context, 1)
        if ctx is not None:
            # Host functions wait, check and pause through it (the epoch callback cannot run
            # while the guest is blocked in the host).
            ctx.scope = state
        _ACTIVE[self._key] = state
        halting = _Interrupting.signum  # read after the registry is written: see interrupting()
        if halting is not None:
            state.interrupt(halting)
        started = _now()
        self.entered = True
        try:
            result = work()
        except wasmtime.WasmtimeError as exc:
            usage = self._usage_after(state, budget, started)
            failure = self._failure(exc, state, budget, usage, describe)
            if isinstance(failure, GuestError):
                failure.usage = usage
            raise failure from (failure.__cause__ or exc)
        finally:
            _ACTIVE.pop(self._key, None)
            if ctx is not None:
                ctx.scope = UNSCOPED
        if fueled:
            result, left = result
            usage = Usage(budget.fuel - left, self.account.peak, _now() - started)
        else:
            usage = self._usage(budget, started)
        if self.account.denied is not None:
            # Returned before the next epoch check noticed: same outcome, the result of a
            # call that broke its memory ceiling is not trusted.
            error = self._out_of_memory()
            error.usage = usage
            raise error
        return result, usage

    def _usage_after(self, state: CallScope, budget: Budget, started: float) -> Usage:
        """What a call that stopped with a wasmtime error used."""
        usage = self._usage(budget, started)
        if state.stopped is not None and state.raised is None:
            # Stopped by the epoch callback, maybe inside a loop whose fuel wasmtime never
            # wrote back: charge what it spent (see the module docstring).
            extra = _uncounted(state, budget, usage.fuel, started)
            return replace(usage, fuel=usage.fuel + extra)
        return usage

    def _failure(
        self,
        exc: wasmtime.WasmtimeError,
        state: CallScope,
        budget: Budget,
        usage: Usage,
        describe: Callable[[], str] | None,
    ) -> MightyError:
        """The typed error for a call that stopped with ``exc`` (and what the gate reported
        to the call's scope: a host function's failure, the guest's exit)."""
        failure = state.host_failure
        raised = state.raised
        if raised is not None and failure is raised:
            return raised  # the scope's own stop, raised in a host function that waited
        if isinstance(failure, KeyboardInterrupt) and state.stopped is None:
            # Raised inside a host function by a handler no shield covered (not the main
            # thread's own): the same outcome as a shielded Ctrl-C.
            failure = None
            state.stopped = "interrupt"
            state.interrupted = signal.SIGINT
        if isinstance(failure, GuestViolation):
            return GuestTrap(
                f"guest broke an interface contract: {failure}",
                trap_code="contract_violation",
                wasm_backtrace=split_wasmtime_error(str(exc))[1],
            )
        if failure is None and state.stopped == "failure":
            failure = state.failure
        if failure is not None:
            error = HostFunctionFailed(
                f"a host function failed while serving the guest: {failure!r}"
            )
            error.__cause__ = failure
            return error
        if state.exit_code is not None:
            return GuestExit(f"guest exited with status {state.exit_code}", code=state.exit_code)
        return self._translate(exc, state, budget, usage, describe)

    def _out_of_memory(self) -> OutOfMemory:
        assert self.account.denied is not None
        requested, limit = self.account.denied
        return OutOfMemory(
            f"guest tried to grow its memory to {requested} bytes, over the {limit}-byte limit",
            limit=limit,
            requested=requested,
        )

    def _usage(self, budget: Budget, started: float) -> Usage:
        wall = _now() - started
        fuel = ctypes.c_uint64()
        error = _get_fuel(self.store._context(), ctypes.byref(fuel))
        if error:
            ffi.wasmtime_error_delete(error)
        left = fuel.value if not error else 0
        return Usage(fuel=budget.fuel - left, memory_peak=self.account.peak, wall_time=wall)

    def _translate(
        self,
        exc: wasmtime.WasmtimeError,
        state: CallScope,
        budget: Budget,
        usage: Usage,
        describe: Callable[[], str] | None,
    ) -> GuestError:
        if isinstance(exc, wasmtime.ExitTrap):
            return GuestExit(f"guest exited with status {exc.code}", code=exc.code)
        if state.stopped in ("cancel", "interrupt", "deadline"):
            return state.error(state.stopped)
        if self.account.denied is not None:
            return self._out_of_memory()
        message, backtrace = split_wasmtime_error(str(exc))
        if usage.fuel >= budget.fuel or "all fuel consumed" in message:
            return OutOfFuel(f"call used all of its {budget.fuel} fuel", fuel_limit=budget.fuel)
        try:
            extra = describe() if describe is not None else ""
        except Exception as note_failure:  # noqa: BLE001 - context for a message, never a new failure
            extra = f"(no guest output: {note_failure!r})"
        text = f"guest trapped: {message}"
        if extra:
            text = f"{text}\n{extra}"
        return GuestTrap(text, trap_code=trap_code_of(message), wasm_backtrace=backtrace)


_TRAP_CODES = (
    ("unreachable", "unreachable"),
    ("call stack exhausted", "stack_overflow"),
    ("out of bounds memory access", "memory_out_of_bounds"),
    ("undefined element", "table_out_of_bounds"),
    ("uninitialized element", "indirect_call_to_null"),
    ("indirect call type mismatch", "bad_signature"),
    ("integer overflow", "integer_overflow"),
    ("integer divide by zero", "integer_division_by_zero"),
    ("invalid conversion to integer", "bad_conversion_to_integer"),
    ("cannot enter component instance", "cannot_enter_instance"),
    ("all fuel consumed", "out_of_fuel"),
    ("interrupt", "interrupt"),
)
_BACKTRACE_LINE = re.compile(r"^\s+\d+:|^\s+at ")


def trap_code_of(message: str) -> str | None:
    """A stable code for a wasmtime trap message, or None if the message is not a known trap."""
    lowered = message.lower()
    for needle, code in _TRAP_CODES:
        if needle in lowered:
            return code
    return None


def split_wasmtime_error(text: str) -> tuple[str, str]:
    """Split a wasmtime error into (root cause line, wasm backtrace text)."""
    lines = text.strip().splitlines()
    backtrace = [line for line in lines if _BACKTRACE_LINE.match(line)]
    if "Caused by:" in lines:
        causes = [line.strip() for line in lines[lines.index("Caused by:") + 1 :] if line.strip()]
        cause = causes[-1] if causes else lines[0]
    else:
        rest = [line.strip() for line in lines if line.strip() and not _BACKTRACE_LINE.match(line)]
        cause = rest[-1] if rest else text.strip()
    cause = re.sub(r"^\d+:\s*", "", cause)
    return cause, "\n".join(backtrace)
