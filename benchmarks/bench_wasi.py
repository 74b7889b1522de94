"""mighty's Python WASI vs wasmtime's native WASI, on the same guest in the same run.

Run: .venv/bin/python benchmarks/bench_wasi.py [--json]

- print-heavy: the probe guest prints a short line N times (check-write/write/flush per line).
- clock/random-heavy: the probe reads both clocks and 16 random bytes N times.
Target (issue 12): ours / native <= 8, the print path <= 7 us per import. Also the cost of one
import through the gate: wall time of the call divided by the number of imports the gate
served, and the extra cost per import over native; ``cpu_*`` are the same from the thread's CPU
time, which a loaded machine disturbs far less than wall time.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import wasmtime
from _common import ROOT, cpu_samples, median, report, samples
from wasmtime import component as wc

from mighty import Component, Instance
from mighty.build import build_component

LINES = 500
CHURN = 500


def main() -> None:
    out = Path(tempfile.mkdtemp()) / "probe.wasm"
    build_component(ROOT / "guests" / "testing" / "probe" / "probe.py", output=out)
    ours = Instance(Component.load(out))

    engine = wasmtime.Engine()
    linker = wc.Linker(engine)
    linker.add_wasip2()
    store = wasmtime.Store(engine)
    config = wasmtime.WasiConfig()
    sink = Path(tempfile.mkdtemp()) / "stdout"
    config.stdout_file = str(sink)
    store.set_wasi(config)
    native = linker.instantiate(store, wc.Component(engine, out.read_bytes()))
    native_spam = native.get_func(store, "spam")
    native_churn = native.get_func(store, "churn")
    assert native_spam is not None and native_churn is not None

    rows = []
    for name, ours_fn, native_fn in (
        (
            f"print x{LINES}",
            lambda: ours.call("spam", "hello mighty", LINES),
            lambda: native_spam(store, "hello mighty", LINES),
        ),
        (
            f"clocks+random x{CHURN}",
            lambda: ours.call("churn", CHURN),
            lambda: native_churn(store, CHURN),
        ),
    ):
        before = ours.context.calls
        ours_fn()
        imports = ours.context.calls - before
        ours_t = median(samples(ours_fn, repeat=15, warmup=2))
        native_t = median(samples(native_fn, repeat=15, warmup=2))
        ours_cpu = median(cpu_samples(ours_fn, repeat=15, warmup=1))
        native_cpu = median(cpu_samples(native_fn, repeat=15, warmup=1))
        rows.append(
            {
                "name": f"{name}: ours / native WASI",
                "ratio": round(ours_t / native_t, 2),
                "ours_ms": round(ours_t * 1e3, 2),
                "native_ms": round(native_t * 1e3, 2),
                "imports": imports,
                "us_per_import": round(ours_t / imports * 1e6, 2),
                "extra_us_per_import": round((ours_t - native_t) / imports * 1e6, 2),
                "cpu_ratio": round(ours_cpu / native_cpu, 2),
                "cpu_us_per_import": round(ours_cpu / imports * 1e6, 2),
                "target": "ratio <= 8, print path <= 7 us per import (issue 12)",
            }
        )
    report(rows)


if __name__ == "__main__":
    main()
