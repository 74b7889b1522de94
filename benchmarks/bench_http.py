"""Outgoing HTTP from a guest (wasi:http) against the host's own HTTP client, in the same run.

Run: .venv/bin/python benchmarks/bench_http.py [--json] [--quick]

The guest is guests/testing/http_probe (its ``fetch`` and ``stream-sum`` go through the guest
SDK's ``mighty_agent.http``); the server is tests/wasi/http_servers.py's ``LoopbackServer``, in
this process, on 127.0.0.1. The baseline is what the host's worker thread does alone: an
httpcore ``ConnectionPool`` built as the host builds its own (same limits, same guarded
backend), keep-alive, called from Python on this thread, with the body read to its end.

- 1 KiB GET: ``fetch`` of /fixed/1024 against the pool's GET of the same URL, one of each per
  round (so a burst of load hits both alike); p50 and p90 of each side, the per-request
  overhead (guest minus host client, at p50 and at p90; target <= 150 us) and the ratio of
  the p50s (target <= 1.5). ``cpu_us``: process CPU per request (every thread: the guest's
  call, the host's worker thread, and the in-process server, which both sides pay alike).
- 16 MiB streamed: ``stream-sum`` of /bytes/16777216?chunk=65536 against the pool reading the
  same body; MB/s (10^6 bytes) from the median round (targets >= 200 MB/s, ratio <= 2).
- recording: a loop of ``fetch`` calls on an instance recording a trace (default flush) against
  the same loop on one that does not, in turns; ratio of the medians (target <= 1.25).
- replay: a whole recorded run (instantiate, K GETs of /delay?ms=20, close) against replaying
  its trace (``replay_trace``: load, instantiate, the recorded answers, no network; the server
  is checked to receive nothing while replays run); the speedup (target >= 5).

The loopback server's handler is switched to TCP_NODELAY for the run: it writes the response
head and body in two sends, and with Nagle's algorithm on, the body waits for the client's
delayed ACK (~40 ms per request on Linux, on both sides alike), which would hide everything
measured here.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _common import ROOT, median, p, report

sys.path.insert(0, str(ROOT))

import httpcore

import mighty._resources
from mighty import Budget, Component, Instance, Ok
from mighty.build import build_component
from mighty.trace import Recorder, replay_trace
from mighty.wasi import Policy
from mighty.wasi._http_client import _GuardedBackend
from tests.wasi import http_servers
from tests.wasi.http_servers import LoopbackServer

QUICK = "--quick" in sys.argv
GETS = 40 if QUICK else 400  # 1 KiB GETs per side
STREAM_ROUNDS = 2 if QUICK else 7
STREAM_BYTES = 16 * 1024 * 1024
LOOP = 20  # fetches per recording round
RECORD_ROUNDS = 5 if QUICK else 21
REPLAY_GETS = 10 if QUICK else 50  # K
REPLAY_ROUNDS = 2 if QUICK else 5
BUDGET = Budget(timeout=120)


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def yes(met: bool) -> str:
    return "yes" if met else "no"


def host_pool() -> httpcore.ConnectionPool:
    # As mighty.wasi._http_client._pool builds the host's own (a grant that reaches loopback).
    return httpcore.ConnectionPool(
        max_connections=256,
        max_keepalive_connections=64,
        keepalive_expiry=30.0,
        network_backend=_GuardedBackend(allow_private=True),
    )


def host_get(pool: httpcore.ConnectionPool, url: str) -> int:
    """One request on the pool, the body read to its end; its length."""
    total = 0
    with pool.stream(b"GET", url) as response:
        for chunk in response.iter_stream():
            total += len(chunk)
    return total


def guest_fetch(instance: Instance, url: str) -> int:
    got = instance.call("fetch", "GET", url, [], b"", 0)
    assert isinstance(got, Ok) and got.value["status"] == 200, got
    return len(got.value["body"])


def guest_stream(instance: Instance, url: str) -> int:
    got = instance.call("stream-sum", url)
    assert isinstance(got, Ok), got
    return int(got.value)


def turns(
    sides: dict[str, Callable[[], object]], *, rounds: int, warmup: int = 3
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and process-CPU seconds of each side, one call of each per round, in turn."""
    for _ in range(warmup):
        for fn in sides.values():
            fn()
    wall: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            started, started_cpu = time.perf_counter(), time.process_time()
            fn()
            cpu[name].append(time.process_time() - started_cpu)
            wall[name].append(time.perf_counter() - started)
    return wall, cpu


def get_rows(
    instance: Instance, pool: httpcore.ConnectionPool, url: str
) -> list[dict[str, object]]:
    assert guest_fetch(instance, url) == host_get(pool, url) == 1024
    wall, cpu = turns(
        {"guest": lambda: guest_fetch(instance, url), "host": lambda: host_get(pool, url)},
        rounds=GETS,
        warmup=20,
    )
    g50, g90 = p(wall["guest"], 0.5), p(wall["guest"], 0.9)
    h50, h90 = p(wall["host"], 0.5), p(wall["host"], 0.9)
    overhead = (g50 - h50) * 1e6
    gc, hc = median(cpu["guest"]) * 1e6, median(cpu["host"]) * 1e6
    return [
        {
            "name": "1 KiB GET: guest fetch / host client",
            "absolute_us": f"p50 {g50 * 1e6:.0f}, p90 {g90 * 1e6:.0f}",
            "baseline_us": f"p50 {h50 * 1e6:.0f}, p90 {h90 * 1e6:.0f}",
            "ratio": round(g50 / h50, 2),
            "ratio_p90": round(g90 / h90, 2),
            "target": "<= 1.5",
            "met": yes(g50 / h50 <= 1.5),
            "cpu_us": f"guest {gc:.0f}, host {hc:.0f}",
            "n": GETS,
        },
        {
            "name": "1 KiB GET: per-request overhead",
            "absolute_us": f"p50 {overhead:.0f}, p90 {(g90 - h90) * 1e6:.0f}",
            "paired_median_us": round(
                statistics.median(g - h for g, h in zip(wall["guest"], wall["host"], strict=True))
                * 1e6
            ),
            "target": "<= 150 us",
            "met": yes(overhead <= 150),
        },
    ]


def stream_rows(
    instance: Instance, pool: httpcore.ConnectionPool, url: str
) -> list[dict[str, object]]:
    assert guest_stream(instance, url) == host_get(pool, url) == STREAM_BYTES
    wall, cpu = turns(
        {"guest": lambda: guest_stream(instance, url), "host": lambda: host_get(pool, url)},
        rounds=STREAM_ROUNDS,
        warmup=1,
    )
    guest_mbs = STREAM_BYTES / median(wall["guest"]) / 1e6
    host_mbs = STREAM_BYTES / median(wall["host"]) / 1e6
    ratio = median(wall["guest"]) / median(wall["host"])
    return [
        {
            "name": "16 MiB streamed: guest stream-sum / host",
            "absolute_mb_s": round(guest_mbs, 1),
            "baseline_mb_s": round(host_mbs, 1),
            "ratio": round(ratio, 2),
            "target": ">= 200 MB/s, ratio <= 2",
            "met": yes(guest_mbs >= 200 and ratio <= 2),
            "cpu_s": f"guest {median(cpu['guest']):.3f}, host {median(cpu['host']):.3f}",
            "rounds": STREAM_ROUNDS,
        }
    ]


def record_rows(
    component: Component, policy: Policy, url: str, tmp: Path
) -> list[dict[str, object]]:
    plain = Instance(component, policy=policy, budget=BUDGET)
    recorder = Recorder(tmp / "loop.bin")
    recorded = Instance(component, policy=policy, budget=BUDGET, record=recorder)

    def loop(instance: Instance) -> None:
        for _ in range(LOOP):
            guest_fetch(instance, url)

    wall, cpu = turns(
        {"plain": lambda: loop(plain), "recorded": lambda: loop(recorded)},
        rounds=RECORD_ROUNDS,
        warmup=2,
    )
    recorded.close()
    recorder.close()
    plain.close()
    ratio = median(wall["recorded"]) / median(wall["plain"])
    gets = (2 + RECORD_ROUNDS) * LOOP  # warm-up included: all in the trace
    size = (tmp / "loop.bin").stat().st_size
    return [
        {
            "name": "recording a fetch loop: recorded / plain",
            "absolute_us": round(median(wall["recorded"]) / LOOP * 1e6),
            "baseline_us": round(median(wall["plain"]) / LOOP * 1e6),
            "ratio": round(ratio, 2),
            "target": "<= 1.25",
            "met": yes(ratio <= 1.25),
            "cpu_ratio": round(median(cpu["recorded"]) / median(cpu["plain"]), 2),
            "trace_bytes_per_get": round(size / gets),
            "rounds": f"{RECORD_ROUNDS} x {LOOP} GETs",
        }
    ]


def replay_rows(
    component: Component, policy: Policy, server: LoopbackServer, tmp: Path
) -> list[dict[str, object]]:
    url = server.url("/delay?ms=20")
    trace = tmp / "delay.bin"

    def record_once() -> None:
        trace.unlink(missing_ok=True)
        with (
            Recorder(trace) as recorder,
            Instance(component, policy=policy, budget=BUDGET, record=recorder) as instance,
        ):
            for _ in range(REPLAY_GETS):
                guest_fetch(instance, url)

    replay_wall: list[float] = []
    replay_cpu: list[float] = []

    def replay_once() -> None:
        before = len(server.requests)
        started, started_cpu = time.perf_counter(), time.process_time()
        done = replay_trace(trace)
        replay_cpu.append(time.process_time() - started_cpu)
        replay_wall.append(time.perf_counter() - started)
        assert not done.truncated and len(server.requests) == before, "replay used the network"

    wall, _ = turns({"record": record_once, "replay": replay_once}, rounds=REPLAY_ROUNDS, warmup=1)
    replay_wall, replay_cpu = replay_wall[1:], replay_cpu[1:]  # the warm-up's
    speedup = median(wall["record"]) / median(replay_wall)
    return [
        {
            "name": f"replay of {REPLAY_GETS} GETs of /delay?ms=20: recorded run / replay",
            "absolute_ms": round(median(replay_wall) * 1e3, 1),
            "baseline_ms": round(median(wall["record"]) * 1e3, 1),
            "speedup": round(speedup, 1),
            "target": ">= 5",
            "met": yes(speedup >= 5),
            "replay_cpu_ms": round(median(replay_cpu) * 1e3, 1),
            "rounds": REPLAY_ROUNDS,
        }
    ]


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    out = tmp / "http_probe.wasm"
    build_component(
        ROOT / "guests" / "testing" / "http_probe" / "probe.py",
        output=out,
        python_path=[mighty._resources.agent_sdk()],
    )
    component = Component.load(out)
    started_load = load()
    http_servers._Handler.disable_nagle_algorithm = True  # see the module docstring
    pool = host_pool()
    with LoopbackServer() as server:
        policy = Policy().with_http(server.origin)
        instance = Instance(component, policy=policy, budget=BUDGET)
        rows = get_rows(instance, pool, server.url("/fixed/1024"))
        rows += stream_rows(instance, pool, server.url(f"/bytes/{STREAM_BYTES}?chunk=65536"))
        instance.close()
        rows += record_rows(component, policy, server.url("/fixed/1024"), tmp)
        rows += replay_rows(component, policy, server, tmp)
    pool.close()
    rows.append(
        {
            "name": "machine",
            "loadavg_1_5_15": f"start {started_load}, end {load()}",
            "cpus": os.cpu_count(),
            "quick": QUICK,
        }
    )
    report(rows)


if __name__ == "__main__":
    main()
