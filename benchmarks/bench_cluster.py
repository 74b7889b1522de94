"""Cluster: cross-node ask vs raw nats-py request/reply on the same server, vs in-process ask;
and the pause of a live migration.

A real nats-server on loopback; the remote side runs in its own process in both cases (a `mty
node` for the agents, a plain nats-py responder for the baseline), so each side has its own GIL.
Sequential round trips: p50 latency and round trips/s; then 16 asks in flight at once.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import wait
from pathlib import Path

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
    await nc.subscribe("raw.echo", cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""

MANIFEST = """
[agents.echo]
component = "{echo}"

[supervisor]
children = [ {{ name = "echo1", type = "echo" }} ]

[cluster]
servers = ["{url}"]
node = "b"

[cluster.peers]
a = {{}}
b = {{}}
"""


def _raw(url: str) -> tuple[list[float], float]:
    responder = subprocess.Popen(
        [sys.executable, "-c", RESPONDER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert responder.stdout is not None and responder.stdout.readline().strip() == "ready"

    async def go() -> tuple[list[float], float]:
        nc = await nats.connect(url)
        body = b"\xa1an\x01"
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

    try:
        return asyncio.run(go())
    finally:
        responder.stdin.close()  # type: ignore[union-attr]
        responder.wait(10)


def _timed(fn: object, n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, N={N}")
    tmp = Path(tempfile.mkdtemp())
    echo_path = tmp / "echo.wasm"
    echo_path.write_bytes(assemble("echo_agent"))
    echo = Component.load(echo_path)
    rows: list[dict[str, object]] = []
    with NatsServer() as server:
        raw, raw_rate = _raw(server.url)
        manifest = tmp / "mighty.toml"
        manifest.write_text(MANIFEST.format(echo=echo_path, url=server.url))
        remote = subprocess.Popen(
            [sys.executable, "-m", "mighty.cli", "node", str(manifest), "-q"],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        assert remote.stderr is not None
        while "joined cluster" not in remote.stderr.readline():
            pass
        runtime = Runtime(workers=2)
        runtime.register(AgentType("echo", echo))
        config = parse_cluster({"servers": [server.url], "peers": {"a": {}, "b": {}}})
        node = Node(runtime, config, name="a").start()
        try:
            deadline = time.monotonic() + 10
            while node.whereis("echo1") is None and time.monotonic() < deadline:
                time.sleep(0.05)
            target = node.whereis("echo1")
            assert target is not None
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
                    "name": "cross-node ask (mighty)",
                    "p50_us": round(median(cross) * 1e6, 1),
                    "p99_us": round(p(cross, 0.99) * 1e6, 1),
                    "rt_per_s": round(1 / (sum(cross) / len(cross))),
                    "rt_per_s_16_in_flight": round(cross_rate),
                    "p50_vs_raw": round(median(cross) / median(raw), 2),
                    "rate_16_vs_raw": round(raw_rate / cross_rate, 2),
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
            rows.append(_sends(runtime, target, local))
            # Migration pause: an echo agent between two in-process nodes (a and c).
            rows.append(_migration(server.url, echo))
        finally:
            runtime.shutdown(drain=False, timeout=2)
            node.close()
            remote.terminate()
            remote.wait(20)
    report(rows)


def _sends(runtime: Runtime, target: str, local: str) -> dict[str, object]:
    """Sends/s to one remote node (each acknowledged by the target's mailbox), 1 and 4 senders."""
    import threading

    def rate(to: str, threads: int) -> float:
        count = N // threads

        def run() -> None:
            for _ in range(count):
                runtime.send(to, "x", 1)

        workers = [threading.Thread(target=run) for _ in range(threads)]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        return count * threads / (time.perf_counter() - started)

    remote1, remote4 = rate(target, 1), rate(target, 4)
    in_process = rate(local, 1)
    return {
        "name": "sends/s to another node (acknowledged)",
        "one_sender": round(remote1),
        "four_senders": round(remote4),
        "in_process_one_sender": round(in_process),
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
