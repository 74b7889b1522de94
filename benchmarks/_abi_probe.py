"""Probe: a 64 KiB list<u8> round trip, stock wasmtime-py vs mighty.abi (not a test).

Two components from tests/abi/_harness.py: ``export`` is a guest export ``g(list<u8>) ->
list<u8>`` that returns its argument; ``echo`` routes the value through a Python host import as
well (host -> guest -> host import -> guest -> host), so the bytes cross four times.

Run: /tmp/venv/bin/python benchmarks/_abi_probe.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import wasmtime
from wasmtime.component import Component, Linker

from mighty.abi import U8, ListType
from tests.abi._harness import BYTES_EXPORT_WAT, ENGINE, Echo, build


def timeit(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e3


def main() -> None:
    data = bytes(range(256)) * 256
    assert len(data) == 65536

    # stock wasmtime-py, guest export
    comp = Component(ENGINE, build(BYTES_EXPORT_WAT))
    store = wasmtime.Store(ENGINE)
    func = Linker(ENGINE).instantiate(store, comp).get_func(store, "g")
    assert func is not None
    assert func(store, data) == data
    stock = timeit(lambda: func(store, data), 5)

    ours_export = Echo(ListType(U8), wat=BYTES_EXPORT_WAT)
    assert ours_export.call(data) == data
    ours = timeit(lambda: ours_export.call(data), 50)

    ours_echo = Echo(ListType(U8))
    assert ours_echo.call(data) == data
    echo = timeit(lambda: ours_echo.call(data), 50)

    codec = ours_export.codec

    def lower_free() -> None:
        array, n = codec.lower_params(ours_export.store, [data])
        codec.free_params(array, n)

    lower = timeit(lower_free, 50)
    print(f"64 KiB list<u8> round trip, guest export, stock wasmtime-py: {stock:8.2f} ms")
    print(
        f"64 KiB list<u8> round trip, guest export, mighty.abi:        {ours:8.2f} ms"
        f"  ({stock / ours:.0f}x)"
    )
    print(f"  of which lower_params + free_params:                      {lower:8.2f} ms")
    print(f"64 KiB list<u8> through a host import too, mighty.abi:      {echo:8.2f} ms")


if __name__ == "__main__":
    main()
