"""Evaluation: cells per second for 20 cases x 3 members on 2 workers, against running the same
members live; and an embedding cache hit against a miss.

The cases are 20 recorded code-mode runs (one per city, tools answered for real when recorded);
the members are three programs (the recorded one, one that calls in another order, one that
calls by keyword). The baseline runs the same 60 programs live: a fresh interpreter each, the
real tools, on 2 threads, as a CI job without eval would. ``--tool-ms N`` gives every tool
call N ms of latency (a remote tool or a model); eval never calls a tool, so the ratio grows
with it. ``--quick`` runs 6 cases.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import report

from mighty.eval import Case, EmbeddingCache, Equal, Member, Suite, ToolCallSetEqual, minilm
from mighty.sandbox import Sandbox

CITIES = [f"City{i}" for i in range(20)]
PROGRAMS = {
    "recorded": 'w = weather(city)\nf = flights("Paris", city)\n'
    'result = city + ": " + w["sky"] + ", " + f[0]["flight"]',
    "reordered": 'f = flights("Paris", city)\nw = weather(city)\n'
    'result = city + ": " + w["sky"] + ", " + f[0]["flight"]',
    "keywords": 'w = weather(city=city)\nf = flights(origin="Paris", destination=city)\n'
    'result = city + ": " + w["sky"] + ", " + f[0]["flight"]',
}


def make_tools(delay: float) -> list[object]:
    def weather(city: str) -> dict[str, object]:
        """Today's weather."""
        time.sleep(delay)
        return {"sky": "sunny" if len(city) % 2 else "rain"}

    def flights(origin: str, destination: str) -> list[dict[str, str]]:
        """Flights today."""
        time.sleep(delay)
        return [{"flight": f"MT {len(destination) * 7}"}]

    return [weather, flights]


def main() -> None:
    quick = "--quick" in sys.argv
    delay = 0.0
    if "--tool-ms" in sys.argv:
        delay = float(sys.argv[sys.argv.index("--tool-ms") + 1]) / 1000
    cities = CITIES[:6] if quick else CITIES
    tools = make_tools(delay)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        traces = []
        with Sandbox(tools=tools, pool=0) as box:
            for city in cities:
                path = Path(tmp) / f"{city}.bin"
                result = box.run(PROGRAMS["recorded"], {"city": city}, record=path)
                assert result.ok, result.error
                traces.append(Case(city, path))
        members = [Member.program(n, code) for n, code in PROGRAMS.items()]
        suite = Suite(traces, members, [Equal(), ToolCallSetEqual()], workers=2)
        suite.run()  # warm: interpreter loaded, traces read
        started = time.perf_counter()
        evaluated = suite.run()
        eval_time = time.perf_counter() - started
        assert evaluated.ok, evaluated.summary()
        cells = len(evaluated.cells)

        def live(job: tuple[str, str]) -> None:
            code, city = job
            with Sandbox(tools=tools, pool=0) as box:
                assert box.run(code, {"city": city}).ok

        jobs = [(code, city) for city in cities for code in PROGRAMS.values()]
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(live, jobs[:2]))  # warm
            started = time.perf_counter()
            list(pool.map(live, jobs))
            live_time = time.perf_counter() - started
    rows.append(
        {
            "name": f"eval {len(cities)} cases x 3 members, 2 workers",
            "cells": cells,
            "cells_per_s": round(cells / eval_time, 1),
            "live_runs_per_s": round(len(jobs) / live_time, 1),
            "ratio_eval_vs_live": round(live_time / eval_time, 2),
            "tool_ms": delay * 1000,
            "load": round(os.getloadavg()[0], 2),
        }
    )

    cache = EmbeddingCache(minilm)
    cache.embed(["warm the model up"])
    misses, hits = [], []
    for i in range(20):
        text = f"Trip {i}: fly from Paris to Oslo at 09:{i:02d}, it is snowing there."
        started = time.perf_counter()
        cache.embed([text])
        misses.append(time.perf_counter() - started)
        started = time.perf_counter()
        cache.embed([text])
        hits.append(time.perf_counter() - started)
    miss, hit = sorted(misses)[len(misses) // 2], sorted(hits)[len(hits) // 2]
    rows.append(
        {
            "name": "embedding: cache hit vs miss (p50)",
            "miss_ms": round(miss * 1e3, 3),
            "hit_us": round(hit * 1e6, 2),
            "ratio_miss_vs_hit": round(miss / hit, 1),
        }
    )
    report(rows)


if __name__ == "__main__":
    main()
