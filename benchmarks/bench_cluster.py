"""Cluster: cross-node ask vs raw nats-py request/reply on the same server, vs in-process ask;
sends/s to agents on 1, 2 and 3 nodes vs raw nats-py requests to 1, 2 and 3 responders;
pipelined sends from one sender (``send_future``) vs raw nats-py requests 64 in flight; the
pause of a live migration; and a partition's timeline (fence, declared dead, answered again).

A real nats-server on loopback; the remote side runs in its own process in both cases (`mty
node`s for the agents, plain nats-py responders for the baseline), so each side has its own GIL.
Sequential round trips: p50 latency and round trips/s; then 16 asks in flight at once. A second
baseline makes the same raw request from a plain thread through an asyncio loop in another
thread (as a synchronous API over nats-py must): what that handoff alone costs. A third, the
floor of any design that runs an agent's handler off the NATS loop: that request from a plain
thread, to a responder that hands each request to a worker thread and publishes the reply back
on its loop (`run_in_executor`), the two hand-offs an agent's worker costs on the receiving side.
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

import nats
from _common import assemble, median, p, report

from mighty import Component
from mighty.agents import AgentType, Runtime
from mighty.cluster import NatsServer, Node, parse_cluster

N = int(os.environ.get("BENCH_N", "1000"))
# BENCH_PARTITIONS=0 leaves out the migration and partition timelines (the message figures only).
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "3"))
PIPE_N = 10 * N
"""Messages per pipelined-sends measurement."""

RESPONDER = """
import asyncio, sys, nats
from concurrent.futures import ThreadPoolExecutor
async def main():
    nc = await nats.connect(sys.argv[1])
    loop = asyncio.get_running_loop()
    worker = ThreadPoolExecutor(1)
    hop = sys.argv[3:] == ["hop"]
    async def echo(msg):
        data = msg.data
        if hop:  # to a worker thread and back, as a handler run off the loop is
            data = await loop.run_in_executor(worker, bytes, data)
        await msg.respond(data)
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


def _responder(url: str, subject: str, *mode: str) -> subprocess.Popen[str]:
    responder = subprocess.Popen(
        [sys.executable, "-c", RESPONDER, url, subject, *mode],
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


def _raw_ask(url: str) -> tuple[list[float], float]:
    """Raw request/reply to the responder: sequential latencies, and the rate 16 in flight."""
    body = b"\xa1an\x01"

    async def go() -> tuple[list[float], float]:
        nc = await nats.connect(url)
        for _ in range(100):
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

    return asyncio.run(go())


class _Threaded:
    """The raw request made from a plain thread through an asyncio loop in another thread."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.nc = asyncio.run_coroutine_threadsafe(nats.connect(url), self.loop).result(10)

    def one(self, subject: str = "raw.echo") -> None:
        request = self.nc.request(subject, b"\xa1an\x01", timeout=5)
        asyncio.run_coroutine_threadsafe(request, self.loop).result(5)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.nc.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _raw_sends(url: str, targets: int) -> float:
    """Raw acknowledged sends/s (request/reply, SENDERS in flight) spread over ``targets``
    responders (raw.send.0 ...)."""
    body = b"\xa1an\x01"

    async def go() -> float:
        nc = await nats.connect(url)

        async def sender(index: int, count: int) -> None:
            for n in range(count):
                await nc.request(f"raw.send.{(n + index) % targets}", body, timeout=5)

        await asyncio.gather(*(sender(i, 50) for i in range(SENDERS)))  # warm-up
        started = time.perf_counter()
        await asyncio.gather(*(sender(i, N // SENDERS) for i in range(SENDERS)))
        rate = (N // SENDERS) * SENDERS / (time.perf_counter() - started)
        await nc.close()
        return rate

    return asyncio.run(go())


def _raw_pipelined(url: str, window: int = 64) -> float:
    """Raw acknowledged sends/s from one sender: request/reply, ``window`` in flight at once,
    to one responder (the baseline of pipelined sends)."""
    body = b"\xa1an\x01"

    async def go() -> float:
        nc = await nats.connect(url)
        room = asyncio.Semaphore(window)

        async def one() -> None:
            try:
                await nc.request("raw.send.0", body, timeout=5)
            finally:
                room.release()

        async def run(count: int) -> None:
            tasks = []
            for _ in range(count):
                await room.acquire()
                tasks.append(asyncio.ensure_future(one()))
            await asyncio.gather(*tasks)

        await run(500)  # warm-up
        started = time.perf_counter()
        await run(PIPE_N)
        rate = PIPE_N / (time.perf_counter() - started)
        await nc.close()
        return rate

    return asyncio.run(go())


def _pipelined(runtime: Runtime, target: str) -> tuple[float, float]:
    """Acknowledged sends/s from one thread with ``send_future`` (each acknowledged, waited
    for at the end), and that thread's CPU per message (microseconds)."""
    started, cpu = time.perf_counter(), time.thread_time()
    futures = [runtime.send_future(target, "x", 1) for _ in range(PIPE_N)]
    for future in futures:
        future.result(60)
    elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu
    return PIPE_N / elapsed, cpu / PIPE_N * 1e6


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
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, N={N}, rounds={ROUNDS}")
    tmp = Path(tempfile.mkdtemp())
    echo_path = tmp / "echo.wasm"
    echo_path.write_bytes(assemble("echo_agent"))
    echo = Component.load(echo_path)
    rows: list[dict[str, object]] = []
    with NatsServer() as server:
        url = server.url
        responders = [_responder(url, "raw.echo"), _responder(url, "raw.hop", "hop")]
        responders += [_responder(url, f"raw.send.{i}") for i in range(len(REMOTES))]
        remotes = [_remote(tmp, echo_path, url, node) for node in REMOTES]
        runtime = Runtime(workers=2)
        runtime.register(AgentType("echo", echo))
        config = parse_cluster({"servers": [url], "peers": {n: {} for n in "abcd"}})
        node = Node(runtime, config, name="a").start()
        threaded = _Threaded(url)
        try:
            deadline = time.monotonic() + 30
            targets: list[str] = []
            for name in REMOTES:
                while node.whereis(f"echo_{name}") is None:
                    assert time.monotonic() < deadline, f"no echo_{name}"
                    time.sleep(0.05)
                targets.append(node.whereis(f"echo_{name}") or "")
            local = runtime.spawn("echo")
            for _ in range(200):
                runtime.ask(targets[0], "x", 1)
                runtime.ask(local, "x", 1)
                threaded.one()
                threaded.one("raw.hop")
            # Rounds, each measuring the baseline and ours back to back: the other jobs on the
            # machine come and go, and a ratio from one round compares like with like.
            rounds: list[dict[str, float]] = []
            for _ in range(ROUNDS):
                rounds.append(_round(runtime, url, targets, local, threaded))
            rows.extend(_rows(rounds))
            if os.environ.get("BENCH_PARTITIONS", "1") != "0":
                rows.append(_migration(url, echo))
                rows.append(_partition(server, echo))
                rows.append(_supervised_partition(server, echo))
        finally:
            threaded.close()
            runtime.shutdown(drain=False, timeout=2)
            node.close()
            for process in remotes:
                process.terminate()
            for process in remotes:
                process.wait(20)
            for responder in responders:
                _stop(responder)
    report(rows)


def _round(
    runtime: Runtime, url: str, targets: list[str], local: str, threaded: _Threaded
) -> dict[str, float]:
    raw, raw_rate = _raw_ask(url)
    from_thread = _timed(threaded.one, N)
    floor = _timed(lambda: threaded.one("raw.hop"), N)
    cross = _timed(lambda: runtime.ask(targets[0], "x", 1), N)
    started = time.perf_counter()
    for _ in range(N // 16):
        wait([runtime.ask_future(targets[0], "x", 1) for _ in range(16)])
    cross_rate = (N // 16) * 16 / (time.perf_counter() - started)
    inproc = _timed(lambda: runtime.ask(local, "x", 1), N)
    out = {
        "raw_p50": median(raw),
        "raw_p99": p(raw, 0.99),
        "raw_rate": raw_rate,
        "thread_p50": median(from_thread),
        "floor_p50": median(floor),
        "cross_p50": median(cross),
        "cross_p99": p(cross, 0.99),
        "cross_rate": cross_rate,
        "inproc_p50": median(inproc),
        "one_sender": _rate(runtime, targets[:1], 1),
    }
    out["raw_pipelined"] = _raw_pipelined(url)
    out["pipelined"], out["pipelined_cpu_us"] = _pipelined(runtime, targets[0])
    for k in (1, 2, 3):
        out[f"raw_sends_{k}"] = _raw_sends(url, k)
        out[f"sends_{k}"] = _rate(runtime, targets[:k], SENDERS)
    out["in_process_sends"] = _rate(runtime, [local], 1)
    return out


def _rows(rounds: list[dict[str, float]]) -> list[dict[str, object]]:
    """Medians over the rounds; each ratio is the median of the rounds' own ratios."""

    def m(key: str) -> float:
        return median([r[key] for r in rounds])

    def ratio(a: str, b: str) -> float:
        return round(median([r[a] / r[b] for r in rounds]), 2)

    rows: list[dict[str, object]] = [
        {
            "name": "raw nats-py request/reply (baseline)",
            "p50_us": round(m("raw_p50") * 1e6, 1),
            "p99_us": round(m("raw_p99") * 1e6, 1),
            "rt_per_s_16_in_flight": round(m("raw_rate")),
        },
        {
            "name": "raw nats-py request from a thread",
            "p50_us": round(m("thread_p50") * 1e6, 1),
            "p50_vs_raw": ratio("thread_p50", "raw_p50"),
        },
        {
            "name": "raw floor: from a thread, replied from a responder's worker thread",
            "p50_us": round(m("floor_p50") * 1e6, 1),
            "p50_vs_raw": ratio("floor_p50", "raw_p50"),
        },
        {
            "name": "cross-node ask (mighty)",
            "p50_us": round(m("cross_p50") * 1e6, 1),
            "p99_us": round(m("cross_p99") * 1e6, 1),
            "rt_per_s_16_in_flight": round(m("cross_rate")),
            "p50_vs_raw": ratio("cross_p50", "raw_p50"),
            "p50_vs_raw_from_a_thread": ratio("cross_p50", "thread_p50"),
            "p50_vs_raw_floor": ratio("cross_p50", "floor_p50"),
            "rate_16_raw_vs_mighty": ratio("raw_rate", "cross_rate"),
            "target_p50_vs_raw": 1.5,
        },
        {
            "name": "in-process ask (same runtime)",
            "p50_us": round(m("inproc_p50") * 1e6, 1),
            "cross_node_p50_vs_in_process": ratio("cross_p50", "inproc_p50"),
        },
    ]
    for k in (1, 2, 3):
        rows.append(
            {
                "name": f"sends/s to agents on {k} node(s), {SENDERS} senders",
                "sends_per_s": round(m(f"sends_{k}")),
                "raw_requests_per_s": round(m(f"raw_sends_{k}")),
                "raw_vs_mighty": ratio(f"raw_sends_{k}", f"sends_{k}"),
                "vs_one_node": ratio(f"sends_{k}", "sends_1"),
                **({"one_sender_one_node": round(m("one_sender"))} if k == 1 else {}),
            }
        )
    rows.append(
        {
            "name": "pipelined sends/s from one sender (send_future), one node",
            "sends_per_s": round(m("pipelined")),
            "sender_thread_cpu_us_per_send": round(m("pipelined_cpu_us"), 1),
            "raw_requests_per_s_64_in_flight": round(m("raw_pipelined")),
            "mighty_vs_raw": ratio("pipelined", "raw_pipelined"),
            "vs_one_at_a_time": ratio("pipelined", "one_sender"),
            "target_sends_per_s": 10_000,
        }
    )
    rows.append(
        {
            "name": "in-process sends/s (only enqueues)",
            "sends_per_s": round(m("in_process_sends")),
        }
    )
    return rows


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


def _partition(server: NatsServer, echo: Component) -> dict[str, object]:
    """A node cut off (its NATS link stalled by a loopback proxy, the one tests/cluster uses):
    the time to its fence, to the survivor declaring it dead, to the survivor answering for
    the name, and from the heal to the yield. Default heartbeat and dead_after."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.cluster._proxy import Proxy

    proxy = Proxy(server.port)
    config = parse_cluster(
        {"servers": [server.url], "name": "bench-part", "peers": {"p1": {}, "p2": {}}}
    )
    cut = config.model_copy(update={"servers": [proxy.url]})
    made = []
    for name, conf in (("p1", config), ("p2", cut)):
        runtime = Runtime(workers=1)
        runtime.register(AgentType("echo", echo))
        made.append((runtime, Node(runtime, conf, name=name).start()))
    (r1, n1), (r2, n2) = made
    dead: dict[str, float] = {}

    def heard(node: str, alive: bool) -> None:
        if not alive:
            dead.setdefault(node, time.monotonic())

    n1.on_membership(heard)
    fences, deaths, answers, yields = [], [], [], []
    try:
        for i in range(5):
            n1.wait_for(["p2"], 30)
            n2.wait_for(["p1"], 30)
            name = f"ledger{i}"
            r2.spawn("echo", name=name)
            while n1.whereis(name) is None:
                time.sleep(0.01)
            dead.clear()
            started = time.monotonic()
            proxy.pause()
            while "p2" not in dead:
                time.sleep(0.005)
            r1.spawn("echo", name=name)
            r1.ask(name, "x", 1)
            answered = time.monotonic()
            fences.append(n2.fence.fenced_at - started)
            deaths.append(dead["p2"] - started)
            answers.append(answered - started)
            healed = time.monotonic()
            proxy.resume()
            while name not in n2.fence.yielded:
                time.sleep(0.005)
            yields.append(time.monotonic() - healed)
        return {
            "name": "partition of one node (5 cuts, heartbeat 0.5 s, dead_after 2 s)",
            "heartbeat_s": config.heartbeat,
            "dead_after_s": config.dead_after,
            "fence_after_s": n2.fence.after,
            "load_average": round(os.getloadavg()[0], 2),
            "to_fence_p50_s": round(median(fences), 2),
            "to_declared_dead_p50_s": round(median(deaths), 2),
            "to_survivor_answering_p50_s": round(median(answers), 2),
            "heal_to_yield_p50_s": round(median(yields), 2),
            "fence_vs_dead_after": round(median(fences) / config.dead_after, 2),
            "answering_vs_dead_after": round(median(answers) / config.dead_after, 2),
            "fenced_before_dead": all(f < d for f, d in zip(fences, deaths, strict=True)),
        }
    finally:
        proxy.resume()
        for runtime, node in reversed(made):
            runtime.shutdown(drain=False, timeout=2)
            node.close()
        proxy.close()


def _supervised_partition(server: NatsServer, echo: Component) -> dict[str, object]:
    """The cluster supervisor's node cut off, with its child on it (what the partition ledger
    test does, timed): from the cut to the fenced node's stop (its agents paused), to another
    node holding the supervisor's lease, and to the child answering on a survivor (restarted
    there by the new holder: the survivors answering). 3 nodes, each behind its own proxy;
    each cut is of the current holder. Ratios against dead_after, the time a survivor must
    wait before it may act (fence_after and the lease's takeover follow from it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from mighty.cluster import ClusterSupervisorModel, SupervisorLease
    from tests.cluster._proxy import Proxy

    names = ("s1", "s2", "s3")
    data = {
        "servers": [server.url],
        "name": "bench-sup",
        "peers": {n: {} for n in names},
        "heartbeat": 0.2,
        "dead_after": 1.5,
    }
    config = parse_cluster(data)
    plan = ClusterSupervisorModel.model_validate(
        {"node": "s1", "intensity": 100, "children": [{"name": "led", "type": "echo"}]}
    )
    proxies = {n: Proxy(server.port) for n in names}
    made: dict[str, tuple[Runtime, Node]] = {}
    leases: dict[str, SupervisorLease] = {}
    fences, takeovers, answers = [], [], []
    try:
        for name in names:
            runtime = Runtime(workers=1)
            runtime.register(AgentType("echo", echo))
            conf = config.model_copy(update={"servers": [proxies[name].url]})
            made[name] = (runtime, Node(runtime, conf, name=name).start())
        for _, node in made.values():
            node.wait_for(list(names), 30)
        for name in names:
            leases[name] = SupervisorLease(made[name][1], plan).start()
        for _ in range(3):
            deadline = time.monotonic() + 120
            while True:  # settled: one holder, the child on its node, nobody fenced
                held = [n for n in names if leases[n].held]
                where = made[names[0]][1].whereis("led") or ""
                fenced = [n for n in names if made[n][1].fence.fenced]
                if len(held) == 1 and where.startswith(f"{held[0]}:") and not fenced:
                    break
                if len(held) == 1 and not fenced and where and not where.startswith(held[0]):
                    owner = where.partition(":")[0]  # move the child to the holder's node
                    made[owner][1].migrate("led", held[0])
                assert time.monotonic() < deadline, (held, where, fenced)
                time.sleep(0.05)
            victim = held[0]
            other = next(n for n in names if n != victim)
            runtime, node = made[other]
            started = time.monotonic()
            proxies[victim].pause()
            took = 0.0
            while True:
                if not took and any(leases[n].held for n in names if n != victim):
                    took = time.monotonic()
                owner = node.whereis("led") or ""
                if owner and not owner.startswith(f"{victim}:"):
                    try:
                        runtime.ask("led", "x", 1, timeout=2)
                        break
                    except Exception:  # noqa: BLE001 -- not yet answering: ask again
                        pass
                assert time.monotonic() < started + 120, "never answered elsewhere"
                time.sleep(0.005)
            answered = time.monotonic()
            while not took:
                took = time.monotonic() if any(leases[n].held for n in names if n != victim) else 0
                time.sleep(0.005)
            fences.append(made[victim][1].fence.fenced_at - started)
            takeovers.append(took - started)
            answers.append(answered - started)
            proxies[victim].resume()
            while made[victim][1].fence.fenced or "led" not in made[victim][1].fence.yielded:
                assert time.monotonic() < answered + 120, "the victim never yielded"
                time.sleep(0.01)
            made[victim][1].fence.yielded.clear()
        return {
            "name": "partition of the supervisor's node (3 cuts, 3 nodes, its child on it)",
            "heartbeat_s": config.heartbeat,
            "dead_after_s": config.dead_after,
            "fence_after_s": made[names[0]][1].fence.after,
            "load_average": round(os.getloadavg()[0], 2),
            "to_fenced_stop_p50_s": round(median(fences), 2),
            "to_lease_taken_p50_s": round(median(takeovers), 2),
            "to_survivors_answering_p50_s": round(median(answers), 2),
            "to_survivors_answering_max_s": round(max(answers), 2),
            "fence_vs_dead_after": round(median(fences) / config.dead_after, 2),
            "answering_vs_dead_after": round(median(answers) / config.dead_after, 2),
        }
    finally:
        for proxy in proxies.values():
            proxy.resume()
        for lease in leases.values():
            lease.stop()
        for runtime, node in reversed(list(made.values())):
            runtime.shutdown(drain=False, timeout=2)
            node.close()
        for proxy in proxies.values():
            proxy.close()


if __name__ == "__main__":
    main()
