"""Loading a cached componentize-py component, and instantiating it, vs raw wasmtime-py.

Run: .venv/bin/python benchmarks/bench_load.py [--json]

Builds examples/hello with `mty build` (cached), compiles it once into mighty's compiled cache,
then measures in this process:
- load: `Component.load(path)` from the compiled cache (read, verify sha256, deserialize).
  Target <= 0.3 s. Baseline: wasmtime-py `Component.deserialize_file` of the same artifact.
  Also with ``share_memory=False`` (no memory images: the old path).
- instantiate: `Instance(component)` (a fresh store, memory account, budget), copy-on-write
  memory images on (the default). Target p50 <= 2 ms. Baselines: wasmtime-py instantiation with
  wasmtime's own copy-on-write allocator, and mighty with ``share_memory=False`` (wasmtime
  copies the data segments). Close time of each too.

bench_instances.py does the same on the larger interpreter component and measures memory.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import wasmtime
from _common import ROOT, median, p, report, samples
from wasmtime import component as wc

from mighty import Component, Instance
from mighty.build import build_component
from mighty.engine import CompiledCache


def main() -> None:
    out = Path(tempfile.mkdtemp()) / "hello.wasm"
    build_component(ROOT / "examples" / "hello" / "handler.py", output=out)
    Component.load(out)  # make sure the compiled cache holds it

    load_times = samples(lambda: Component.load(out), repeat=15, warmup=2)
    component = Component.load(out)
    assert component.from_cache
    copying = Component.load(out, share_memory=False)
    copy_load = samples(lambda: Component.load(out, share_memory=False), repeat=15, warmup=2)

    def timed(component: Component, made: list[float], closed: list[float]) -> None:
        t0 = time.perf_counter()
        instance = Instance(component)
        t1 = time.perf_counter()
        instance.close()
        made.append(t1 - t0)
        closed.append(time.perf_counter() - t1)

    inst_times: list[float] = []
    inst_close: list[float] = []
    copy_times: list[float] = []
    copy_close: list[float] = []
    for _ in range(5):
        timed(component, [], [])
        timed(copying, [], [])
    for _ in range(4):  # interleaved, so drift hits both alike
        for _ in range(50):
            timed(component, inst_times, inst_close)
        for _ in range(50):
            timed(copying, copy_times, copy_close)

    raw_engine = wasmtime.Engine()
    raw_component = wc.Component(raw_engine, out.read_bytes())
    artifact = Path(tempfile.mkdtemp()) / "hello.cwasm"
    artifact.write_bytes(raw_component.serialize())
    raw_load = samples(
        lambda: wc.Component.deserialize_file(raw_engine, str(artifact)), repeat=15, warmup=2
    )
    linker = wc.Linker(raw_engine)
    linker.add_wasip2()

    def raw_instantiate() -> None:
        store = wasmtime.Store(raw_engine)
        store.set_wasi(wasmtime.WasiConfig())
        linker.instantiate(store, raw_component)
        store.close()

    raw_inst = samples(raw_instantiate, repeat=200, warmup=5)
    # Its own compiled form (the big modules it shares are compiled files of their own).
    key = f"{component.sha256}-images" + ("-shared" if component.modules else "")
    own = CompiledCache().path_for(key).stat().st_size
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    report(
        [
            {"name": "machine", "loadavg_1_5_15": load},
            {
                "name": "load cached component (s)",
                "mighty_s": round(median(load_times), 4),
                "raw_deserialize_file_s": round(median(raw_load), 4),
                "ratio": round(median(load_times) / median(raw_load), 2),
                "component_mb": round(component.size / 1e6, 1),
                "compiled_mb_own": round(own / 1e6, 1),
                "shared_modules": len(component.modules),
                "share_memory_false_s": round(median(copy_load), 4),
                "images": len(component.images),
                "target": "<= 0.3 s",
            },
            {
                "name": "instantiate (ms)",
                "mighty_p50_ms": round(p(inst_times, 0.5) * 1e3, 3),
                "mighty_p99_ms": round(p(inst_times, 0.99) * 1e3, 3),
                "raw_cow_p50_ms": round(p(raw_inst, 0.5) * 1e3, 3),
                "raw_cow_p99_ms": round(p(raw_inst, 0.99) * 1e3, 3),
                "ratio": round(p(inst_times, 0.5) / p(raw_inst, 0.5), 2),
                "target": "p50 <= 2 ms",
            },
            {
                "name": "instantiate: images / share_memory=False",
                "ratio": round(p(inst_times, 0.5) / p(copy_times, 0.5), 3),
                "copying_p50_ms": round(p(copy_times, 0.5) * 1e3, 3),
                "copying_p99_ms": round(p(copy_times, 0.99) * 1e3, 3),
            },
            {
                "name": "close (ms): images / share_memory=False",
                "ratio": round(p(inst_close, 0.5) / p(copy_close, 0.5), 3),
                "images_p50_ms": round(p(inst_close, 0.5) * 1e3, 3),
                "images_p99_ms": round(p(inst_close, 0.99) * 1e3, 3),
                "copying_p50_ms": round(p(copy_close, 0.5) * 1e3, 3),
                "copying_p99_ms": round(p(copy_close, 0.99) * 1e3, 3),
            },
            {
                "name": "machine at the end",
                "loadavg_1_5_15": "/".join(f"{x:.2f}" for x in os.getloadavg()),
            },
        ]
    )


if __name__ == "__main__":
    main()
