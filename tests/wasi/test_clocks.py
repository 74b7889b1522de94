"""wasi:clocks: real, fixed and virtual clocks, and their pollables."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from mighty.wasi import _clocks
from mighty.wasi._policy import Policy
from tests.wasi import call, make_ctx, obj


def _returns_within(seconds: float, work: Callable[[], object]) -> bool:
    """Whether ``work`` returned within ``seconds`` (run on a daemon thread that is left behind
    if not): a bound far from both outcomes, not a guess at how fast the machine is."""
    done = threading.Event()

    def run() -> None:
        work()
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(seconds)


M = "wasi:clocks/monotonic-clock"
W = "wasi:clocks/wall-clock"
P = "wasi:io/poll"
U64_MAX = (1 << 64) - 1
START = 1_700_000_000 * 10**9 + 123


def test_real_clocks_follow_the_host() -> None:
    """The real clocks read the host's monotonic and wall clocks at 1 ns resolution."""
    ctx = make_ctx()
    before = time.monotonic_ns()
    assert before <= call(ctx, M, "now") <= time.monotonic_ns()
    wall = call(ctx, W, "now")
    assert abs(wall["seconds"] - time.time()) < 5
    assert 0 <= wall["nanoseconds"] < 10**9
    assert call(ctx, M, "resolution") == 1
    assert call(ctx, W, "resolution") == {"seconds": 0, "nanoseconds": 1}


def test_real_sleep_sleeps() -> None:
    """A real-clock pollable for 20 ms becomes ready after about 20 ms."""
    ctx = make_ctx()
    pollable = obj(ctx, call(ctx, M, "subscribe-duration", 20_000_000))
    started = time.monotonic()
    assert call(ctx, P, "[method]pollable.ready", pollable) is False
    call(ctx, P, "[method]pollable.block", pollable)
    assert time.monotonic() - started >= 0.015
    assert call(ctx, P, "[method]pollable.ready", obj(ctx, call(ctx, M, "subscribe-instant", 0)))


def test_fixed_clock_never_moves() -> None:
    """A fixed clock always reads 0 and clock_start; sleeping on it returns at once."""
    ctx = make_ctx(Policy().with_clock("fixed", START))
    assert [call(ctx, M, "now") for _ in range(3)] == [0, 0, 0]
    assert call(ctx, W, "now") == {"seconds": START // 10**9, "nanoseconds": 123}
    assert call(ctx, W, "now") == call(ctx, W, "now")
    assert call(ctx, M, "resolution") == _clocks.VIRTUAL_RESOLUTION_NS
    pollable = obj(ctx, call(ctx, M, "subscribe-duration", 10**12))
    assert call(ctx, P, "[method]pollable.ready", pollable) is False
    # A real sleep would take the 1,000 s asked for: a tenth of that tells the two apart on
    # any machine, however loaded.
    assert _returns_within(100, lambda: call(ctx, P, "[method]pollable.block", pollable))
    assert call(ctx, P, "[method]pollable.ready", pollable) is True
    assert call(ctx, M, "now") == 0


def test_virtual_clock_steps_deterministically() -> None:
    """A virtual clock starts at 0 and advances by the fixed step per reading (no fuel burned)."""
    ctx = make_ctx(Policy().with_clock("virtual", START))
    readings = [call(ctx, M, "now") for _ in range(3)]
    step = _clocks.VIRTUAL_STEP_NS
    assert readings == [step, 2 * step, 3 * step]
    wall = call(ctx, W, "now")
    assert wall == {"seconds": START // 10**9, "nanoseconds": 123 + 4 * step}
    again = make_ctx(Policy().with_clock("virtual", START))
    assert [call(again, M, "now") for _ in range(3)] == readings


def test_virtual_clock_counts_fuel() -> None:
    """Fuel burned between readings advances the virtual clock; a fuel re-arm counts as none."""
    ctx = make_ctx(Policy().with_clock("virtual"))
    ctx.store.set_fuel(1000)
    first = call(ctx, M, "now")
    ctx.store.set_fuel(900)  # as if the guest burned 100 units
    second = call(ctx, M, "now")
    assert second - first == _clocks.VIRTUAL_STEP_NS + 100 * _clocks.NS_PER_FUEL
    ctx.store.set_fuel(10_000)  # the next call's budget
    assert call(ctx, M, "now") - second == _clocks.VIRTUAL_STEP_NS


def test_virtual_sleep_moves_time_not_the_host() -> None:
    """Blocking on a virtual pollable jumps the clock to its deadline without sleeping."""
    ctx = make_ctx(Policy().with_clock("virtual"))
    start = call(ctx, M, "now")
    hour = 3600 * 10**9
    pollable = obj(ctx, call(ctx, M, "subscribe-duration", hour))
    got: list[object] = []
    # A real sleep would take the hour: a tenth of it tells the two apart, however loaded.
    assert _returns_within(360, lambda: got.append(call(ctx, P, "poll", [pollable])))
    assert got == [[0]]
    assert call(ctx, M, "now") >= start + hour


def test_virtual_poll_fires_only_the_earliest() -> None:
    """Polling two virtual sleeps wakes the earlier one only."""
    ctx = make_ctx(Policy().with_clock("virtual"))
    late = obj(ctx, call(ctx, M, "subscribe-duration", 2 * 10**9))
    early = obj(ctx, call(ctx, M, "subscribe-duration", 10**9))
    assert call(ctx, P, "poll", [late, early]) == [1]
    assert call(ctx, P, "poll", [late, early]) == [1]  # early is ready: nothing else moves
    call(ctx, P, "[method]pollable.block", late)
    assert call(ctx, P, "poll", [late, early]) == [0, 1]


def test_huge_durations_saturate() -> None:
    """subscribe-duration(2**64-1) saturates at u64 max instead of overflowing."""
    ctx = make_ctx(Policy().with_clock("virtual"))
    call(ctx, M, "now")
    pollable = obj(ctx, call(ctx, M, "subscribe-duration", U64_MAX))
    call(ctx, P, "[method]pollable.block", pollable)
    assert call(ctx, M, "now") == U64_MAX
