"""The code-mode pool: every run gets a never-used instance, whatever the previous run changed."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from mighty import BadInput
from mighty.engine import Component
from mighty.sandbox import Sandbox

# Each pair: what run k does, and what run k+1 evaluates (it must be True in a pristine
# interpreter, and would be False had run k's change survived).
_CHANGES = [
    ("marker = 41", "'marker' not in globals()"),
    ("import json\njson.marker = 1", "import json\nnot hasattr(json, 'marker')"),
    ("import sys\nsys.modules['planted'] = sys", "import sys\n'planted' not in sys.modules"),
    ("import builtins\nbuiltins.len = lambda x: 7", "len([1, 2]) == 2"),
    ("import builtins\nbuiltins.planted = 1", "import builtins\nnot hasattr(builtins, 'planted')"),
    ("import os\nos.environ['PLANTED'] = '1'", "import os\n'PLANTED' not in os.environ"),
    ("import sys\nsys.setrecursionlimit(50)", "import sys\nsys.getrecursionlimit() > 50"),
    ("import math\nmath.pi = 3", "import math\nmath.pi > 3.14"),
    ("import random\nrandom.seed(7)", "import random\nrandom.seed(7)\na = random.random()\nTrue"),
    ("import gc\ngc.disable()", "import gc\ngc.isenabled()"),
    ("import sys\nsys.stdout = None", "import sys\nsys.stdout is not None"),
    # Linear memory: a 60 MB block filled with a pattern stays in run k's instance; the next
    # run starts at the image's size again (its peak shows no trace of the block).
    ("keep = bytearray(b'\\xab') * 60_000_000", "True"),
]


@pytest.mark.parametrize(("change", "check"), _CHANGES, ids=[c[0][:30] for c in _CHANGES])
def test_a_change_in_one_run_is_invisible_in_the_next(
    interpreter: Component, change: str, check: str
) -> None:
    """Globals, modules, builtins, environment, interpreter settings, memory: all start fresh."""
    with Sandbox(pool=2) as box:
        fresh = box.run("True")
        assert fresh.ok
        changed = box.run(change)
        assert changed.ok, changed.error
        after = box.run(check)
        assert after.ok, after.error
        assert after.value is True
        assert after.usage.memory_peak == fresh.usage.memory_peak


def test_random_differs_between_runs(interpreter: Component) -> None:
    """Every instance draws its own entropy: no two runs see the same `random` sequence."""
    with Sandbox(pool=3) as box:
        values = [box.run("import random\nrandom.random()").value for _ in range(8)]
    assert len(set(values)) == len(values)


def test_the_pool_refills_and_serves_threads_and_async(interpreter: Component) -> None:
    """Threads and run_async callers share one pool; every run is right and none is lost."""
    with Sandbox(pool=3) as box:
        deadline = time.monotonic() + 60
        while box.pool_ready < 3:  # the background thread fills it
            assert time.monotonic() < deadline
            time.sleep(0.01)
        results: list[object] = []
        lock = threading.Lock()

        def worker(k: int) -> None:
            for j in range(10):
                value = box.run(f"result = {k} * 100 + {j}").value
                with lock:
                    results.append(value)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        for thread in threads:
            thread.start()

        async def many() -> list[object]:
            runs = [box.run_async(f"result = -{j}") for j in range(10)]
            return [r.value for r in await asyncio.gather(*runs)]

        from_async = asyncio.run(many())
        for thread in threads:
            thread.join()
    assert sorted(results) == sorted(k * 100 + j for k in range(3) for j in range(10))  # type: ignore[type-var]
    assert from_async == [-j for j in range(10)]


def test_pool_size_is_validated(interpreter: Component) -> None:
    """A pool size outside 0..64 (or not an int) is refused with a clear error."""
    for bad in (-1, 65, 2.5, True):
        with pytest.raises(BadInput, match="pool must be an int"):
            Sandbox(pool=bad)  # type: ignore[arg-type]


def test_a_pool_of_zero_makes_each_instance_on_demand(interpreter: Component) -> None:
    """pool=0 keeps nothing ready and starts no thread; runs still work."""
    with Sandbox(pool=0) as box:
        assert box.pool_ready == 0
        assert box.run("result = 6 * 7").value == 42
        assert box.pool_ready == 0
