"""What restoring an agent's state costs the host: peak RSS and time against the state's size.

Run: .venv/bin/python benchmarks/bench_restore.py [--json] [--sizes 1,4,8,16]

Each size runs in a fresh subprocess (so ``ru_maxrss`` is that restore's peak alone): the WAT
echo agent (tests/fixtures/echo_agent.wat, whose ``restore`` takes the bytes and does nothing)
is instantiated, then ``restore`` gets a state of that many MiB, as a wake from the snapshot
store hands it over. Reported per size: the peak RSS over the process's own before the call,
per byte of state (wasmtime's C API lowers a ``list<u8>`` as one 32-byte value per byte, then
converts them to its own values: ~80 bytes a byte), and the time. Then the bound the host
enforces (``mighty.engine.check_lowering``): a 60 MiB state (the finding's, under the store's
64 MiB limit) for an agent with the default 256 MiB memory budget is refused before it is
lowered, and the peak RSS that takes.

Also loading a component as a reload does (``Component.load`` of a file: a component header
and one custom section of that size, compiled without the cache): 256 MiB, the largest the host
takes (``MAX_COMPONENT_BYTES``), and 1 GiB, refused from its size before a byte is read (it
was read and compiled: 2.16 GB of RSS, then ``MemoryError``).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

from _common import FIXTURES, ROOT, assemble, report

_CHILD = "--child"
_COMPONENT = "--component"


def _leb(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def component_child(size: int) -> dict[str, float | int | str]:
    """Load a component file of ``size`` bytes in this process; its peak RSS and time."""
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(ROOT))
    from mighty import Component, InvalidComponent

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.wasm"
        name = _leb(1) + b"x"
        payload = size - 8 - 1 - len(name)
        payload -= len(_leb(len(name) + payload - 5))  # the length's own bytes (4 or 5)
        with path.open("wb") as file:
            file.write(b"\x00asm\x0d\x00\x01\x00\x00" + _leb(len(name) + payload) + name)
            file.truncate(size)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        began = time.perf_counter()
        try:
            Component.load(path, use_cache=False)
            outcome = "loaded"
        except InvalidComponent:
            outcome = "refused"
        took = time.perf_counter() - began
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "component_mib": size >> 20,
        "outcome": outcome,
        "peak_over_mib": round((peak - before) / (1 << 20), 1),
        "seconds": round(took, 2),
    }


def child(size: int, budget_memory: int) -> dict[str, float | int | str]:
    """One restore of ``size`` bytes in this process; its peak RSS and time."""
    sys.path.insert(0, str(ROOT))
    from mighty import Budget, Component, Instance, OutOfMemory
    from mighty.agents import Runtime
    from mighty.engine import check_lowering

    component = Component.load(assemble("echo_agent"))
    runtime = Runtime(workers=1)
    budget = Budget(fuel=10**13, timeout=600, memory=budget_memory)
    instance = Instance(component, gate=runtime.gate, budget=budget)
    state = bytes(size)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    began = time.perf_counter()
    outcome = "restored"
    try:
        check_lowering(len(state), instance.budget.memory, "restore")
        instance.call("restore", state)
    except OutOfMemory:
        outcome = "refused"
    took = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    instance.close()
    runtime.shutdown()
    return {
        "state_mib": size >> 20,
        "outcome": outcome,
        "peak_over_mib": round((peak - before) / (1 << 20), 1),
        "bytes_per_byte": round((peak - before) / size, 1),
        "seconds": round(took, 2),
    }


def run(size_mib: int, budget_memory: int) -> dict[str, float | int | str]:
    done = subprocess.run(
        [sys.executable, __file__, _CHILD, str(size_mib << 20), str(budget_memory)],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    if sys.argv[1:2] == [_CHILD]:
        print(json.dumps(child(int(sys.argv[2]), int(sys.argv[3]))))
        return
    if sys.argv[1:2] == [_COMPONENT]:
        print(json.dumps(component_child(int(sys.argv[2]))))
        return
    sizes = [1, 4, 8, 16]
    if "--sizes" in sys.argv:
        sizes = [int(s) for s in sys.argv[sys.argv.index("--sizes") + 1].split(",")]
    assert FIXTURES.is_dir()
    rows: list[dict[str, object]] = []
    for size in sizes:
        # A budget large enough that the bound lets it through: the lowering's own cost.
        rows.append({"name": f"restore {size} MiB (budget 16 GiB)", **run(size, 1 << 34)})
    rows.append({"name": "restore 60 MiB (budget 256 MiB)", **run(60, 256 << 20)})
    for size_mib in (256, 1024):
        done = subprocess.run(
            [sys.executable, __file__, _COMPONENT, str(size_mib << 20)],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append({"name": f"load a {size_mib} MiB component", **result})
    report(rows)


if __name__ == "__main__":
    main()
