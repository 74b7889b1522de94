"""Shared helpers for the benchmarks: timing with warm-up, percentiles, fixtures, reporting."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


def wasm_tools() -> str:
    return str(Path(sys.executable).parent / "wasm-tools")


def assemble(name: str) -> bytes:
    """Assemble tests/fixtures/NAME.wat into component bytes."""
    done = subprocess.run(
        [wasm_tools(), "parse", str(FIXTURES / f"{name}.wat"), "-o", "/dev/stdout"],
        capture_output=True,
        check=True,
    )
    return done.stdout


def samples(fn: Callable[[], object], *, repeat: int, warmup: int = 20) -> list[float]:
    """Wall time in seconds of each of ``repeat`` calls of ``fn``, after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        out.append(time.perf_counter() - started)
    return out


def cpu_samples(fn: Callable[[], object], *, repeat: int, warmup: int = 20) -> list[float]:
    """CPU seconds of the calling thread (``time.thread_time``) for each of ``repeat`` calls.

    On a shared machine wall time mostly measures the other jobs; a call that runs on this
    thread (the gate's imports do) is better compared by its CPU time. It leaves out work done
    on other threads, so use it only where there is none to speak of."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        started = time.thread_time()
        fn()
        out.append(time.thread_time() - started)
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def median(values: list[float]) -> float:
    return statistics.median(values)


def report(rows: list[dict[str, object]]) -> None:
    """Print rows as a table, and as JSON when --json is given."""
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        name = row["name"]
        rest = ", ".join(f"{k}={v}" for k, v in row.items() if k != "name")
        print(f"{name:<44} {rest}")
