"""Compiling a component mighty has not seen before: its big modules shared, or compiled whole.

Run: .venv/bin/python benchmarks/bench_compile.py [--json]

Builds two different handlers with `mty build` (cached builds: examples/hello and the WASI
probe guest), then compiles each into empty compiled caches of its own, in this process:
- whole: ``Component.load(share_modules=False)``, the baseline: wasmtime compiles the component
  as it is, every core module in it (what mighty did before the shared modules);
- shared, first: the first component with ``share_modules=True`` (opt-in), in an empty
  cache: its big modules are compiled once, then the small rest;
- shared, next: the second component in the same cache and process: only what is its own.
Wall time and process CPU (the compiler runs on a thread per core), the compiled cache's size
per component, and the load average. Each compile happens once per figure (a compile is seconds
long), in the order whole A, shared A, shared B, whole B, so the two whole compiles bracket the
shared ones.
And what sharing costs: an instantiation and close of the second component, shared against
whole, interleaved (p50 of 4 x 100 each; wasmtime links an imported module's imports by name
on every instantiation, where a whole component's are resolved when it is compiled).
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import ROOT, p, report

from mighty import Component, Instance
from mighty.build import build_component
from mighty.engine import CompiledCache


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(load: Callable[[], Component]) -> tuple[float, float, Component]:
    wall, cpu = time.perf_counter(), _cpu()
    component = load()
    assert not component.from_cache
    return time.perf_counter() - wall, _cpu() - cpu, component


def _size(cache: CompiledCache, prefix: str) -> int:
    return sum(path.stat().st_size for path in cache.directory.glob(f"{prefix}*"))


def main() -> None:
    scratch = Path(tempfile.mkdtemp())
    paths = [
        build_component(ROOT / "examples" / "hello" / "handler.py", output=scratch / "a.wasm").path,
        build_component(
            ROOT / "guests" / "testing" / "probe" / "probe.py", output=scratch / "b.wasm"
        ).path,
    ]
    load_before = "/".join(f"{x:.2f}" for x in os.getloadavg())
    whole_cache = CompiledCache(scratch / "whole")
    shared_cache = CompiledCache(scratch / "shared")
    whole_a = _timed(lambda: Component.load(paths[0], cache=whole_cache, share_modules=False))
    first = _timed(lambda: Component.load(paths[0], cache=shared_cache, share_modules=True))
    nxt = _timed(lambda: Component.load(paths[1], cache=shared_cache, share_modules=True))
    whole_b = _timed(lambda: Component.load(paths[1], cache=whole_cache, share_modules=False))
    assert len(first[2].modules) == len(nxt[2].modules) > 0
    made: dict[str, list[float]] = {"shared": [], "whole": []}
    for _ in range(4):
        for label, component in (("shared", nxt[2]), ("whole", whole_b[2])):
            for _ in range(100):
                started = time.perf_counter()
                Instance(component).close()
                made[label].append(time.perf_counter() - started)
    whole_wall = (whole_a[0] + whole_b[0]) / 2
    whole_cpu = (whole_a[1] + whole_b[1]) / 2
    own = _size(shared_cache, nxt[2].sha256)
    modules = _size(shared_cache, "module-")
    report(
        [
            {"name": "machine", "loadavg_1_5_15": load_before, "cpus": os.cpu_count()},
            {
                "name": "compile whole (baseline), A / B",
                "wall_s": f"{whole_a[0]:.2f} / {whole_b[0]:.2f}",
                "cpu_s": f"{whole_a[1]:.2f} / {whole_b[1]:.2f}",
                "compiled_mb_per_component": round(_size(whole_cache, "") / 2e6, 1),
            },
            {
                "name": "shared, the first component",
                "wall_s": round(first[0], 2),
                "cpu_s": round(first[1], 2),
                "ratio_wall_vs_whole": round(first[0] / whole_wall, 2),
                "shared_modules": len(first[2].modules),
                "modules_compiled_mb": round(modules / 1e6, 1),
            },
            {
                "name": "shared, a new component (modules compiled)",
                "wall_s": round(nxt[0], 3),
                "cpu_s": round(nxt[1], 3),
                "ratio_wall_vs_whole": round(nxt[0] / whole_wall, 3),
                "ratio_cpu_vs_whole": round(nxt[1] / whole_cpu, 3),
                "compiled_mb_of_its_own": round(own / 1e6, 2),
            },
            {
                "name": "instantiate + close, shared / whole (ms)",
                "shared_p50_ms": round(p(made["shared"], 0.5) * 1e3, 3),
                "whole_p50_ms": round(p(made["whole"], 0.5) * 1e3, 3),
                "ratio": round(p(made["shared"], 0.5) / p(made["whole"], 0.5), 2),
            },
            {
                "name": "machine at the end",
                "loadavg_1_5_15": "/".join(f"{x:.2f}" for x in os.getloadavg()),
            },
        ]
    )


if __name__ == "__main__":
    main()
