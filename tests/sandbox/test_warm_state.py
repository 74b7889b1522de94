"""The pool's warmed state: instances made from one captured memory share nothing they must not.

After its first instance, a pool makes every instance from that instance's memory as it was right
after warming (see ``mighty.sandbox._pool._Pool``). These tests wait until the state is taken and
check, for runs served by such instances, what the freshness tests of test_pool.py check plus
what a shared memory could leak: the ``random`` sequence, ``os.urandom``, files, modules, tools.
"""

from __future__ import annotations

import threading
import time

import pytest

from mighty.engine import Component
from mighty.sandbox import RunResult, Sandbox
from mighty.wasi import MemoryDir


def _settled(box: Sandbox, size: int) -> None:
    """Wait until the pool has its warmed state and ``size`` instances ready."""
    pool = box._pool
    deadline = time.monotonic() + 120
    while pool._warmed is None or box.pool_ready < size:
        assert time.monotonic() < deadline, "the pool never settled"
        assert not pool._failed, "the pool failed to make instances"
        time.sleep(0.01)


def _from_state(box: Sandbox, size: int, codes: list[str]) -> list[RunResult]:
    """Run each of ``codes``, each served by an instance made from the warmed state: the
    instances ready before (the first one, captured from, among them) are dropped unused."""
    _settled(box, size)
    pool = box._pool
    for _ in range(size):
        live = pool.take()
        if live is not None:
            pool.release(live)
    out = []
    for code in codes:
        _settled(box, size)
        out.append(box.run(code))
    return out


def test_the_pool_takes_a_warmed_state_and_serves_from_it(interpreter: Component) -> None:
    """A pool captures its warmed state once; runs from it work and report the same memory."""
    with Sandbox(pool=2) as box:
        _settled(box, 2)
        state = box._pool._warmed
        results = _from_state(box, 2, ["result = 6 * 7"] * 6)
        assert box._pool._warmed is state  # taken once, not per instance
        assert [r.value for r in results] == [42] * 6
        assert len({r.usage.memory_peak for r in results}) == 1


def test_random_and_urandom_differ_between_instances_from_the_state(
    interpreter: Component,
) -> None:
    """Each instance draws its own ``random`` state: the captured one is never replayed."""
    code = (
        "import random, os, secrets, uuid\n"
        "result = [random.random(), random.getrandbits(64), os.urandom(16).hex(), "
        "secrets.token_hex(8), str(uuid.uuid4())]"
    )
    with Sandbox(pool=2) as box:
        values = [r.value for r in _from_state(box, 2, [code] * 8)]
    for column in zip(*values, strict=True):
        assert len(set(column)) == len(column), column


_CHANGES = [
    ("marker = 41", "'marker' not in globals()"),
    ("import json\njson.marker = 1", "import json\nnot hasattr(json, 'marker')"),
    ("import sys\nsys.modules['planted'] = sys", "import sys\n'planted' not in sys.modules"),
    ("import csv\nimport sys\nsys.modules['csv'].x = 1", "import csv\nnot hasattr(csv, 'x')"),
    ("import builtins\nbuiltins.len = lambda x: 7", "len([1, 2]) == 2"),
    ("import os\nos.environ['PLANTED'] = '1'", "import os\n'PLANTED' not in os.environ"),
    (
        "import random\nrandom.seed(7)",
        "import random\nrandom.random() != random.Random(7).random()",
    ),
    ("import sys\nsys.stdout = None", "import sys\nsys.stdout is not None"),
    ("open('/mem/new.txt', 'w').write('x')", "import os\nsorted(os.listdir('/mem')) == ['a.txt']"),
    ("open('/mem/a.txt', 'w').write('changed')", "open('/mem/a.txt').read() == 'seed'"),
    ("keep = bytearray(b'\\xab') * 30_000_000", "True"),
]


@pytest.mark.parametrize(("change", "check"), _CHANGES, ids=[c[0][:30] for c in _CHANGES])
def test_a_change_in_one_run_is_invisible_in_the_next_from_the_state(
    interpreter: Component, change: str, check: str
) -> None:
    """Globals, modules, builtins, environment, random state, streams, files and memory of
    one run from the warmed state never reach the next run from it."""
    with Sandbox(pool=2, files=[MemoryDir("/mem", {"a.txt": b"seed"})]) as box:
        fresh, changed, after = _from_state(box, 2, ["True", change, check])
        assert fresh.ok and fresh.value is True, fresh.error
        assert changed.ok, changed.error
        assert after.ok, after.error
        assert after.value is True
        assert after.usage.memory_peak == fresh.usage.memory_peak


def test_a_user_run_never_reaches_the_state(interpreter: Component) -> None:
    """The state is taken before the first instance serves a run: what that run plants is not
    in any later instance."""
    with Sandbox(pool=1) as box:
        deadline = time.monotonic() + 120
        while box.pool_ready < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        planted = box.run("import sys, json\nsys.modules['planted'] = json\njson.mark = 1\nTrue")
        assert planted.ok, planted.error
        _settled(box, 1)
        probe = "import sys, json\n['planted' in sys.modules, hasattr(json, 'mark')]"
        later = _from_state(box, 1, [probe] * 3)
    assert [r.value for r in later] == [[False, False]] * 3


def test_each_pool_has_its_own_state_with_its_own_tools(interpreter: Component) -> None:
    """The guest caches the tool list in its memory: each sandbox's state holds its own."""

    def add(a: int, b: int) -> int:
        return a + b

    def mul(a: int, b: int) -> int:
        return a * b

    probe = "result = sorted(k for k in ('add', 'mul') if k in globals())"
    with Sandbox(tools=[add], pool=2) as adding, Sandbox(tools=[mul], pool=2) as multiplying:
        a = _from_state(adding, 2, [probe + "\nresult.append(add(2, 3))"] * 2)
        m = _from_state(multiplying, 2, [probe + "\nresult.append(mul(2, 3))"] * 2)
    assert [r.value for r in a] == [["add", 5]] * 2
    assert [r.value for r in m] == [["mul", 6]] * 2


def test_threads_share_a_pool_served_from_the_state(interpreter: Component) -> None:
    """Runs from several threads at once, all from the state, each get their own result."""
    with Sandbox(pool=3) as box:
        _from_state(box, 3, [])
        results: list[object] = []
        lock = threading.Lock()

        def worker(k: int) -> None:
            for j in range(8):
                value = box.run(f"import random\nresult = [{k * 100 + j}, random.random()]").value
                with lock:
                    results.append(value)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    firsts = sorted(v[0] for v in results)  # type: ignore[index]
    assert firsts == sorted(k * 100 + j for k in range(3) for j in range(8))
    assert len({v[1] for v in results}) == len(results)  # type: ignore[index]


def test_an_instance_made_on_the_callers_thread_starts_from_the_state_reseeded(
    interpreter: Component,
) -> None:
    """A run that finds no instance ready makes one (``make_now``) from the state: reseeded,
    and fresh whatever an earlier run from the state did."""
    from mighty.sandbox._results import _encode_inputs

    payload = _encode_inputs(None, keep=False, max_value=1 << 20)
    probe = "import random, sys\nresult = [random.random(), 'planted' in sys.modules]"
    with Sandbox(pool=1) as box:
        _settled(box, 1)
        values = []
        for code in (probe, "import sys\nsys.modules['planted'] = sys\nNone", probe, probe):
            live = box._pool.make_now()
            assert live.instance.component is box._config.component
            try:
                result = live.execute(code, payload, None, None)
            finally:
                live.close()
            assert result.ok, result.error
            if result.value is not None:
                values.append(result.value)
    assert len({v[0] for v in values}) == 3
    assert [v[1] for v in values] == [False] * 3
