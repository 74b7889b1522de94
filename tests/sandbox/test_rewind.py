"""Rewound instances: after a run the pool rewinds its instance to the warmed state and serves
the next run with it; that run sees nothing of the last, and an instance that cannot be made
as fresh is closed instead (see ``mighty.sandbox._pool._Pool``)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mighty.engine import Component
from mighty.sandbox import Limits, RunResult, Sandbox
from mighty.sandbox import _pool as sandbox_pool
from mighty.wasi import MemoryDir


def _ready(box: Sandbox) -> None:
    """Wait until the pool's rewind target is taken and one instance waits, made from the
    state or rewound."""
    pool = box._pool
    deadline = time.monotonic() + 120
    while pool._rewind_to is None or box.pool_ready < 1:
        assert time.monotonic() < deadline, "the pool never settled"
        assert not pool._failed, "the pool failed to make instances"
        time.sleep(0.01)


def _start(box: Sandbox) -> None:
    """Use up the instance warmed in full (it is not made from the state: closed after its
    run), then wait for one made from the state."""
    deadline = time.monotonic() + 120
    while box.pool_ready < 1:
        assert time.monotonic() < deadline, "the pool never made its first instance"
        time.sleep(0.01)
    assert box.run("None").ok
    _ready(box)


def _served(box: Sandbox, code: str) -> tuple[RunResult, bool]:
    """Run ``code`` on the next ready instance; whether that instance came back rewound."""
    _ready(box)
    before = box._pool.rewinds
    result = box.run(code)
    _ready(box)
    return result, box._pool.rewinds > before


@pytest.fixture
def box(interpreter: Component) -> Sandbox:
    with Sandbox(pool=1) as sandbox:
        _start(sandbox)
        yield sandbox


_CHANGES = [
    ("marker = 41", "'marker' not in globals()"),
    ("import json\njson.marker = 1", "import json\nnot hasattr(json, 'marker')"),
    ("import sys\nsys.modules['planted'] = sys", "import sys\n'planted' not in sys.modules"),
    ("import builtins\nbuiltins.len = lambda x: 7", "len([1, 2]) == 2"),
    ("import os\nos.environ['PLANTED'] = '1'", "import os\n'PLANTED' not in os.environ"),
    ("import sys\nsys.setrecursionlimit(50)", "import sys\nsys.getrecursionlimit() > 50"),
    ("import gc\ngc.disable()", "import gc\ngc.isenabled()"),
    ("import sys\nsys.stdout = None", "import sys\nsys.stdout is not None"),
    ("print('x' * 5000)\nimport sys\nsys.stderr.write('e')", "True"),
    ("raise ValueError('the run fails, the interpreter lives')", "True"),
    (
        "import random\nrandom.seed(7)",
        "import random\nrandom.random() != random.Random(7).random()",
    ),
    ("junk = [bytes(1000) for _ in range(2000)]\ndel junk", "True"),
]


@pytest.mark.parametrize(("change", "check"), _CHANGES, ids=[c[0][:30] for c in _CHANGES])
def test_a_change_is_invisible_to_the_next_run_on_the_rewound_instance(
    box: Sandbox, change: str, check: str
) -> None:
    """The run after a change runs on the same instance, rewound, and sees none of it."""
    fresh, _ = _served(box, "True")
    _changed, rewound = _served(box, change)
    assert rewound, "the instance was closed, not rewound"
    after, _ = _served(box, check)
    assert after.ok, after.error
    assert after.value is True
    assert after.stdout == "" and after.stderr == ""
    assert after.usage.memory_peak == fresh.usage.memory_peak


def test_random_and_urandom_differ_on_every_rewound_run(box: Sandbox) -> None:
    """Each rewind reseeds: no two runs on one instance share a ``random`` sequence."""
    code = "import random, os\nresult = [random.random(), os.urandom(8).hex()]"
    values = []
    for _ in range(6):
        result, rewound = _served(box, code)
        assert rewound
        values.append(result.value)
    for column in zip(*values, strict=True):
        assert len(set(column)) == len(column)


_NOT_REWOUND = [
    # The memory grew: its size cannot go back.
    "keep = bytearray(40_000_000)",
    # The guest was given a resource (a pollable): the handle table is not as fresh. time.sleep
    # makes the adapter subscribe one whatever the clock says; `await asyncio.sleep(0.001)` did
    # not when its timer was already due as the loop looked (a loaded machine: CI saw it rewound).
    "import time\ntime.sleep(0)",
    # A trap: the interpreter is gone.
    "import os\nos._exit(3)",
]


@pytest.mark.parametrize("code", _NOT_REWOUND, ids=["grew", "resource", "trap"])
def test_an_instance_that_cannot_be_made_fresh_is_closed(box: Sandbox, code: str) -> None:
    """Grown memory, a resource given, a trap: the instance is replaced, and the next run is
    as fresh as ever."""
    _result, rewound = _served(box, code)
    assert not rewound
    after, rewound_after = _served(box, "import sys\nresult = 'planted' not in sys.modules")
    assert after.value is True
    assert rewound_after


def test_a_sandbox_with_files_never_rewinds(interpreter: Component) -> None:
    """A ``MemoryDir`` is the instance's own: a rewound one would keep what a run wrote."""
    with Sandbox(pool=1, files=[MemoryDir("/mem", {"a.txt": b"seed"})]) as box:
        for _ in range(3):
            assert box.run("open('/mem/a.txt', 'w').write('changed')").ok
        deadline = time.monotonic() + 120
        while box.pool_ready < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert box.run("open('/mem/a.txt').read()").value == "seed"
        assert box._pool.rewinds == 0


def test_a_tool_still_running_keeps_its_instance_from_being_rewound(
    interpreter: Component,
) -> None:
    """A sync tool left behind at its timeout still holds a thread: the instance is closed."""
    release = threading.Event()

    def stuck() -> str:
        release.wait(60)
        return "late"

    limits = Limits(tool_timeout=0.05)
    with Sandbox(tools=[stuck], pool=1, limits=limits) as box:
        _start(box)
        try:
            result, rewound = _served(box, "try:\n    stuck()\nexcept Exception:\n    pass")
        finally:
            release.set()
        assert result.ok, result.error
        assert not rewound
        _result, rewound = _served(box, "None")
        assert rewound


def test_async_call_handles_count_from_the_start_on_a_rewound_instance(
    interpreter: Component,
) -> None:
    """A run cannot tell from its tool calls' handles how many calls earlier runs made."""

    async def echo(x: int) -> int:
        return x

    code = "import asyncio\nresult = await asyncio.gather(*(echo(i) for i in range(5)))"
    with Sandbox(tools=[echo], pool=1) as box:
        _start(box)
        for _ in range(3):
            result, _rewound = _served(box, code)
            assert result.value == [0, 1, 2, 3, 4]
            live = box._pool._ready[-1]
            assert live.host._handles == 0


def test_an_instance_is_replaced_after_its_last_life(
    interpreter: Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its last life (``_MAX_LIVES`` runs here) an instance is closed and a new one made."""
    monkeypatch.setattr(sandbox_pool, "_MAX_LIVES", 3)
    monkeypatch.setattr(sandbox_pool, "_stagger", _NoStagger())
    with Sandbox(pool=1) as box:
        _start(box)
        outcomes = [_served(box, "None")[1] for _ in range(7)]
    # The first instance made from the state was rewound twice by the pool's one-time check.
    assert outcomes == [False, True, True, False, True, True, False]


class _NoStagger:
    """Every instance gets exactly ``_MAX_LIVES`` lives."""

    def randrange(self, _stop: int) -> int:
        return 0


def test_a_pools_instances_retire_at_different_runs(interpreter: Component) -> None:
    """Each instance's life limit is drawn in [_MAX_LIVES, 2 * _MAX_LIVES): a pool's instances,
    serving turn about, do not all need replacing at once."""
    with Sandbox(pool=4) as box:
        _start(box)
        for _ in range(8):
            box.run("result = 1")
        deadline = time.monotonic() + 120
        while box.pool_ready < 4:
            assert time.monotonic() < deadline, "the pool never filled"
            time.sleep(0.01)
        limits = [live.max_lives for live in box._pool._ready]
    assert all(sandbox_pool._MAX_LIVES <= limit < 2 * sandbox_pool._MAX_LIVES for limit in limits)
    assert len(set(limits)) > 1  # four draws from 10,000 values all equal: ~1e-12


def test_a_run_waits_for_the_instance_being_rewound(
    interpreter: Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that finds none ready while one is being rewound takes that one, not a new one."""
    monkeypatch.setattr(sandbox_pool, "_TAKE_WAIT", 600.0)  # as long as the rewind takes
    with Sandbox(pool=1) as box:
        _start(box)
        made, rewinds = box._pool.made_by_callers, box._pool.rewinds
        for n in range(12):  # back to back: each run's instance is still being rewound
            assert box.run(f"result = {n}").value == n
        assert box._pool.made_by_callers == made
        assert box._pool.rewinds - rewinds >= 11


def _released_on(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads that hand instances back to ``box``'s pool, as they do."""
    threads: list[str] = []
    release = sandbox_pool._Pool.release

    def spy(pool: sandbox_pool._Pool, live: sandbox_pool._Live) -> None:
        threads.append(threading.current_thread().name)
        release(pool, live)

    monkeypatch.setattr(sandbox_pool._Pool, "release", spy)
    return threads


def test_run_async_hands_its_instance_back_from_the_awaiting_task(
    interpreter: Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run_async`` gives its instance back once the awaiting task has woken, on the loop's
    thread (released on the worker, its rewind held up the task's wake-up), and it is rewound."""
    with Sandbox(pool=1) as box:
        _start(box)
        threads = _released_on(box, monkeypatch)
        rewinds = box._pool.rewinds

        async def main() -> tuple[int, int]:
            result = await box.run_async("result = 7")
            return result.value, box._pool._out

        assert asyncio.run(main()) == (7, 0)
        assert threads == [threading.main_thread().name]
        _ready(box)
        assert box._pool.rewinds == rewinds + 1
        assert box.run("result = 8").value == 8  # the sync path releases on its own thread
        assert threads[1] == threading.main_thread().name


def test_run_async_gives_its_instance_back_when_cancelled_or_abandoned(
    interpreter: Component, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its run waits in a tool, or its coroutine closed before the run ends
    (as when a loop is torn down): the instance still goes back to the pool, none leaks."""
    entered = threading.Event()
    go = threading.Event()

    def gate() -> str:
        entered.set()
        go.wait(60)
        return "through"

    with Sandbox(tools=[gate], pool=1) as box:
        _start(box)
        threads = _released_on(box, monkeypatch)

        async def cancelled() -> int:
            task = asyncio.ensure_future(box.run_async("gate()"))
            await asyncio.to_thread(entered.wait, 60)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return box._pool._out

        try:
            assert asyncio.run(cancelled()) == 0
        finally:
            go.set()
        assert threads == [threading.main_thread().name]

        entered.clear()
        go.clear()
        _ready(box)

        async def abandoned() -> None:
            coro = box.run_async("gate()")
            coro.send(None)  # the run is on its worker; the coroutine waits for it
            await asyncio.to_thread(entered.wait, 60)
            coro.close()  # gone before the run ended: the worker gives the instance back

        loop = asyncio.new_event_loop()  # not asyncio.run: it would wait for the worker
        try:
            loop.run_until_complete(abandoned())
        finally:
            loop.close()
        assert box._pool._out == 1
        go.set()
        deadline = time.monotonic() + 60
        while box._pool._out:
            assert time.monotonic() < deadline, "the abandoned run's instance never came back"
            time.sleep(0.01)
        assert len(threads) == 2 and threads[1] != threading.main_thread().name
        assert box.run("result = 9").value == 9


_PROGRAMS = st.sampled_from([change for change, _check in _CHANGES] + _NOT_REWOUND[:2])
_PROBE = (
    "import sys, json, builtins, os, gc\n"
    "result = ['planted' not in sys.modules, 'marker' not in globals(),\n"
    "  not hasattr(json, 'marker'), len([1]) == 1, 'PLANTED' not in os.environ,\n"
    "  gc.isenabled(), sys.stdout is not None, sys.getrecursionlimit() > 50]"
)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(programs=st.lists(_PROGRAMS, min_size=1, max_size=6))
def test_any_sequence_of_runs_leaves_the_next_probe_fresh(
    box: Sandbox, programs: list[str]
) -> None:
    """Whatever runs came before on the pool's instances, rewound or replaced, a probe finds
    a pristine interpreter."""
    for program in programs:
        _served(box, program)
        probe, _ = _served(box, _PROBE)
        assert probe.value == [True] * 8, (program, probe.error)
