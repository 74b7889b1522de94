"""Loading a cached componentize-py component, and instantiating it, vs raw wasmtime-py.

Run: .venv/bin/python benchmarks/bench_load.py [--json]

Builds examples/hello with `mty build` (cached), compiles it once into mighty's compiled cache,
then measures in this process:
- load: `Component.load(path)` from the compiled cache (read, verify sha256, deserialize).
  Target <= 0.3 s. Baseline: wasmtime-py `Component.deserialize_file` of the same artifact.
- instantiate: `Instance.create` (a fresh store, memory account, budget). Target p50 <= 2 ms.
  Baseline: wasmtime-py instantiation with wasmtime's own copy-on-write allocator.
"""

from __future__ import annotations

import tempfile
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
    inst_times = samples(lambda: Instance(component).close(), repeat=100, warmup=5)

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

    raw_inst = samples(raw_instantiate, repeat=100, warmup=5)
    entry = CompiledCache().path_for(component.sha256)
    report(
        [
            {
                "name": "load cached component (s)",
                "mighty_s": round(median(load_times), 4),
                "raw_deserialize_file_s": round(median(raw_load), 4),
                "ratio": round(median(load_times) / median(raw_load), 2),
                "component_mb": round(component.size / 1e6, 1),
                "compiled_mb": round(entry.stat().st_size / 1e6, 1),
                "target": "<= 0.3 s",
            },
            {
                "name": "instantiate (ms)",
                "mighty_p50_ms": round(p(inst_times, 0.5) * 1e3, 3),
                "mighty_p99_ms": round(p(inst_times, 0.99) * 1e3, 3),
                "raw_cow_p50_ms": round(p(raw_inst, 0.5) * 1e3, 3),
                "ratio": round(p(inst_times, 0.5) / p(raw_inst, 0.5), 2),
                "target": "p50 <= 2 ms",
            },
        ]
    )


if __name__ == "__main__":
    main()
