"""Hot swap pause: time from an agent's mailbox pausing to its resuming, for 1 and 100 agents.

Run: .venv/bin/python benchmarks/bench_reload.py [--json]

All agents of a type pause together and resume together (the swap is one transaction), so the
pause grows with the number of agents: each needs a snapshot, a new instance and a restore.
Baseline in the same run: one ask to a running agent (the per-message time the pause is
measured against).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from _common import ROOT, median, report, samples

from mighty import Component
from mighty.agents import AgentChild, AgentType, Runtime, SupervisorSpec, start_tree
from mighty.build import build_component


def _build(source: Path, tmp: Path) -> Path:
    out = tmp / f"{source.stem}.wasm"
    build_component(
        source, output=out, wit=ROOT / "wit" / "agent", python_path=[ROOT / "guests" / "sdk"]
    )
    return out


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    v1 = _build(ROOT / "examples" / "agents" / "counter.py", tmp)
    v2 = _build(ROOT / "guests" / "testing" / "counter" / "v2.py", tmp)
    Component.load(v2)  # compiled before timing
    rows = []
    for count in (1, 100):
        with Runtime(workers=2) as rt:
            rt.register(AgentType("counter", Component.load(v1)))
            start_tree(
                rt, SupervisorSpec("root", [AgentChild(f"c{i}", "counter") for i in range(count)])
            )
            ask = median(samples(lambda: rt.ask("c0", "incr", {"by": 1}), repeat=200))
            started = time.perf_counter()
            result = rt.reload("counter", v2)
            total = time.perf_counter() - started
            assert len(result.agents) == count
        rows.append(
            {
                "name": f"swap pause, {count} agent(s)",
                "max_pause_ms": round(max(result.pauses) * 1e3, 2),
                "pause_per_agent_ms": round(max(result.pauses) * 1e3 / count, 2),
                "reload_total_ms": round(total * 1e3, 2),
                "one_ask_ms": round(ask * 1e3, 3),
                "pause_over_ask": round(max(result.pauses) / ask, 1),
            }
        )
    report(rows)


if __name__ == "__main__":
    main()
