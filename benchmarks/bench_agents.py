"""Agent runtime costs, each against a baseline measured in the same run.

Run: .venv/bin/python benchmarks/bench_agents.py [--json]

- per-message overhead: a host `ask` to the WAT echo agent through the runtime (mailbox,
  scheduler, protocol, future) vs calling its `handle` export directly on an Instance.
- guest-to-guest ping-pong: asks between two CPython agents, messages per second.
- CPU-bound throughput with 1 vs 2 workers (target >= 1.8x on 2 cores).
- resident memory per idle agent (CPython agent and WAT agent).
"""

from __future__ import annotations

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


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


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

    for name, component, count in (("CPython agent", pingpong, 100), ("WAT agent", echo, 1000)):
        with Runtime(workers=1) as rt:
            rt.register(AgentType("idle", component))
            before = _rss()
            for _ in range(count):
                rt.spawn("idle")
            after = _rss()
        rows.append(
            {
                "name": f"resident memory per idle {name}",
                "bytes": (after - before) // count,
                "agents": count,
            }
        )
    report(rows)


if __name__ == "__main__":
    main()
