"""Async tools: awaitable calls run concurrently on the host, bounded, cancelled, replayed."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from mighty.budget import CallScope
from mighty.sandbox import CancelScope, Limits, Sandbox, Tool, _tools
from mighty.sandbox._tools import MAX_RUN_THREADS, ToolHost, tools_from
from mighty.trace import ReplayEvent, replay_trace
from tests.sandbox._helpers import assert_clean, failed

pytestmark = pytest.mark.slow

N = 10


class Meeting:
    """N tool calls that can only all return if all N are in flight at the same time."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(N, timeout=10)
        self.arrived = 0
        self.lock = threading.Lock()
        self.event: asyncio.Event | None = None

    def sync_meet(self, i: int) -> int:
        self.barrier.wait()
        return i * 2

    async def async_meet(self, i: int) -> int:
        if self.event is None:
            self.event = asyncio.Event()
        with self.lock:
            self.arrived += 1
            if self.arrived == N:
                self.event.set()
        await asyncio.wait_for(self.event.wait(), 10)
        return i * 3


class Gauge:
    """Counts how many calls of a tool are in flight, and the most at once.

    With ``fill``, each call also waits until ``fill`` calls have been in flight at once (or 10 s
    have passed since the first call began, for all calls together), so that the most reached
    does not depend on how fast a loaded machine starts them; a bound that lets more run is
    still seen (``most`` counts every one that started).
    """

    def __init__(self, fill: int = 0) -> None:
        self.now = 0
        self.most = 0
        self.fill = fill
        self.until: float | None = None
        self.lock = threading.Lock()

    async def work(self, i: int, delay: float = 0.005) -> int:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            if self.until is None:
                self.until = time.monotonic() + 10.0
            until = self.until
        try:
            await asyncio.sleep(delay)
            while self.most < self.fill and time.monotonic() < until:
                await asyncio.sleep(0.001)
        finally:
            with self.lock:
                self.now -= 1
        return i


def double(x: int) -> int:
    """A sync tool."""
    return x * 2


async def triple(x: int) -> int:
    """An async tool."""
    await asyncio.sleep(0)
    return x * 3


async def broken(x: int) -> int:
    """Fails."""
    raise KeyError(f"no {x}")


@pytest.fixture(scope="module")
def box(interpreter: object) -> Iterator[Sandbox]:
    with Sandbox(tools=[double, triple, broken], pool=2) as sandbox:
        yield sandbox


def test_every_tool_is_callable_both_ways(box: Sandbox) -> None:
    """Sync and async tools return their result when called, and are awaitable in async code."""
    sync = box.run("[double(x=2), triple(x=2)]")
    assert sync.ok, sync.error
    assert sync.value == [4, 6]
    awaited = box.run("[await double(x=2), await triple(x=2)]")
    assert awaited.ok, awaited.error
    assert awaited.value == [4, 6]
    assert awaited.usage.tool_calls == 2


def test_gather_create_task_and_fire_then_await(box: Sandbox) -> None:
    """gather, create_task, coroutines and fire-then-await all work and keep their order."""
    code = (
        "import asyncio\n"
        "a = triple(x=1)\n"
        "b = double(x=1)\n"
        "t = asyncio.create_task(triple(x=5))\n"
        "g = await asyncio.gather(*[double(x=i) for i in range(5)])\n"
        "async def main():\n"
        "    return await asyncio.gather(triple(x=7), double(x=7))\n"
        "[await b, await a, await t, g, await main()]"
    )
    result = box.run(code)
    assert result.ok, result.error
    assert result.value == [2, 3, 15, [0, 2, 4, 6, 8], [21, 14]]
    assert result.usage.tool_calls == 10


def test_async_code_inside_asyncio_run_without_top_level_await(box: Sandbox) -> None:
    """Code that only calls asyncio.run (no top-level await) gets the tool loop too."""
    code = (
        "import asyncio\n"
        "async def main():\n"
        "    async def one(i):\n"
        "        return await triple(x=i)\n"
        "    return [r async for r in agen()] + [await one(2)]\n"
        "async def agen():\n"
        "    for i in range(2):\n"
        "        yield await double(x=i)\n"
        "result = asyncio.run(main())"
    )
    result = box.run(code)
    assert result.ok, result.error
    assert result.value == [0, 2, 6]


def test_tool_errors_are_catchable_and_gather_reports_them(box: Sandbox) -> None:
    """A failing async call raises ToolError at its await; gather can collect it."""
    code = (
        "import asyncio\n"
        "out = await asyncio.gather(broken(x=1), triple(x=1), return_exceptions=True)\n"
        "[[type(e).__name__, e.kind] if isinstance(e, ToolError) else e for e in out]"
    )
    result = box.run(code)
    assert result.ok, result.error
    assert result.value == [["ToolError", "KeyError"], 3]
    uncaught = failed(box.run("await broken(x=2)"), "tool_error")
    assert uncaught.error is not None
    assert "no 2" in uncaught.error.message
    bad = box.run("try:\n    await double(x='nope')\nexcept ToolError as e:\n    r = e.kind\nr")
    assert bad.ok, bad.error
    assert bad.value == "invalid_arguments"


def test_sync_and_async_calls_really_run_at_once(interpreter: object) -> None:
    """N sync and N async calls that only return when all N are in flight at once succeed."""
    meeting = Meeting()
    tools = {"sync_meet": meeting.sync_meet, "async_meet": meeting.async_meet}
    with Sandbox(tools=tools, pool=0) as sandbox:
        code = (
            "import asyncio\n"
            f"a = await asyncio.gather(*[sync_meet(i=i) for i in range({N})])\n"
            f"b = await asyncio.gather(*[async_meet(i=i) for i in range({N})])\n"
            "[a, b]"
        )
        result = sandbox.run(code)
    assert result.ok, result.error
    assert result.value == [[i * 2 for i in range(N)], [i * 3 for i in range(N)]]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit=st.integers(1, 6), calls=st.integers(0, 24))
def test_concurrency_is_bounded_and_results_keep_order(
    interpreter: object, limit: int, calls: int
) -> None:
    """However many calls the code fires, at most tool_concurrency run at once; all complete."""
    gauge = Gauge(fill=min(limit, calls))
    with Sandbox(tools={"work": gauge.work}, limits=Limits(tool_concurrency=limit), pool=0) as sb:
        result = sb.run(
            f"import asyncio\nawait asyncio.gather(*[work(i=i) for i in range({calls})])"
        )
    assert result.ok, result.error
    assert result.value == list(range(calls))
    assert gauge.most <= limit
    assert gauge.most == min(limit, calls)
    assert gauge.now == 0


def test_thousands_of_calls_are_bounded(interpreter: object) -> None:
    """Thousands of fired calls complete within tool_calls; one more is a tool_limit."""
    gauge = Gauge()
    limits = Limits(tool_calls=2000, tool_concurrency=32)
    with Sandbox(tools={"work": gauge.work}, limits=limits, pool=0) as sandbox:
        code = "import asyncio\nsum(await asyncio.gather(*[work(i=i, delay=0) for i in range({})]))"
        result = sandbox.run(code.format(2000))
        assert result.ok, result.error
        assert result.value == sum(range(2000))
        assert gauge.most <= 32
        over = failed(sandbox.run(code.format(2001)), "tool_limit")
        assert over.usage.tool_calls == 2000
        assert_clean(sandbox)


def test_a_hung_coroutine_is_cancelled_at_its_timeout(interpreter: object) -> None:
    """A tool coroutine that never finishes is a timeout for the code and is cancelled."""
    seen: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    with Sandbox(tools=[Tool(forever, timeout=0.2), triple], pool=0) as sandbox:
        code = (
            "import asyncio\n"
            "r = await asyncio.gather(forever(), triple(x=1), return_exceptions=True)\n"
            "[r[0].kind, r[1]]"
        )
        result = sandbox.run(code)
    assert result.ok, result.error
    assert result.value == ["timeout", 3]
    assert seen == ["cancelled"]


@pytest.mark.timing
def test_calls_left_in_flight_are_cancelled_when_the_run_ends(interpreter: object) -> None:
    """A call the code fired and never awaited is cancelled when the run returns or fails."""
    cancelled = {"returned": threading.Event(), "spun": threading.Event()}
    started = threading.Event()

    async def forever(tag: str) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled[tag].set()
            raise

    async def until_started() -> None:
        # The code waits on this rather than sleeping 0.05 s, which a loaded machine's tool
        # loop may take before the fired call has even begun; bounded by the tool's timeout.
        while not started.is_set():
            await asyncio.sleep(0.001)

    tools = [forever, until_started]
    with Sandbox(tools=tools, pool=0) as sandbox:
        for tag, code, kind in [
            ("returned", "import asyncio\nforever(tag='returned')\nawait until_started()", ""),
            (
                "spun",
                "import asyncio\nforever(tag='spun')\nawait until_started()\nwhile 1: pass",
                "x",
            ),
        ]:
            started.clear()
            if kind:
                # Ended by its fuel (or, on a very slow machine, its 5 s deadline), not by a
                # 0.3 s deadline that a loaded machine could reach before the call was fired.
                failing = sandbox.limits.replace(fuel=2 * 10**9)
                with Sandbox(tools=tools, limits=failing, pool=0) as short:
                    result = short.run(code)
                assert result.error is not None
                assert result.error.kind in {"deadline_exceeded", "out_of_fuel"}
            else:
                result = sandbox.run(code)
                assert result.ok, result.error
            assert started.is_set()
            assert cancelled[tag].wait(60)


def test_guest_side_cancel_reaches_the_host(interpreter: object) -> None:
    """asyncio.wait_for giving up cancels the host's coroutine (the guest calls tools.cancel)."""
    seen: list[str] = []

    async def slow() -> int:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return 1

    with Sandbox(tools=[slow], pool=0) as sandbox:
        code = (
            "import asyncio\n"
            "try:\n"
            "    await asyncio.wait_for(slow(), 0.05)\n"
            "except TimeoutError:\n"
            "    r = 'gave up'\n"
            "await asyncio.sleep(0.05)\n"
            "r"
        )
        result = sandbox.run(code)
    assert result.ok, result.error
    assert result.value == "gave up"
    assert seen == ["cancelled"]


def test_cancelling_the_run_cancels_its_calls(interpreter: object) -> None:
    """A CancelScope cancelled while calls are in flight ends the run and cancels them."""
    scope = CancelScope()
    seen: list[str] = []

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    def stop() -> str:
        scope.cancel("enough")
        return "stopped"

    with Sandbox(tools=[forever, stop], pool=0) as sandbox:
        code = "import asyncio\nawait asyncio.gather(forever(), forever(), stop())"
        result = sandbox.run(code, cancel=scope)
    failed(result, "cancelled")
    for _ in range(200):
        if len(seen) == 2:
            break
        threading.Event().wait(0.01)
    assert seen == ["cancelled", "cancelled"]


def test_one_run_cannot_take_the_whole_sync_pool(interpreter: object) -> None:
    """Hung sync calls of one run hold at most MAX_RUN_THREADS threads; others still run."""
    release = threading.Event()

    def hang() -> str:
        release.wait(30)
        return "late"

    try:
        with Sandbox(tools=[Tool(hang, timeout=0.2), double], pool=0) as sandbox:
            code = (
                "import asyncio\n"
                f"r = await asyncio.gather(*[hang() for _ in range({MAX_RUN_THREADS + 4})],"
                " return_exceptions=True)\n"
                "[e.kind for e in r]"
            )
            result = sandbox.run(code)
            assert result.ok, result.error
            kinds = result.value
            assert kinds.count("timeout") == MAX_RUN_THREADS
            assert kinds.count("busy") == 4
            # Another run (of this or any sandbox) still gets a thread.
            other = sandbox.run("double(x=21)")
            assert other.ok, other.error
            assert other.value == 42
    finally:
        release.set()


@pytest.mark.timing
def test_what_waiting_calls_hold_is_bounded(
    interpreter: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls queued behind the concurrency limit hold at most MAX_HELD_DATA of arguments."""
    monkeypatch.setattr(_tools, "MAX_HELD_DATA", 2 << 20)  # the default is 32 MiB
    # The first call holds the only slot until the code has started all 15 calls (counted as
    # the host starts them), not for a guessed second: on a loaded machine the code took longer
    # than that to start them, the slot came free early and no call was refused.
    all_started = threading.Event()
    started = 0
    start = ToolHost.start

    def counting_start(self: ToolHost, name: str, payload: bytes) -> int:
        nonlocal started
        handle = start(self, name, payload)
        started += 1
        if started == 15:
            all_started.set()
        return handle

    monkeypatch.setattr(ToolHost, "start", counting_start)
    first: list[int] = []

    async def measure(text: str) -> int:
        if not first:  # the first call holds the only slot while the others queue behind it
            first.append(1)
            while not all_started.is_set():  # bounded by the call's tool_timeout
                await asyncio.sleep(0.001)
        return len(text)

    # Time is not the subject: the run's own deadline outlasts any slow start of the calls.
    limits = Limits(tool_concurrency=1, timeout=60.0)
    with Sandbox(tools=[measure], limits=limits, pool=0) as sandbox:
        code = (
            "import asyncio\n"
            "s = 'x' * 200_000\n"
            "r = await asyncio.gather(*[measure(text=s) for _ in range(15)], return_exceptions=True)\n"
            "[x if isinstance(x, int) else x.kind for x in r]"
        )
        result = sandbox.run(code)
    assert all_started.is_set()
    assert result.ok, result.error
    kinds = result.value
    held = (2 << 20) // 200_000
    assert kinds[: held - 1] == [200_000] * (held - 1)
    assert "busy" in kinds
    assert set(kinds) == {200_000, "busy"}


def _delivery(trace: Path) -> tuple[Any, list[Any]]:
    """The export's result and what each `wait` delivered, as the replay saw them."""
    waits: list[Any] = []
    exported: list[Any] = []

    def observe(event: ReplayEvent) -> None:
        if event.kind == "import" and event.function == "wait":
            waits.append(event.result)
        elif event.kind == "export":
            exported.append(event.result)

    replay_trace(trace, observer=observe)
    return exported, waits


def test_concurrent_calls_replay_exactly(interpreter: object, tmp_path: Path) -> None:
    """A run whose result depends on the order concurrent calls finished replays to it."""
    rng = random.Random(7)

    async def jittery(i: int) -> int:
        await asyncio.sleep(rng.random() * 0.02)
        return i

    def blocking(i: int) -> int:
        threading.Event().wait(rng.random() * 0.02)
        return -i

    trace = tmp_path / "concurrent.bin"
    code = (
        "import asyncio\n"
        "calls = [jittery(i=i) for i in range(8)] + [blocking(i=i) for i in range(1, 5)]\n"
        "[await c for c in asyncio.as_completed(calls)]"
    )
    with Sandbox(tools=[jittery, blocking], pool=0) as sandbox:
        result = sandbox.run(code, record=trace)
    assert result.ok, result.error
    assert sorted(result.value) == sorted([*range(8), *(-i for i in range(1, 5))])
    exported, waits = _delivery(trace)
    assert len(exported) == 1
    assert waits, "the run waited for its calls"
    delivered = [c["handle"] for batch in waits for c in batch]
    assert sorted(delivered) == list(range(1, 13))


def _tool_imports(trace: Path) -> list[str]:
    """The tool imports a recorded run made, in order (``call``, ``start``, ``wait``, ...)."""
    names: list[str] = []

    def observe(event: ReplayEvent) -> None:
        if event.kind == "import" and event.function in ("call", "start", "wait", "cancel"):
            names.append(event.function)

    replay_trace(trace, observer=observe)
    return names


_AWAITS = [
    # (code, result, starts): how many calls went the long way (`start`, then `wait`); every
    # other call was one `call` import. Awaited at once with nothing else to run: `call`.
    ("await triple(x=1)", 3, 0),
    ("total = 0\nfor i in range(3):\n    total = await triple(x=total + i)\ntotal", 15, 0),
    ("await (double(x=2))", 4, 0),
    ("f = triple\nawait f(*[2])", 6, 0),
    ("async def g(x):\n    return await triple(x=x)\nawait g(4)", 12, 0),
    ("await double(x=await triple(x=1))", 6, 0),
    ("try:\n    await broken(x=1)\nexcept ToolError as e:\n    r = e.kind\nr", "KeyError", 0),
    # Not awaited at once, or something else could run meanwhile: started, then waited for.
    ("a = triple(x=1)\nb = double(x=1)\n[await b, await a]", [2, 3], 2),
    ("import asyncio\nsum(await asyncio.gather(triple(x=1), double(x=1)))", 5, 2),
    ("import asyncio\nawait asyncio.wait_for(triple(x=3), 60)", 9, 1),
    ("import asyncio\nasync with asyncio.timeout(60):\n    r = await triple(x=1)\nr", 3, 1),
    (
        "import asyncio\nt = asyncio.create_task(double(x=5))\n[await triple(x=1), await t]",
        [3, 10],
        2,
    ),
    ("a = triple(x=1)\n[await double(x=2), await a]", [4, 3], 2),
]


@pytest.mark.parametrize(("code", "value", "starts"), _AWAITS)
def test_a_call_awaited_at_once_with_nothing_else_to_run_is_one_import(
    interpreter: object, tmp_path: Path, code: str, value: object, starts: int
) -> None:
    """``await tool()`` with no other call in flight, no ready callback and no timer is one
    ``call`` import (the loop would only sleep until it finished); any other use starts the call
    at once and waits for it, so fired calls still overlap. Both record and replay alike."""
    trace = tmp_path / "awaits.bin"
    with Sandbox(tools=[double, triple, broken], pool=0) as sandbox:
        result = sandbox.run(code, record=trace)
    assert result.ok, result.error
    assert result.value == value
    imports = _tool_imports(trace)
    assert imports.count("start") == starts
    assert imports.count("call") == result.usage.tool_calls - starts
    assert ("wait" in imports) == (starts > 0)
    replayed, _waits = _delivery(trace)
    assert len(replayed) == 1


def test_hostile_use_of_the_raw_protocol(box: Sandbox) -> None:
    """Raw start/wait/cancel with bad names or handles: not_allowed, or ignored."""
    raw = "from wit_world.imports import tools\n"
    failed(box.run(raw + "tools.start('os_system', b'{}')"), "not_allowed")
    ignored = box.run(raw + "tools.cancel(12345)\ntools.cancel(0)\nlen(tools.wait(0))")
    assert ignored.ok, ignored.error
    assert ignored.value == 0
    waited = box.run(
        raw + 'h = tools.start(\'double\', b\'{"args": [], "kwargs": {"x": 4}}\')\n'
        "out = []\n"
        "while not out:\n"
        "    out = tools.wait(None)\n"
        "[h, out[0].handle, bytes(out[0].outcome.value).decode()]"
    )
    assert waited.ok, waited.error
    assert waited.value == [1, 1, "8"]
    garbage = box.run(
        raw + "h = tools.start('double', b'{nope')\nout = tools.wait(None)\n"
        "out[0].outcome.value.kind"
    )
    assert garbage.ok, garbage.error
    assert garbage.value == "invalid_arguments"
    assert_clean(box)


def test_top_level_async_with_and_for(box: Sandbox) -> None:
    """async with and async for work at the top level of the code."""
    code = (
        "import contextlib\n"
        "@contextlib.asynccontextmanager\n"
        "async def ctx():\n"
        "    yield await triple(x=3)\n"
        "async def gen():\n"
        "    yield 1\n"
        "    yield await double(x=1)\n"
        "async with ctx() as v:\n"
        "    got = [v]\n"
        "async for item in gen():\n"
        "    got.append(item)\n"
        "got"
    )
    result = box.run(code)
    assert result.ok, result.error
    assert result.value == [9, 1, 2]


# -- the host's half of the protocol, as a state machine (no interpreter) -----------------------


class _Context:
    """What ToolHost.wait reads of a guest context: the call's scope (a minute, never cancelled)."""

    def __init__(self) -> None:
        self.scope = CallScope(60.0, None)


class StartedCalls(RuleBasedStateMachine):
    """start/finish/cancel/wait in any order: each finished call is delivered exactly once, in
    the order calls finished; no more than the limit run at once; queued calls start in order."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.events: dict[int, asyncio.Event] = {}
        self.running_now = 0
        self.cancelling: set[int] = set()  # cancelled, their coroutine not yet ended
        self.too_many: list[int] = []
        self.limit = 1
        self.host: ToolHost | None = None
        self.live: list[int] = []  # handles started, not finished or cancelled, in start order
        self.finished: list[int] = []  # in the order they finished
        self.delivered: list[int] = []

    async def _work(self, key: int) -> int:
        self.running_now += 1
        if self.running_now - len(self.cancelling) > self.limit:
            self.too_many.append(self.running_now)
        try:
            await self.events[key].wait()
        finally:
            self.running_now -= 1
            self.cancelling.discard(key)
        return key

    @initialize(limit=st.integers(1, 3))
    def setup(self, limit: int) -> None:
        self.limit = limit
        tools = tools_from({"work": self._work})
        self.host = ToolHost(
            tools, max_calls=1000, timeout=30, background_loop=lambda: self.loop, concurrency=limit
        )
        self.host.begin(None)

    def _launched(self) -> list[int]:
        return self.live[: self.limit]

    @rule()
    def start(self) -> None:
        assert self.host is not None
        key = len(self.events) + 1
        self.events[key] = asyncio.Event()
        handle = self.host.start("work", json.dumps({"args": [], "kwargs": {"key": key}}).encode())
        assert handle == key
        self.live.append(handle)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """A running call's tool returns; the next wait delivers it."""
        assert self.host is not None
        handle = data.draw(st.sampled_from(self._launched()))
        self._started(handle)
        self.loop.call_soon_threadsafe(self.events[handle].set)
        self.live.remove(handle)
        self.finished.append(handle)
        while handle not in self.delivered:
            self._wait(5_000_000_000)

    def _started(self, handle: int) -> None:
        """Wait until the call's coroutine runs (it was launched; the loop starts it soon)."""
        for _ in range(500):
            if self.running_now - len(self.cancelling) >= min(len(self.live), self.limit):
                return
            threading.Event().wait(0.002)

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        assert self.host is not None
        handle = data.draw(st.sampled_from(self.live))
        if handle in self._launched():
            self.cancelling.add(handle)
        self.host.cancel(handle)
        self.live.remove(handle)

    @rule()
    def poll(self) -> None:
        self._wait(0)

    def _wait(self, timeout_ns: int) -> None:
        assert self.host is not None
        for completion in self.host.wait(_Context(), timeout_ns):  # type: ignore[arg-type]
            self.delivered.append(completion["handle"])
            assert completion["outcome"].value == str(completion["handle"]).encode()

    @invariant()
    def delivered_once_in_finishing_order(self) -> None:
        assert self.delivered == self.finished[: len(self.delivered)]
        assert len(self.delivered) == len(set(self.delivered))

    @invariant()
    def bounded(self) -> None:
        """Calls in flight (cancelled ones aside, which end at their next await) <= the limit."""
        assert self.too_many == []
        if self.host is not None:
            assert self.host._running <= self.limit

    def teardown(self) -> None:
        if self.host is not None:
            self.host.end()
        for event in self.events.values():
            self.loop.call_soon_threadsafe(event.set)
        asyncio.run_coroutine_threadsafe(_drain(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


async def _drain() -> None:
    """Let every task of the loop end (those scheduled before this one included)."""
    await asyncio.sleep(0)
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if others:
        await asyncio.wait(others, timeout=5)


StartedCalls.TestCase.settings = settings(max_examples=25, stateful_step_count=15, deadline=None)
test_started_calls = StartedCalls.TestCase
