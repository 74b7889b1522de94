"""Hibernation: many idle CPython agents asleep in the snapshot store, and how fast they wake.

Run: .venv/bin/python benchmarks/bench_hibernate.py [--json] [--quick] [--agents N]

One process, one ``mighty.agents.Runtime`` with a ``state_dir`` in a temporary directory, the
counter example (examples/agents/counter.py, a componentize-py CPython agent):

1. spawn rate: spawn N agents, each handling one message and hibernated by hand right after
   (so at most one is awake at a time); agents/s for spawn + message + hibernate;
2. memory with N agents asleep: VmRSS and PSS (``/proc/self/smaps_rollup``) against the figures
   before the spawns, per agent (target: <= 40 KB per idle agent, <= 4 GB for 100,000), the
   store's size on disk; baseline: the PSS per agent of ``AWAKE`` agents left awake, in the
   same run;
3. wake latency of one agent: an ask to a hibernated agent (wake + restore + the message) and
   the wake alone (``hibernation_stats``), p50/p99 (target p50 <= 5 ms), against the baseline
   of a plain instantiate + ``handle`` call of a new instance of the same component, the two
   interleaved;
4. wake throughput: ``WAKES`` hibernated agents sent one message each (wakes/s), the idle
   timer putting them back to sleep after 1 s as they finish (a burst: every wake comes before
   any agent went back to sleep, so few find a reused instance);
5. wake cycles: one caller asks a hibernated agent and hibernates it again, round robin over
   16 agents (wakes/s, process CPU per cycle), with instances reused (the default) against
   ``Runtime(reuse_instances=False)`` (every instance made from the image), the two runtimes
   taking turns in rounds;
6. asks to hibernated agents with the idle timer (50 ms) putting them back to sleep: one caller
   asks 400 agents round robin for 4 s (each asleep again when its turn comes back), wakes/s
   and process CPU per wake, reuse on against off (the best of two runs each).

``--quick``: 2,000 agents and 1,000 wakes (a smoke test); the default is 100,000 and 10,000.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from _common import ROOT, p, report

if TYPE_CHECKING:
    from mighty import Component

QUICK = "--quick" in sys.argv
AGENTS = 2_000 if QUICK else 100_000
WAKES = 1_000 if QUICK else 10_000
AWAKE = 100
CYCLE_AGENTS = 16
STEADY_AGENTS = 400
STEADY_S = 2.0 if QUICK else 4.0
SAMPLES = 200 if QUICK else 500
if "--agents" in sys.argv:
    AGENTS = int(sys.argv[sys.argv.index("--agents") + 1])
    WAKES = min(WAKES, AGENTS)


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def memory() -> dict[str, int]:
    """VmRSS and the Pss of smaps_rollup, in bytes."""
    out: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            out["rss"] = int(line.split()[1]) * 1024
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key == "Pss":
            out["pss"] = int(rest.split()[0]) * 1024
    return out


def _counter() -> Path:
    from mighty.build import build_component

    out = Path(tempfile.mkdtemp()) / "counter.wasm"
    build_component(
        ROOT / "examples" / "agents" / "counter.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return out


def main() -> None:
    from mighty import Component
    from mighty.agents import AgentType, Runtime
    from mighty.instance import Instance

    component = Component.load(_counter())
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as state, Runtime(workers=2, state_dir=state) as rt:
        rt.register(AgentType("counter", component, hibernate_after=1.0))
        assert rt.hibernation is not None
        warm = rt.spawn("counter")
        rt.ask(warm, "incr")
        rt.hibernate(warm)
        rt.ask(warm, "incr")
        gc.collect()
        base = memory()

        # 1. spawn, one message, hibernate.
        addresses: list[str] = []
        started = time.perf_counter()
        for i in range(AGENTS):
            address = rt.spawn("counter")
            rt.ask(address, "incr", {"by": i})
            if not rt.hibernate(address):
                raise SystemExit(f"{address} did not hibernate")
            addresses.append(address)
            if i and i % 10_000 == 0:
                print(f"  {i} agents asleep ({time.perf_counter() - started:.0f} s)", flush=True)
        spawn_s = time.perf_counter() - started
        rows.append(
            {
                "name": f"spawn+message+hibernate x{AGENTS}",
                "agents_per_s": round(AGENTS / spawn_s, 1),
                "total_s": round(spawn_s, 1),
                "load": load(),
            }
        )

        # 2. memory asleep, vs agents left awake.
        gc.collect()
        asleep = memory()
        per_rss = (asleep["rss"] - base["rss"]) / AGENTS
        per_pss = (asleep["pss"] - base["pss"]) / AGENTS
        rt.hibernation.store.checkpoint()
        store = rt.hibernation.store.size_bytes()
        awake = [rt.spawn("counter") for _ in range(AWAKE)]
        for address in awake:
            rt.ask(address, "incr")
        gc.collect()
        with_awake = memory()
        awake_pss = (with_awake["pss"] - asleep["pss"]) / AWAKE
        for address in awake:
            rt.hibernate(address)
        rows.append(
            {
                "name": f"memory, {AGENTS} asleep",
                "rss_total_mb": round(asleep["rss"] / 1e6, 1),
                "pss_total_mb": round(asleep["pss"] / 1e6, 1),
                "rss_per_agent_kb": round(per_rss / 1e3, 2),
                "pss_per_agent_kb": round(per_pss / 1e3, 2),
                "awake_pss_per_agent_kb": round(awake_pss / 1e3, 1),
                "asleep_vs_awake": round(per_pss / awake_pss, 4),
                "store_mb": round(store / 1e6, 2),
                "store_per_agent_b": round(store / AGENTS),
            }
        )

        # 3. one wake, interleaved with the baseline (instantiate + handle).
        wake_ask: list[float] = []
        baseline: list[float] = []
        rng = random.Random(1)
        before_latencies = len(rt.hibernation.latencies())
        for _ in range(SAMPLES):
            address = rng.choice(addresses)
            t0 = time.perf_counter()
            rt.ask(address, "get")
            wake_ask.append(time.perf_counter() - t0)
            rt.hibernate(address)
            t0 = time.perf_counter()
            fresh = Instance(component, gate=rt.gate)
            fresh.call("handle", "host", {"name": "get", "body": b""})
            baseline.append(time.perf_counter() - t0)
            fresh.close()
        wakes_only = rt.hibernation.latencies()[before_latencies:]
        rows.append(
            {
                "name": "wake one agent (ask a hibernated agent)",
                "p50_ms": round(p(wake_ask, 0.5) * 1e3, 3),
                "p99_ms": round(p(wake_ask, 0.99) * 1e3, 3),
                "wake_only_p50_ms": round(p(wakes_only, 0.5) * 1e3, 3),
                "wake_only_p99_ms": round(p(wakes_only, 0.99) * 1e3, 3),
                "baseline_p50_ms": round(p(baseline, 0.5) * 1e3, 3),
                "baseline_p99_ms": round(p(baseline, 0.99) * 1e3, 3),
                "ratio_p50": round(p(wake_ask, 0.5) / p(baseline, 0.5), 2),
                "samples": SAMPLES,
                "load": load(),
            }
        )

        # 4. throughput: WAKES asleep agents, one message each.
        targets = rng.sample(addresses, WAKES)
        wakes_before = rt.hibernation.stats.wakes
        started = time.perf_counter()
        for address in targets:
            rt.send(address, "incr")
        if not rt.drain(600):
            raise SystemExit("the wakes did not drain")
        took = time.perf_counter() - started
        woke = rt.hibernation.stats.wakes - wakes_before
        rows.append(
            {
                "name": f"wake {WAKES} agents, one message each",
                "wakes_per_s": round(woke / took, 1),
                "woke": woke,
                "total_s": round(took, 2),
                "peak_rss_mb": round(memory()["rss"] / 1e6, 1),
                "load": load(),
            }
        )
        rows.append({"name": "hibernation_stats", **rt.hibernation_stats()})
        rows.append({"name": "seats", **rt.seats.stats.to_json()})
    rows.extend(cycles(component))
    rows.extend(steady(component))
    report(rows)


def steady(component: Component) -> list[dict[str, object]]:
    """6. wakes with the idle timer: ``STEADY_AGENTS`` agents of a type that hibernates after
    50 ms idle; one caller asks them round robin for ``STEADY_S`` seconds (each is asleep again
    by the time its turn comes back); wakes/s and process CPU per wake (the timer's
    hibernations included), instances reused against ``reuse_instances=False``, one after
    the other, twice each."""
    from mighty.agents import AgentType, Runtime

    out: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    stats: dict[str, int] = {}
    for _ in range(2):
        for reuse in (True, False):
            with (
                tempfile.TemporaryDirectory() as state,
                Runtime(workers=1, state_dir=state, reuse_instances=reuse) as rt,
            ):
                rt.register(AgentType("counter", component, hibernate_after=0.05))
                assert rt.hibernation is not None
                rt.spawn("counter")  # the type's first instance
                group = [rt.spawn("counter") for _ in range(STEADY_AGENTS)]
                for address in group:
                    rt.ask(address, "incr")
                    rt.hibernate(address, timeout=5.0)
                woke = rt.hibernation.stats.wakes
                t0, c0 = time.perf_counter(), time.process_time()
                stop, i = t0 + STEADY_S, 0
                while time.perf_counter() < stop:
                    rt.ask(group[i % len(group)], "incr", timeout=60)
                    i += 1
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                woke = rt.hibernation.stats.wakes - woke
                out[reuse].append((woke / wall, cpu / max(woke, 1) * 1e3))
                if reuse:
                    stats = rt.seats.stats.to_json()

    def best(reuse: bool) -> tuple[float, float]:
        return max(out[reuse])

    return [
        {
            "name": "asks to hibernated agents, idle timer 50 ms, 1 caller",
            "wakes_per_s": round(best(True)[0], 1),
            "cpu_ms_per_wake": round(best(True)[1], 3),
            "baseline_wakes_per_s": round(best(False)[0], 1),
            "baseline_cpu_ms_per_wake": round(best(False)[1], 3),
            "ratio": round(best(True)[0] / best(False)[0], 2),
            "runs": [[round(w, 1) for w, _ in out[r]] for r in (True, False)],
            "seats": stats,
            "load": load(),
        }
    ]


def cycles(component: Component) -> list[dict[str, object]]:
    """5. wake cycles: ``CYCLE_AGENTS`` agents asleep; one caller thread asks one (it wakes),
    then hibernates it, round robin; instances reused (seats) against every instance made
    from the image (``reuse_instances=False``), in two runtimes taking turns in rounds."""
    from mighty.agents import AgentType, Runtime

    class Still:
        def __call__(self) -> float:
            return 0.0

    rounds, per_round = (3, 300) if QUICK else (5, 1_000)
    out: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as state:
        runtimes = {
            reuse: Runtime(
                workers=1,
                state_dir=Path(state) / str(reuse),
                clock=Still(),
                reuse_instances=reuse,
            )
            for reuse in (True, False)
        }
        try:
            agents: dict[bool, list[str]] = {}
            for reuse, rt in runtimes.items():
                rt.register(AgentType("counter", component, hibernate_after=1000.0))
                rt.spawn("counter")  # the type's first instance (kept awake)
                agents[reuse] = [rt.spawn("counter") for _ in range(CYCLE_AGENTS)]
                for address in agents[reuse]:
                    rt.ask(address, "incr")
                    rt.hibernate(address, timeout=5.0)
            for _ in range(rounds):
                for reuse, rt in runtimes.items():
                    group = agents[reuse]
                    t0, c0 = time.perf_counter(), time.process_time()
                    for i in range(per_round):
                        address = group[i % len(group)]
                        rt.ask(address, "incr")
                        if not rt.hibernate(address, timeout=5.0):
                            raise SystemExit(f"{address} did not hibernate")
                    out[reuse].append((time.perf_counter() - t0, time.process_time() - c0))
            stats = runtimes[True].seats.stats.to_json()
        finally:
            for rt in runtimes.values():
                rt.shutdown()

    def rate(reuse: bool) -> float:
        return sorted(per_round / wall for wall, _ in out[reuse])[len(out[reuse]) // 2]

    def cpu_ms(reuse: bool) -> float:
        return sorted(cpu / per_round * 1e3 for _, cpu in out[reuse])[len(out[reuse]) // 2]

    return [
        {
            "name": "wake cycles (ask a hibernated agent, hibernate it), 1 caller",
            "wakes_per_s": round(rate(True), 1),
            "cpu_ms_per_cycle": round(cpu_ms(True), 3),
            "baseline_wakes_per_s": round(rate(False), 1),
            "baseline_cpu_ms_per_cycle": round(cpu_ms(False), 3),
            "ratio": round(rate(True) / rate(False), 2),
            "rounds": rounds,
            "per_round": per_round,
            "seats": stats,
            "load": load(),
        }
    ]


if __name__ == "__main__":
    main()
