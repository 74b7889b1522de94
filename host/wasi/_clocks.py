"""``wasi:clocks`` 0.2: monotonic-clock and wall-clock, under the policy's clock mode.

- ``real``: the host's ``time.monotonic_ns`` and ``time.time_ns``; resolution 1 ns; waits sleep.
- ``fixed``: monotonic time is always 0 and wall time always ``clock_start``; a wait is over as
  soon as the guest blocks on it (time cannot pass, so waiting must not either).
- ``virtual``: deterministic. Monotonic time starts at 0; every ``now`` (monotonic or wall)
  advances it by ``VIRTUAL_STEP_NS`` plus ``NS_PER_FUEL`` per unit of fuel the guest burned since
  the previous reading, so a busy guest sees time pass and the same run always sees the same
  times. Wall time is ``clock_start`` plus monotonic time. Blocking on a virtual pollable jumps
  the clock to its deadline instead of sleeping.

Fuel is read with ``ctx.store.get_fuel()``, which works inside a host call. The Meter re-arms fuel
at the start of every call; a reading higher than the previous one is such a re-arm and counts as
no fuel burned (so the times never depend on the budget's size). Without fuel metering the clock
advances by the fixed step only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import wasmtime

from mighty.gate import Binding, Direct, GuestContext, ResourceKind, Slot
from mighty.wasi._io import VirtualPollable
from mighty.wasi._policy import Policy
from mighty.wasi._streams import POLLABLE, Pollable

__all__ = [
    "NS_PER_FUEL",
    "VIRTUAL_RESOLUTION_NS",
    "VIRTUAL_STEP_NS",
    "VirtualClock",
    "bindings",
    "file_clock",
    "resources",
    "setup",
]

VIRTUAL_STEP_NS = 1_000
"""How far a virtual clock moves on every reading, whatever the guest did in between."""
NS_PER_FUEL = 1
"""Virtual nanoseconds per unit of fuel (about one wasm instruction)."""
VIRTUAL_RESOLUTION_NS = 1_000
"""The resolution reported by the fixed and virtual clocks."""
_U64_MAX = (1 << 64) - 1
_STATE: Slot[_ClockState] = Slot("wasi.clocks")
_monotonic_ns = time.monotonic_ns
_time_ns = time.time_ns


class VirtualClock:
    """Monotonic nanoseconds that move only when read or waited on."""

    def __init__(self) -> None:
        self.now_ns = 0
        self._last_fuel: int | None = None

    def tick(self, store: wasmtime.Store | None) -> int:
        """Advance for one reading (by the step and the fuel burned) and return the time."""
        burned = 0
        if store is not None:
            try:
                fuel = store.get_fuel()
            except wasmtime.WasmtimeError:
                fuel = None
            if fuel is not None:
                if self._last_fuel is not None and fuel <= self._last_fuel:
                    burned = self._last_fuel - fuel
                self._last_fuel = fuel
        self.now_ns = min(_U64_MAX, self.now_ns + VIRTUAL_STEP_NS + burned * NS_PER_FUEL)
        return self.now_ns

    def advance_to(self, when: int) -> None:
        """Jump forward to ``when`` (never back)."""
        self.now_ns = max(self.now_ns, min(_U64_MAX, when))


class _VirtualDeadline(VirtualPollable):
    def __init__(self, clock: VirtualClock, deadline: int) -> None:
        self.clock = clock
        self.deadline = deadline

    def ready(self) -> bool:
        return self.clock.now_ns >= self.deadline

    def virtual_wait(self) -> int:
        return max(0, self.deadline - self.clock.now_ns)

    def fire(self) -> None:
        self.clock.advance_to(self.deadline)


class _FixedDeadline(VirtualPollable):
    """Time never passes on a fixed clock; a wait ends once the guest blocks on it."""

    def __init__(self, deadline: int) -> None:
        self.deadline = deadline
        self.fired = deadline <= 0

    def ready(self) -> bool:
        return self.fired

    def virtual_wait(self) -> int:
        return 0 if self.fired else self.deadline

    def fire(self) -> None:
        self.fired = True


class _RealDeadline(Pollable):
    def __init__(self, deadline: int) -> None:
        self.deadline = deadline

    def ready(self) -> bool:
        return time.monotonic_ns() >= self.deadline

    def wait_seconds(self) -> float:
        return max(0, self.deadline - time.monotonic_ns()) / 1e9


@dataclass(frozen=True, slots=True)
class _ClockState:
    policy: Policy
    virtual: VirtualClock
    real: bool = False
    """The policy's clock is ``real`` (asked once, not at every reading)."""
    store: wasmtime.Store | None = None
    """The instance's store (its fuel moves a virtual clock)."""


def _state(ctx: GuestContext) -> _ClockState:
    return ctx.slot(_STATE)


def resources() -> list[ResourceKind]:
    """None of its own: pollables are wasi:io's."""
    return []


def setup(ctx: GuestContext, policy: Policy) -> None:
    """A virtual clock at 0 for this instance (kept if another module already made it)."""
    _clock_state(ctx, policy)


def _clock_state(ctx: GuestContext, policy: Policy) -> _ClockState:
    state = ctx.find(_STATE)
    if state is None:
        state = _ClockState(policy, VirtualClock(), real=policy.clock == "real", store=ctx.store)
        ctx.put(_STATE, state)
    return state


def file_clock(ctx: GuestContext, policy: Policy) -> Callable[[], int]:
    """Wall-clock nanoseconds for file timestamps, on the instance's one guest clock.

    ``real``: the host's time. ``fixed``: ``clock_start``. ``virtual``: ``clock_start`` plus the
    virtual clock as the guest last saw it. A timestamp reads the clock without moving it: a
    write must not change what the guest's next ``now`` returns, so a replay sees the same times.
    """
    if policy.clock == "real":
        return time.time_ns
    start = policy.clock_start
    if policy.clock == "fixed":
        return lambda: start
    virtual = _clock_state(ctx, policy).virtual
    return lambda: start + virtual.now_ns


def _monotonic_now(ctx: GuestContext) -> int:
    state = ctx.slot(_STATE)
    if state.real:
        return _monotonic_ns()
    mode = state.policy.clock
    if mode == "fixed":
        return 0
    return state.virtual.tick(ctx.store)


def _monotonic_direct(state: _ClockState) -> int:
    """``_monotonic_now`` on the instance's state (the gate's fused frame calls it)."""
    if state.real:
        return _monotonic_ns()
    if state.policy.clock == "fixed":
        return 0
    return state.virtual.tick(state.store)


def _monotonic_resolution(ctx: GuestContext) -> int:
    return 1 if _state(ctx).policy.clock == "real" else VIRTUAL_RESOLUTION_NS


def _deadline_pollable(ctx: GuestContext, deadline: int) -> Any:
    state = _state(ctx)
    mode = state.policy.clock
    pollable: Pollable
    if mode == "real":
        pollable = _RealDeadline(deadline)
    elif mode == "fixed":
        pollable = _FixedDeadline(deadline)
    else:
        pollable = _VirtualDeadline(state.virtual, deadline)
    return ctx.new(POLLABLE, pollable)


def _current(ctx: GuestContext) -> int:
    """Monotonic time without advancing a virtual clock (subscribing is not reading)."""
    state = _state(ctx)
    mode = state.policy.clock
    if mode == "real":
        return time.monotonic_ns()
    if mode == "fixed":
        return 0
    return state.virtual.now_ns


def _subscribe_instant(ctx: GuestContext, when: int) -> Any:
    return _deadline_pollable(ctx, when)


def _subscribe_duration(ctx: GuestContext, duration: int) -> Any:
    return _deadline_pollable(ctx, min(_U64_MAX, _current(ctx) + duration))


def _datetime(ns: int) -> dict[str, int]:
    seconds, nanoseconds = divmod(max(0, ns), 1_000_000_000)
    return {"seconds": seconds, "nanoseconds": nanoseconds}


def _wall_now(ctx: GuestContext) -> dict[str, int]:
    state = ctx.slot(_STATE)
    if state.real:
        ns = _time_ns()
        if ns >= 0:
            seconds, nanoseconds = divmod(ns, 1_000_000_000)
            return {"seconds": seconds, "nanoseconds": nanoseconds}
        return _datetime(ns)
    mode = state.policy.clock
    if mode == "fixed":
        return _datetime(state.policy.clock_start)
    return _datetime(state.policy.clock_start + state.virtual.tick(ctx.store))


def _wall_direct(state: _ClockState) -> tuple[int, int]:
    """``_wall_now`` on the instance's state, as (seconds, nanoseconds)."""
    if state.real:
        ns = _time_ns()
        if ns >= 0:
            return ns // 1_000_000_000, ns % 1_000_000_000
        return 0, 0
    if state.policy.clock == "fixed":
        return divmod(max(0, state.policy.clock_start), 1_000_000_000)
    ns = state.policy.clock_start + state.virtual.tick(state.store)
    return divmod(max(0, ns), 1_000_000_000)


def _wall_resolution(ctx: GuestContext) -> dict[str, int]:
    return _datetime(_monotonic_resolution(ctx))


def bindings() -> list[Binding]:
    """Every function of wasi:clocks/monotonic-clock and wall-clock 0.2."""
    mono = "wasi:clocks/monotonic-clock"
    wall = "wasi:clocks/wall-clock"
    return [
        Binding(mono, "now", _monotonic_now, Direct(_STATE, _monotonic_direct)),
        Binding(mono, "resolution", _monotonic_resolution),
        Binding(mono, "subscribe-instant", _subscribe_instant),
        Binding(mono, "subscribe-duration", _subscribe_duration),
        Binding(wall, "now", _wall_now, Direct(_STATE, _wall_direct)),
        Binding(wall, "resolution", _wall_resolution),
    ]
