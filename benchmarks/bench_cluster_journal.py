"""Cluster durable messages: what the import journal in JetStream costs (mighty.cluster._journal).

Run: .venv/bin/python benchmarks/bench_cluster_journal.py [--json] [--quick]

Two in-process nodes on a local nats-server: node a runs two agents of the durable type
`steps` (tests/cluster/journal_agent/steps.py), whose `run` message calls a host tool 10
times; node t sends them `run` by name (stored in JetStream, consumed on a). Agent `jr` has the
journal (each of the 10 tool calls appended to the journal stream and acknowledged before the
guest sees it, the journal purged after the state is stored); agent `nj` was spawned with the
journal switched off (the durable path of before: handle, snapshot, store, ack). In turns,
round after round:

1. sequential: send one message, wait until node a has stored and acknowledged it; p50 per
   message, and the ratio with / without.
2. burst: 100 messages sent at once, the time until all are stored and acknowledged (the
   consumer takes batches of up to 16, one snapshot each); messages/s, and the ratio.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, median, report

sys.path.insert(0, str(ROOT))

QUICK = "--quick" in sys.argv
ROUNDS = 2 if QUICK else 4
SEQUENTIAL = 20 if QUICK else 60
BURST = 50 if QUICK else 100
IMPORTS = 10


def main() -> None:
    from mighty import Component
    from mighty.agents import AgentType, Grants, Runtime
    from mighty.capabilities import Capabilities
    from mighty.cluster import NatsServer, Node, parse_cluster
    from tests.agents.conftest import _build_path

    agent = ROOT / "tests" / "cluster" / "journal_agent"
    steps = Component.load(_build_path("steps", Path(tempfile.mkdtemp()), agent))

    def step(i: int, idempotency_key: str = "") -> int:
        """The benchmark's tool: answers at once."""
        return 10 * i + 1

    rows: dict[str, list[float]] = {"seq_nj": [], "seq_jr": [], "burst_nj": [], "burst_jr": []}
    with NatsServer() as server:
        data = {
            "servers": [server.url],
            "peers": {"a": {}, "t": {"spawn": False}},
            "heartbeat": 0.2,
            "dead_after": 2.0,
            "durable": ["steps"],
        }
        made: list[tuple[Runtime, Node]] = []
        for name in ("a", "t"):
            runtime = Runtime(workers=2, capabilities=Capabilities().with_tool("step", step))
            grants = Grants(tools=frozenset({"step"}))
            runtime.register(AgentType("steps", steps, grants=grants))
            made.append((runtime, Node(runtime, parse_cluster(data), name=name).start()))
        (_ra, node_a), (rt, _nt) = made
        try:
            journal = node_a.durable.journal
            journal.uninstall()
            node_a.spawn_on("a", "steps", name="nj", supervise=(10, 5.0))
            journal.install()
            node_a.spawn_on("a", "steps", name="jr", supervise=(10, 5.0))
            body = {"n": IMPORTS}

            def settle(goal: int) -> None:
                deadline = time.monotonic() + 300
                while node_a.durable.handled < goal:
                    assert time.monotonic() < deadline, "messages left unhandled"
                    time.sleep(0.0005)

            for target in ("nj", "jr"):  # warm-up: a first message each
                goal = node_a.durable.handled + 1
                rt.send(target, "run", body, timeout=30)
                settle(goal)
            for _ in range(ROUNDS):
                for target in ("nj", "jr"):
                    times = []
                    for _ in range(SEQUENTIAL):
                        goal = node_a.durable.handled + 1
                        started = time.perf_counter()
                        rt.send(target, "run", body, timeout=30)
                        settle(goal)
                        times.append(time.perf_counter() - started)
                    rows[f"seq_{target}"].append(median(times))
                    goal = node_a.durable.handled + BURST
                    started = time.perf_counter()
                    for _ in range(BURST):
                        rt.send(target, "run", body, timeout=30)
                    settle(goal)
                    rows[f"burst_{target}"].append(BURST / (time.perf_counter() - started))
            published = journal.published
        finally:
            for runtime, node in reversed(made):
                runtime.shutdown(drain=False, timeout=2)
                node.close()
    seq_nj, seq_jr = median(rows["seq_nj"]), median(rows["seq_jr"])
    burst_nj, burst_jr = median(rows["burst_nj"]), median(rows["burst_jr"])
    result: dict[str, object] = {
        "name": "cluster durable message, 10 tool calls",
        "load": "/".join(f"{x:.2f}" for x in os.getloadavg()),
        "sequential_p50_ms_without": round(seq_nj * 1e3, 2),
        "sequential_p50_ms_with": round(seq_jr * 1e3, 2),
        "sequential_ratio": round(seq_jr / seq_nj, 2),
        "burst_msgs_per_s_without": round(burst_nj, 1),
        "burst_msgs_per_s_with": round(burst_jr, 1),
        "burst_ratio": round(burst_nj / burst_jr, 2),
        "journal_entries_published": published,
    }
    report([result])


if __name__ == "__main__":
    main()
