"""Cluster: cross-node ask vs raw nats-py request/reply on the same server, vs in-process ask;
sends/s to agents on 1, 2 and 3 nodes vs raw nats-py requests to 1, 2 and 3 responders; and the
pause of a live migration.

A real nats-server on loopback; the remote side runs in its own process in both cases (`mty
node`s for the agents, plain nats-py responders for the baseline), so each side has its own GIL.
Sequential round trips: p50 latency and round trips/s; then 16 asks in flight at once. A second
baseline makes the same raw request from a plain thread through an asyncio loop in another
thread (as a synchronous API over nats-py must): what that handoff alone costs.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import wait
from pathlib import Path
from typing import Any

import nats
from _common import assemble, median, p, report

from mighty import Component
from mighty.agents import AgentType, Runtime
from mighty.cluster import NatsServer, Node, parse_cluster

N = int(os.environ.get("BENCH_N", "2000"))

RESPONDER = """
import asyncio, sys, nats
async def main():
    nc = await nats.connect(sys.argv[1])
    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe(sys.argv[2], cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""

MANIFEST = """
[agents.echo]
component = "{echo}"

[supervisor]
children = [ {{ name = "echo_{node}", type = "echo" }} ]

[cluster]
servers = ["{url}"]
node = "{node}"

[cluster.peers]
a = {{}}
b = {{}}
c = {{}}
d = {{}}
"""
REMOTES = ("b", "c", "d")
SENDERS = 4


def _responder(url: str, subject: str) -> subprocess.Popen[str]:
    responder = subprocess.Popen(
        [sys.executable, "-c", RESPONDER, url, subject],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert responder.stdout is not None and responder.stdout.readline().strip() == "ready"
    return responder


def _stop(responder: subprocess.Popen[str]) -> None:
    assert responder.stdin is not None
    responder.stdin.close()
    responder.wait(10)


def _raw(url: str) -> tuple[list[float], float, list[float]]:
    """Raw request/reply to a responder process: sequential latencies, the rate with 16 in
    flight, and latencies of the same request made from a plain thread through a loop thread."""
    responder = _responder(url, "raw.echo")
    body = b"\xa1an\x01"

    async def go() -> tuple[list[float], float]:
        nc = await nats.connect(url)
        for _ in range(200):
            await nc.request("raw.echo", body, timeout=5)
        out = []
        for _ in range(N):
            started = time.perf_counter()
            await nc.request("raw.echo", body, timeout=5)
            out.append(time.perf_counter() - started)
        started = time.perf_counter()
        for _ in range(N // 16):
            await asyncio.gather(*(nc.request("raw.echo", body, timeout=5) for _ in range(16)))
        rate = (N // 16) * 16 / (time.perf_counter() - started)
        await nc.close()
        return out, rate

    def threaded() -> list[float]:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        nc = asyncio.run_coroutine_threadsafe(nats.connect(url), loop).result(10)

        def one() -> None:
            request = nc.request("raw.echo", body, timeout=5)
            asyncio.run_coroutine_threadsafe(request, loop).result(5)

        for _ in range(200):
            one()
        out = _timed(one, N)
        asyncio.run_coroutine_threadsafe(nc.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        return out

    try:
        out, rate = asyncio.run(go())
        return out, rate, threaded()
    finally:
        _stop(responder)


def _raw_sends(url: str, targets: int) -> float:
    """Raw acknowledged sends/s (request/reply, SENDERS in flight) spread over ``targets``
    responder processes."""
    responders = [_responder(url, f"raw.send.{i}") for i in range(targets)]
    body = b"\xa1an\x01"

    async def go() -> float:
        nc = await nats.connect(url)

        async def sender(index: int) -> None:
            for n in range(N // SENDERS):
                await nc.request(f"raw.send.{(n + index) % targets}", body, timeout=5)

        await asyncio.gather(*(sender(i) for i in range(SENDERS)))  # warm-up
        started = time.perf_counter()
        await asyncio.gather(*(sender(i) for i in range(SENDERS)))
        rate = (N // SENDERS) * SENDERS / (time.perf_counter() - started)
        await nc.close()
        return rate

    try:
        return asyncio.run(go())
    finally:
        for responder in responders:
            _stop(responder)


def _timed(fn: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - started)
    return out


def _remote(tmp: Path, echo_path: Path, url: str, node: str) -> subprocess.Popen[str]:
    manifest = tmp / f"{node}.toml"
    manifest.write_text(MANIFEST.format(echo=echo_path, url=url, node=node))
    remote = subprocess.Popen(
        [sys.executable, "-m", "mighty.cli", "node", str(manifest), "-q"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert remote.stderr is not None
    while "joined cluster" not in remote.stderr.readline():
        assert remote.poll() is None, f"node {node} ended"
    return remote


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, N={N}")
    tmp = Path(tempfile.mkdtemp())
    echo_path = tmp / "echo.wasm"
    echo_path.write_bytes(assemble("echo_agent"))
    echo = Component.load(echo_path)
    rows: list[dict[str, object]] = []
    with NatsServer() as server:
        raw, raw_rate, raw_threaded = _raw(server.url)
        raw_sends = {k: _raw_sends(server.url, k) for k in (1, 2, 3)}
        remotes = [_remote(tmp, echo_path, server.url, node) for node in REMOTES]
        runtime = Runtime(workers=2)
        runtime.register(AgentType("echo", echo))
        config = parse_cluster({"servers": [server.url], "peers": {n: {} for n in "abcd"}})
        node = Node(runtime, config, name="a").start()
        try:
            deadline = time.monotonic() + 30
            targets: list[str] = []
            for name in REMOTES:
                while node.whereis(f"echo_{name}") is None:
                    assert time.monotonic() < deadline, f"no echo_{name}"
                    time.sleep(0.05)
                targets.append(node.whereis(f"echo_{name}") or "")
            target = targets[0]
            for _ in range(200):
                runtime.ask(target, "x", 1)
            cross = _timed(lambda: runtime.ask(target, "x", 1), N)
            started = time.perf_counter()
            for _ in range(N // 16):
                wait([runtime.ask_future(target, "x", 1) for _ in range(16)])
            cross_rate = (N // 16) * 16 / (time.perf_counter() - started)
            local = runtime.spawn("echo")
            for _ in range(200):
                runtime.ask(local, "x", 1)
            inproc = _timed(lambda: runtime.ask(local, "x", 1), N)
            rows.append(
                {
                    "name": "raw nats-py request/reply (baseline)",
                    "p50_us": round(median(raw) * 1e6, 1),
                    "p99_us": round(p(raw, 0.99) * 1e6, 1),
                    "rt_per_s": round(1 / (sum(raw) / len(raw))),
                    "rt_per_s_16_in_flight": round(raw_rate),
                }
            )
            rows.append(
                {
                    "name": "raw nats-py request from a thread",
                    "p50_us": round(median(raw_threaded) * 1e6, 1),
                    "p50_vs_raw": round(median(raw_threaded) / median(raw), 2),
                }
            )
            rows.append(
                {
                    "name": "cross-node ask (mighty)",
                    "p50_us": round(median(cross) * 1e6, 1),
                    "p99_us": round(p(cross, 0.99) * 1e6, 1),
                    "rt_per_s": round(1 / (sum(cross) / len(cross))),
                    "rt_per_s_16_in_flight": round(cross_rate),
                    "p50_vs_raw": round(median(cross) / median(raw), 2),
                    "p50_vs_raw_from_a_thread": round(median(cross) / median(raw_threaded), 2),
                    "rate_16_vs_raw": round(raw_rate / cross_rate, 2),
                    "target_p50_vs_raw": 1.5,
                }
            )
            rows.append(
                {
                    "name": "in-process ask (same runtime)",
                    "p50_us": round(median(inproc) * 1e6, 1),
                    "rt_per_s": round(1 / (sum(inproc) / len(inproc))),
                    "cross_node_p50_vs_in_process": round(median(cross) / median(inproc), 2),
                }
            )
            rows.extend(_sends(runtime, targets, raw_sends))
            rows.append(_in_process_sends(runtime, local))
            # Migration pause: an echo agent between two in-process nodes (a and c).
            rows.append(_migration(server.url, echo))
        finally:
            runtime.shutdown(drain=False, timeout=2)
            node.close()
            for remote in remotes:
                remote.terminate()
            for remote in remotes:
                remote.wait(20)
    report(rows)


def _rate(runtime: Runtime, targets: list[str], threads: int) -> float:
    """Sends/s from ``threads`` threads, each cycling over ``targets``."""
    count = N // threads

    def run(index: int) -> None:
        for n in range(count):
            runtime.send(targets[(n + index) % len(targets)], "x", 1)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return count * threads / (time.perf_counter() - started)


def _sends(runtime: Runtime, targets: list[str], raw: dict[int, float]) -> list[dict[str, Any]]:
    """Acknowledged sends/s to agents on 1, 2 and 3 other nodes (SENDERS threads), against raw
    nats-py requests (SENDERS in flight) to 1, 2 and 3 responder processes."""
    rows: list[dict[str, Any]] = []
    one = _rate(runtime, targets[:1], 1)
    for k in (1, 2, 3):
        _rate(runtime, targets[:k], SENDERS)  # warm-up
        rate = _rate(runtime, targets[:k], SENDERS)
        rows.append(
            {
                "name": f"sends/s to agents on {k} node(s), {SENDERS} senders",
                "sends_per_s": round(rate),
                "raw_requests_per_s": round(raw[k]),
                "raw_vs_mighty": round(raw[k] / rate, 2),
                **({"one_sender_one_node": round(one)} if k == 1 else {}),
            }
        )
    return rows


def _in_process_sends(runtime: Runtime, local: str) -> dict[str, Any]:
    return {
        "name": "in-process sends/s (only enqueues)",
        "sends_per_s": round(_rate(runtime, [local], 1)),
    }


def _migration(url: str, echo: Component) -> dict[str, object]:
    config = parse_cluster(
        {
            "servers": [url],
            "name": "bench-migration",
            "peers": {"m1": {}, "m2": {}},
            "heartbeat": 0.1,
        }
    )
    made = []
    for name in ("m1", "m2"):
        runtime = Runtime(workers=1)
        runtime.register(AgentType("echo", echo))
        made.append((runtime, Node(runtime, config, name=name).start()))
    try:
        (r1, n1), (_, n2) = made
        n1.wait_for(["m2"], 10)
        n2.wait_for(["m1"], 10)
        pauses, totals = [], []
        address = f"m1:{r1.spawn('echo')}"
        nodes = {"m1": n1, "m2": n2}
        for i in range(20):
            here, there = ("m1", "m2") if i % 2 == 0 else ("m2", "m1")
            result = nodes[here].migrate(address, there)
            address = result.new_address
            pauses.append(result.pause)
            totals.append(result.total)
        return {
            "name": "live migration of one echo agent (20 moves)",
            "pause_p50_ms": round(median(pauses) * 1e3, 2),
            "pause_max_ms": round(max(pauses) * 1e3, 2),
            "total_p50_ms": round(median(totals) * 1e3, 2),
            "target_pause_ms": 50,
        }
    finally:
        for runtime, node in reversed(made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()


if __name__ == "__main__":
    main()
