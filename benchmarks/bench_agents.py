"""Agent runtime costs, each against a baseline measured in the same run.

Run: .venv/bin/python benchmarks/bench_agents.py [--json]

- per-message overhead: a host `ask` to the WAT echo agent through the runtime (mailbox,
  scheduler, protocol, future) vs calling its `handle` export directly on an Instance.
- guest-to-guest ping-pong: asks between two CPython agents, messages per second.
- CPU-bound throughput with 1 vs 2 workers (target >= 1.8x on 2 cores).
- resident memory per idle agent after one handled message: CPython agent with copy-on-write
  memory images (the default) vs the same component loaded with ``share_memory=False``, and the
  WAT agent. RSS counts a shared image page once per mapping that touched it; PSS (from
  /proc/self/smaps_rollup) shares it out and is the honest figure. bench_instances.py does
  1,000 CPython agents, each variant in a fresh process.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from pathlib import Path

from _common import FIXTURES, ROOT, median, report, samples, wasm_tools

from mighty import Component, Instance
from mighty.agents import AgentType, Runtime
from mighty.build import build_component

SPIN = """
    (func $spin (local $i i32)
      (loop $l
        local.get $i i32.const 1 i32.add local.tee $i
        i32.const 3000000 i32.lt_u br_if $l))"""


def _component(text: str) -> Component:
    import subprocess

    done = subprocess.run(
        [wasm_tools(), "parse", "-", "-o", "/dev/stdout"],
        input=text.encode(),
        capture_output=True,
        check=True,
    )
    return Component.load(done.stdout)


def _memory() -> tuple[int, int]:
    """(VmRSS, Pss) of this process, in bytes."""
    rss = pss = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            pss = int(line.split()[1]) * 1024
    return rss, pss


def main() -> None:
    wat = (FIXTURES / "echo_agent.wat").read_text()
    echo = _component(wat)
    spin = _component(
        wat.replace('(func (export "reset0")', SPIN + '\n    (func (export "reset0")').replace(
            "(local $r i32) (local $name i32)\n",
            "(local $r i32) (local $name i32)\n      call $spin\n",
        )
    )
    tmp = Path(tempfile.mkdtemp())
    out = tmp / "pingpong.wasm"
    build_component(
        ROOT / "examples" / "agents" / "pingpong.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    pingpong = Component.load(out)
    rows = []

    message = {"name": "x", "body": b"\x01"}
    with Runtime(workers=2) as rt:
        direct = Instance(echo, gate=rt.gate)
        floor = median(samples(lambda: direct.call("handle", "host", message), repeat=3000))
        rt.register(AgentType("echo", echo))
        address = rt.spawn("echo")
        via = median(samples(lambda: rt.ask(address, "x", 1), repeat=3000))
    rows.append(
        {
            "name": "per-message: runtime ask / direct handle call",
            "ratio": round(via / floor, 2),
            "ask_us": round(via * 1e6, 1),
            "direct_us": round(floor * 1e6, 1),
            "asks_per_s": round(1 / via),
        }
    )

    with Runtime(workers=2) as rt:
        rt.register(AgentType("pp", pingpong))
        rt.spawn("pp", name="a")
        rt.spawn("pp", name="b")
        rt.ask("a", "start", {"peer": "b", "rounds": 50})
        started = time.perf_counter()
        rt.ask("a", "start", {"peer": "b", "rounds": 500}, timeout=60)
        elapsed = time.perf_counter() - started
    rows.append(
        {
            "name": "guest-to-guest ping-pong (CPython agents)",
            "round_trips_per_s": round(500 / elapsed),
            "us_per_round_trip": round(elapsed / 500 * 1e6, 1),
        }
    )

    def throughput(workers: int) -> float:
        with Runtime(workers=workers) as rt:
            rt.register(AgentType("spin", spin))
            agents = [rt.spawn("spin") for _ in range(8)]
            started = time.perf_counter()
            futures = [rt.ask_future(agents[i % 8], "x", i) for i in range(400)]
            for future in futures:
                future.result(120)
            return 400 / (time.perf_counter() - started)

    one, two = throughput(1), throughput(2)
    rows.append(
        {
            "name": "CPU-bound messages/s: 2 workers / 1 worker",
            "ratio": round(two / one, 2),
            "one_worker": round(one, 1),
            "two_workers": round(two, 1),
            "target": ">= 1.8",
        }
    )

    copying = Component.load(out, share_memory=False)
    per_agent: dict[str, tuple[int, int]] = {}
    for name, component, count in (
        ("CPython agent", pingpong, 50),
        ("CPython agent, share_memory=False", copying, 50),
        ("WAT agent", echo, 1000),
    ):
        with Runtime(workers=1) as rt:
            rt.register(AgentType("idle", component))
            rt.ask(rt.spawn("idle"), "ping", {"n": 1})  # one-time costs out of the delta
            gc.collect()
            before = _memory()
            addresses = [rt.spawn("idle") for _ in range(count)]
            for future in [rt.ask_future(a, "ping", {"n": 1}) for a in addresses]:
                future.result(60)
            gc.collect()
            after = _memory()
        per_agent[name] = (
            (after[0] - before[0]) // count,
            (after[1] - before[1]) // count,
        )
        rows.append(
            {
                "name": f"memory per idle {name} (1 message handled)",
                "rss_bytes": per_agent[name][0],
                "pss_bytes": per_agent[name][1],
                "agents": count,
            }
        )
    images, old = per_agent["CPython agent"], per_agent["CPython agent, share_memory=False"]
    rows.append(
        {
            "name": "memory per idle CPython agent: images / share_memory=False",
            "ratio_rss": round(images[0] / old[0], 3),
            "ratio_pss": round(images[1] / old[1], 3),
            "target": "<= 1 MB per agent (PSS)",
            "met": images[1] <= 1_000_000,
        }
    )
    rows.append(
        {"name": "machine", "loadavg_1_5_15": "/".join(f"{x:.2f}" for x in os.getloadavg())}
    )
    report(rows)


if __name__ == "__main__":
    main()
