"""Source positions (issue 35 #5): what keeping them costs an agent's imports while recorded.

Run: .venv/bin/python benchmarks/bench_positions.py [--json] [--quick]

The agent is benchmarks/agents/positions_bench.py (a componentize-py CPython agent); its `work`
message makes N imports (`log`, the cheapest agent import: it makes the position's share of
an import the largest). One instance per mode, its `handle` called directly (no runtime, no
mailbox: an ask would only dilute the difference), with a stand-in `mighty:agent/host` that
does nothing:

- plain: not recorded;
- recorded: recorded into a trace (default flush), positions off (the default);
- positions: recorded with ``Recorder(positions=True)``: the guest looks up its caller's frame
  and calls ``mighty:agent/debug#at`` before each import, and each import record carries it.

Reported per import: the median wall and thread-CPU time of a call divided by N, the ratio
positions / recorded (the brief's bar: positions are off by default if it is above 1.10), the
fuel of one call in each mode, the trace bytes per import, and the load average.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import ROOT, cpu_samples, median, report, samples

sys.path.insert(0, str(ROOT))

QUICK = "--quick" in sys.argv
N = 200
REPEAT = 15 if QUICK else 60


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _component() -> Path:
    from mighty.build import build_component

    out = Path(tempfile.gettempdir()) / "mty-bench-positions.wasm"
    build_component(
        ROOT / "benchmarks" / "agents" / "positions_bench.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return out


class _Host:
    """``mighty:agent/host`` and ``mighty:agent/tools`` that do nothing (only `log` is used)."""

    name = "bench-host"
    type_interfaces = ("mighty:agent/types",)

    def resources(self) -> list[Any]:
        return []

    def bindings(self) -> list[Any]:
        from mighty.abi import Err, Ok
        from mighty.gate import Binding

        host = "mighty:agent/host"
        tools = "mighty:agent/tools"
        return [
            Binding(host, "self-address", lambda ctx: "bench:1"),
            Binding(host, "send", lambda ctx, to, msg: Ok(None)),
            Binding(host, "ask", lambda ctx, to, msg, ms: Err(None)),
            Binding(host, "spawn", lambda ctx, t, init: Err(None)),
            Binding(host, "log", lambda ctx, level, text: None),
            Binding(host, "emit", lambda ctx, name, body: None),
            Binding(tools, "list-tools", lambda ctx: "[]"),
            Binding(tools, "call", lambda ctx, name, args: Err(None)),
        ]

    def setup(self, ctx: Any) -> None:
        return None


def main() -> None:
    from mighty import Component, Instance
    from mighty.budget import Budget
    from mighty.gate import Gate
    from mighty.trace import Recorder
    from mighty.wasi import WasiProvider

    component = Component.load(_component())
    gate = Gate([WasiProvider(), _Host()])
    budget = Budget(fuel=10**10, memory=256 << 20, timeout=60)
    tmp = Path(tempfile.mkdtemp(prefix="mty-bench-positions-"))
    message = {"name": "work", "body": bytes([0xA1, 0x61, 0x6E, 0x19, N >> 8, N & 0xFF])}
    recorders = {
        "recorded": Recorder(tmp / "recorded.trace", positions=False),
        "positions": Recorder(tmp / "positions.trace", positions=True),
    }
    instances = {"plain": Instance(component, gate=gate, budget=budget)}
    for mode, recorder in recorders.items():
        instances[mode] = Instance(component, gate=gate, budget=budget, record=recorder)
    fuel: dict[str, int] = {}
    for mode, instance in instances.items():
        instance.call("init", b"", budget=budget)
        result = instance.call("handle", "host", message, budget=budget)
        assert result is not None
        fuel[mode] = instance.last_usage.fuel if instance.last_usage else -1

    def call(mode: str) -> Any:
        return lambda: instances[mode].call("handle", "host", message, budget=budget)

    wall: dict[str, list[float]] = {m: [] for m in instances}
    cpu: dict[str, list[float]] = {m: [] for m in instances}
    # In turns, so a change of load falls on every mode alike.
    for _ in range(3):
        for mode in instances:
            wall[mode] += samples(call(mode), repeat=REPEAT // 3, warmup=3)
            cpu[mode] += cpu_samples(call(mode), repeat=REPEAT // 3, warmup=1)
    calls = {m: len(wall[m]) + len(cpu[m]) + 4 + 1 for m in instances}
    for recorder in recorders.values():
        recorder.flush()
    size = {m: (tmp / f"{m}.trace").stat().st_size for m in recorders}
    rows: list[dict[str, object]] = []
    for mode in instances:
        rows.append(
            {
                "name": f"{N} imports per call: {mode}",
                "wall_us_per_import": round(median(wall[mode]) / N * 1e6, 2),
                "cpu_us_per_import": round(median(cpu[mode]) / N * 1e6, 2),
                "fuel_per_import": round(fuel[mode] / N),
                "trace_bytes_per_import": (
                    round(size[mode] / (calls[mode] * N)) if mode in size else 0
                ),
                "load": load(),
            }
        )
    rows.append(
        {
            "name": "positions / recorded",
            "wall_ratio": round(median(wall["positions"]) / median(wall["recorded"]), 3),
            "cpu_ratio": round(median(cpu["positions"]) / median(cpu["recorded"]), 3),
            "fuel_ratio": round(fuel["positions"] / fuel["recorded"], 3),
            "load": load(),
        }
    )
    for instance in instances.values():
        instance.close()
    for recorder in recorders.values():
        recorder.close()
    report(rows)


if __name__ == "__main__":
    main()
