"""Hot swap of counter agents: total reload time and the pause, images on vs share_memory=False.

Run: .venv/bin/python benchmarks/bench_reload.py [--json]

All agents of a type pause together and resume together (the swap is one transaction), so the
pause grows with the number of agents: each needs a snapshot, a new instance and a restore.
Measured for 1 and 100 counter agents (examples/agents/counter.py -> guests/testing/counter/v2.py)
with copy-on-write memory images (the default), and for 100 agents with both versions loaded
with ``share_memory=False`` (the old copying path; `reload` loads the new version itself, so
the benchmark makes its `Component.load` pass ``share_memory=False`` for that run).
Target: 100 agents swapped in <= 1 s in total. Baselines in the same run: the copying path, and
one ask to a running agent (what the pause is measured against).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, median, report, samples

import mighty.agents._swap as swap
from mighty import Component
from mighty.agents import AgentChild, AgentType, Runtime, SupervisorSpec, start_tree
from mighty.build import build_component


def _build(source: Path, tmp: Path) -> Path:
    out = tmp / f"{source.stem}.wasm"
    build_component(
        source, output=out, wit=ROOT / "wit" / "agent", python_path=[ROOT / "guests" / "sdk"]
    )
    return out


class _Copying:
    """Stands in for ``Component`` inside ``mighty.agents._swap``: loads without images."""

    @staticmethod
    def load(source: Any, **kwargs: Any) -> Component:
        return Component.load(source, share_memory=False, **kwargs)


def _swap(v1: Path, v2: Path, count: int, share: bool) -> dict[str, float]:
    with Runtime(workers=2) as rt:
        rt.register(AgentType("counter", Component.load(v1, share_memory=share)))
        start_tree(
            rt, SupervisorSpec("root", [AgentChild(f"c{i}", "counter") for i in range(count)])
        )
        for i in range(count):
            rt.ask(f"c{i}", "incr", {"by": 1})
        ask = median(samples(lambda: rt.ask("c0", "incr", {"by": 1}), repeat=200))
        started = time.perf_counter()
        Component.load(v2, share_memory=share)  # what reload's own load costs (cache is warm)
        load_v2 = time.perf_counter() - started
        if not share:
            swap.Component = _Copying  # type: ignore[assignment,misc]
        try:
            started = time.perf_counter()
            result = rt.reload("counter", v2)
            total = time.perf_counter() - started
        finally:
            swap.Component = Component  # type: ignore[misc]
        assert len(result.agents) == count
        assert bool(rt.agent_type("counter").component.images) == share
        assert rt.ask(f"c{count - 1}", "get")["version"] == 2
    return {"total": total, "pause": max(result.pauses), "ask": ask, "load_v2": load_v2}


def main() -> None:
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    tmp = Path(tempfile.mkdtemp())
    v1 = _build(ROOT / "examples" / "agents" / "counter.py", tmp)
    v2 = _build(ROOT / "guests" / "testing" / "counter" / "v2.py", tmp)
    for path in (v1, v2):  # compiled (both forms) before timing
        Component.load(path)
        Component.load(path, share_memory=False)
    rows: list[dict[str, object]] = [{"name": "machine", "loadavg_1_5_15": load}]
    one = _swap(v1, v2, 1, True)
    hundred = _swap(v1, v2, 100, True)
    copying = _swap(v1, v2, 100, False)
    for count, run in ((1, one), (100, hundred)):
        rows.append(
            {
                "name": f"swap {count} agent(s), images",
                "reload_total_ms": round(run["total"] * 1e3, 1),
                "max_pause_ms": round(run["pause"] * 1e3, 1),
                "pause_per_agent_ms": round(run["pause"] * 1e3 / count, 2),
                "load_new_version_ms": round(run["load_v2"] * 1e3, 1),
                "one_ask_ms": round(run["ask"] * 1e3, 3),
                "pause_over_ask": round(run["pause"] / run["ask"], 1),
            }
        )
    rows.append(
        {
            "name": "swap 100 agents: images / share_memory=False",
            "ratio_total": round(hundred["total"] / copying["total"], 3),
            "ratio_pause": round(hundred["pause"] / copying["pause"], 3),
            "images_total_s": round(hundred["total"], 3),
            "copying_total_s": round(copying["total"], 3),
            "copying_max_pause_ms": round(copying["pause"] * 1e3, 1),
            "copying_load_new_version_ms": round(copying["load_v2"] * 1e3, 1),
            "target": "images total <= 1 s",
            "met": hundred["total"] <= 1.0,
        }
    )
    rows.append(
        {
            "name": "machine at the end",
            "loadavg_1_5_15": "/".join(f"{x:.2f}" for x in os.getloadavg()),
        }
    )
    report(rows)


if __name__ == "__main__":
    main()
