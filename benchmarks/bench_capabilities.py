"""Capabilities: an agent calling a host tool and an MCP server's tool, each against a baseline
measured in the same run.

Run: .venv/bin/python benchmarks/bench_capabilities.py [--json] [--quick]

The agent is benchmarks/agents/tool_loop.py (built with the agent SDK): its ``loop`` message
calls one granted tool N times through ``mighty_agent.tools.call`` and returns the last result.
A message with N calls minus a message with none, over N, is the per-call figure (the ask's own
cost cancels out); the two are timed in turns, and the figure is the median of the rounds.

- host tool: ``add(a, b=1)`` granted as a host tool (``Capabilities.with_tool``), called by the
  agent through ``mighty:agent/tools`` (the gate, argument binding and validation, the tool
  pool, the JSON result), against calling the same Python function directly (a loop in this
  process). The overhead (agent per call minus direct per call) has a target of <= 60 us.
- MCP over stdio: tool ``add`` of tests/capabilities/mcp_server.py (a real process with the
  ``mcp`` SDK's server) granted as ``files.add`` and called by the agent (the broker's
  connection, the capability loop), against the ``mcp`` SDK's own client (``stdio_client`` and
  ``ClientSession.call_tool``, sequential calls on one session) calling another process of the
  same server, on this thread's event loop. Ratio of the per-call medians: target <= 1.3.

``cpu_us``: process CPU per call (every thread: the guest, the host's tool threads and loop;
the server is another process and is not counted). The load average (1/5/15 min) is printed at
the start and the end: on a 2-CPU machine a load above ~2 means the figures share the CPUs.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, median, report

sys.path.insert(0, str(ROOT))

from mighty import Component
from mighty.agents import AgentType, Grants, Runtime
from mighty.budget import Budget
from mighty.build import build_component
from mighty.capabilities import Capabilities, McpServer

QUICK = "--quick" in sys.argv
ROUNDS = 3 if QUICK else 11
HOST_CALLS = 200 if QUICK else 500  # calls per agent message (at most 1000: MAX_TOOL_CALLS)
MCP_CALLS = 50 if QUICK else 300  # calls per agent message, MCP tool
SERVER = (sys.executable, "-m", "tests.capabilities.mcp_server")
ARGS = {"a": 1}


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def yes(met: bool) -> str:
    return "yes" if met else "no"


def add(a: int, b: int = 1) -> int:
    """Add two integers (the host tool; the MCP server's ``add`` is the same function)."""
    return a + b


def agent_per_call(runtime: Runtime, address: str, tool: str, n: int) -> tuple[float, float]:
    """Median seconds (wall, process CPU) per call: a loop of ``n`` calls minus an empty one."""

    def message(count: int) -> tuple[float, float]:
        started, started_cpu = time.perf_counter(), time.process_time()
        result = runtime.ask(address, "loop", {"tool": tool, "n": count, "args": ARGS})
        wall, cpu = time.perf_counter() - started, time.process_time() - started_cpu
        assert count == 0 or result == 2, result
        return wall, cpu

    message(n)  # warm-up: the first calls resolve the tool (and wait for the server)
    walls, cpus = [], []
    for _ in range(ROUNDS):
        full, empty = message(n), message(0)
        walls.append((full[0] - empty[0]) / n)
        cpus.append((full[1] - empty[1]) / n)
    return median(walls), median(cpus)


def direct_per_call(n: int) -> tuple[float, float]:
    """Median seconds (wall, CPU) per direct call of ``add`` in a Python loop of ``n``."""
    walls, cpus = [], []
    for _ in range(ROUNDS):
        started, started_cpu = time.perf_counter(), time.process_time()
        for _ in range(n):
            add(**ARGS)
        walls.append((time.perf_counter() - started) / n)
        cpus.append((time.process_time() - started_cpu) / n)
    return median(walls), median(cpus)


def sdk_per_call(n: int) -> tuple[float, float]:
    """Median seconds (wall, CPU) per call of the SDK's own stdio client, one session."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=SERVER[0], args=list(SERVER[1:]), cwd=str(ROOT))

    async def run() -> tuple[list[float], list[float]]:
        walls: list[float] = []
        cpus: list[float] = []
        async with stdio_client(params) as streams, ClientSession(*streams) as session:
            await session.initialize()
            await session.list_tools()
            for _ in range(n):  # warm-up
                await session.call_tool("add", ARGS)
            for _ in range(ROUNDS):
                started, started_cpu = time.perf_counter(), time.process_time()
                for _ in range(n):
                    result: Any = await session.call_tool("add", ARGS)
                walls.append((time.perf_counter() - started) / n)
                cpus.append((time.process_time() - started_cpu) / n)
                assert result.structured_content == {"result": 2}, result
        return walls, cpus

    walls, cpus = asyncio.run(run())
    return median(walls), median(cpus)


def main() -> None:
    started_load = load()
    out = Path(tempfile.mkdtemp()) / "tool_loop.wasm"
    build_component(
        ROOT / "benchmarks" / "agents" / "tool_loop.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    component = Component.load(out)
    capabilities = (
        Capabilities()
        .with_tool("add", add)
        .with_mcp(McpServer("files", command=SERVER, cwd=str(ROOT)))
    )
    rows: list[dict[str, object]] = []
    with Runtime(capabilities=capabilities) as runtime:
        runtime.register(
            AgentType(
                "loop",
                component,
                budget=Budget(timeout=300),
                grants=Grants(tools=frozenset({"add", "files.add"})),
            )
        )
        address = runtime.spawn("loop")
        host_wall, host_cpu = agent_per_call(runtime, address, "add", HOST_CALLS)
        direct_wall, direct_cpu = direct_per_call(HOST_CALLS)
        overhead = (host_wall - direct_wall) * 1e6
        rows.append(
            {
                "name": "agent -> host tool: per-call overhead",
                "absolute_us": round(overhead, 1),
                "agent_us": round(host_wall * 1e6, 1),
                "direct_us": round(direct_wall * 1e6, 3),
                "target": "<= 60 us",
                "met": yes(overhead <= 60),
                "cpu_us": f"agent {host_cpu * 1e6:.1f}, direct {direct_cpu * 1e6:.3f}",
                "calls": f"{ROUNDS} x {HOST_CALLS}",
            }
        )
        mcp_wall, mcp_cpu = agent_per_call(runtime, address, "files.add", MCP_CALLS)
    sdk_wall, sdk_cpu = sdk_per_call(MCP_CALLS)
    ratio = mcp_wall / sdk_wall
    rows.append(
        {
            "name": "agent -> MCP tool (stdio) / mcp SDK client",
            "absolute_us": round(mcp_wall * 1e6),
            "baseline_us": round(sdk_wall * 1e6),
            "ratio": round(ratio, 2),
            "target": "<= 1.3",
            "met": yes(ratio <= 1.3),
            "cpu_us": f"agent {mcp_cpu * 1e6:.0f}, sdk {sdk_cpu * 1e6:.0f}",
            "calls": f"{ROUNDS} x {MCP_CALLS}",
        }
    )
    rows.append(
        {
            "name": "machine",
            "loadavg_1_5_15": f"start {started_load}, end {load()}",
            "cpus": os.cpu_count(),
            "quick": QUICK,
        }
    )
    report(rows)


if __name__ == "__main__":
    main()
