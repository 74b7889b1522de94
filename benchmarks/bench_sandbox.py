"""Code mode: a sandbox run end to end, against native `python -c` in a subprocess, same run.

Figures: `run("result = 1 + 1")` p50/p99 with a ready spare instance (runs spaced out, as an
agent's are) and back to back (each run waits for its instance); native subprocess p50; runs per
second with 1 and 2 threads; per-call overhead of a tool-calling loop.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from _common import p, report, samples

from mighty.sandbox import Sandbox


def add(a: int, b: int) -> int:
    return a + b


def main() -> None:
    rows: list[dict[str, object]] = []
    with Sandbox(tools=[add]) as sandbox:
        sandbox.run("1")

        def spaced() -> None:
            time.sleep(0.01)  # the spare is ready again, as between an agent's runs
            started = time.perf_counter()
            sandbox.run("result = 1 + 1")
            spaced_times.append(time.perf_counter() - started)

        spaced_times: list[float] = []
        for _ in range(200):
            spaced()
        back = samples(lambda: sandbox.run("result = 1 + 1"), repeat=200, warmup=10)
        native = samples(
            lambda: subprocess.run([sys.executable, "-c", "result = 1 + 1"], check=True),
            repeat=30,
            warmup=3,
        )
        rows.append(
            {
                "name": "run('result = 1 + 1'), spare ready",
                "p50_ms": round(p(spaced_times, 0.5) * 1e3, 3),
                "p99_ms": round(p(spaced_times, 0.99) * 1e3, 3),
            }
        )
        rows.append(
            {
                "name": "run('result = 1 + 1'), back to back",
                "p50_ms": round(p(back, 0.5) * 1e3, 3),
                "p99_ms": round(p(back, 0.99) * 1e3, 3),
            }
        )
        rows.append(
            {
                "name": "native subprocess python -c",
                "p50_ms": round(p(native, 0.5) * 1e3, 3),
                "sandbox_spare_over_native": round(p(spaced_times, 0.5) / p(native, 0.5), 3),
                "sandbox_b2b_over_native": round(p(back, 0.5) / p(native, 0.5), 3),
            }
        )
        per_second = {}
        for threads in (1, 2):
            count = [0]
            stop = time.perf_counter() + 3.0

            def loop(count: list[int] = count, stop: float = stop) -> None:
                while time.perf_counter() < stop:
                    sandbox.run("result = 1 + 1")
                    count[0] += 1

            workers = [threading.Thread(target=loop) for _ in range(threads)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            per_second[threads] = count[0] / 3.0
        rows.append(
            {
                "name": "runs per second",
                "1_thread": round(per_second[1], 1),
                "2_threads": round(per_second[2], 1),
                "ratio_2_over_1": round(per_second[2] / per_second[1], 2),
            }
        )
        n = 100
        loop_code = f"for i in range({n}):\n    add(i, 1)"
        plain_code = f"def add2(a, b):\n    return a + b\nfor i in range({n}):\n    add2(i, 1)"
        tools = samples(lambda: sandbox.run(loop_code), repeat=30, warmup=3)
        plain = samples(lambda: sandbox.run(plain_code), repeat=30, warmup=3)
        per_call = (p(tools, 0.5) - p(plain, 0.5)) / n
        rows.append(
            {
                "name": f"tool-calling loop ({n} calls)",
                "run_p50_ms": round(p(tools, 0.5) * 1e3, 3),
                "same_loop_in_guest_p50_ms": round(p(plain, 0.5) * 1e3, 3),
                "per_call_overhead_us": round(per_call * 1e6, 1),
            }
        )
    report(rows)


if __name__ == "__main__":
    main()
