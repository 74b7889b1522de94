"""Capabilities: an agent calling a host tool and an MCP server's tool, each against a baseline
measured in the same run.

Run: .venv/bin/python benchmarks/bench_capabilities.py [--json] [--quick]

The agent is benchmarks/agents/tool_loop.py (built with the agent SDK): its ``loop`` message
calls one granted tool N times through ``mighty_agent.tools.call`` and returns the last result.
A message with N calls minus a message with none, over N, is the per-call figure (the ask's own
cost cancels out). Agent and baselines take turns, one round of each at a time, so a burst of
load hits all alike; each figure is the median of the rounds.

- host tool: ``add(a, b=1)`` granted as a host tool (``Capabilities.with_tool``), called by the
  agent through ``mighty:agent/tools`` (the gate, argument binding and validation, the tool
  pool, the JSON result), against calling the same Python function directly (a loop in this
  process). The overhead (agent per call minus direct per call) has a target of <= 60 us.
- MCP over stdio: tool ``add`` of tests/capabilities/mcp_server.py (a real process with the
  ``mcp`` SDK's server) granted as ``files.add`` and called by the agent (the broker's
  connection, the capability loop), against the ``mcp`` SDK's own client (``stdio_client`` and
  ``ClientSession.call_tool``, sequential calls on one session) calling another process of the
  same server, on an event loop thread of its own (one hop onto it per round). Ratio of the
  per-call medians: target <= 1.3.
  Beside it, the broker alone: ``McpClient.call`` from this thread on the runtime's client
  (no agent, no gate), against the same SDK figure.

``cpu_us``: process CPU per call (every thread: the guest, the host's tool threads and loop;
the server is another process and is not counted). The load average (1/5/15 min) is printed at
the start and the end: on a 2-CPU machine a load above ~2 means the figures share the CPUs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import ROOT, median, report

sys.path.insert(0, str(ROOT))

from mighty import Component
from mighty.agents import AgentType, Grants, Runtime
from mighty.budget import Budget
from mighty.build import build_component
from mighty.capabilities import Capabilities, McpClient, McpServer

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


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall and process-CPU seconds of one call of ``fn``."""
    started, started_cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - started, time.process_time() - started_cpu


def turns(
    sides: dict[str, Callable[[], tuple[float, float]]], rounds: int
) -> dict[str, tuple[float, float]]:
    """Each side once per round, in turn (a burst of load hits all alike); for each, the
    median (wall, CPU) seconds per call over the rounds. One warm-up round first."""
    for fn in sides.values():
        fn()
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            seen[name].append(fn())
    return {
        name: (median([w for w, _ in got]), median([c for _, c in got]))
        for name, got in seen.items()
    }


def agent_side(
    runtime: Runtime, address: str, tool: str, n: int
) -> Callable[[], tuple[float, float]]:
    """One round: a message with ``n`` calls minus a message with none, per call."""

    def message(count: int) -> tuple[float, float]:
        out: list[Any] = []
        body = {"tool": tool, "n": count, "args": ARGS}
        wall, cpu = timed(lambda: out.append(runtime.ask(address, "loop", body)))
        assert count == 0 or out == [2], out
        return wall, cpu

    def round_() -> tuple[float, float]:
        full, empty = message(n), message(0)
        return (full[0] - empty[0]) / n, (full[1] - empty[1]) / n

    return round_


def direct_side(n: int) -> Callable[[], tuple[float, float]]:
    """One round: ``n`` direct calls of ``add`` in a Python loop, per call."""

    def loop() -> None:
        for _ in range(n):
            add(**ARGS)

    def round_() -> tuple[float, float]:
        wall, cpu = timed(loop)
        return wall / n, cpu / n

    return round_


def client_side(client: McpClient, n: int) -> Callable[[], tuple[float, float]]:
    """One round: ``n`` calls of ``McpClient.call`` from this thread (no agent), per call."""

    def loop() -> None:
        for _ in range(n):
            assert client.call("add", ARGS) == 2

    def round_() -> tuple[float, float]:
        wall, cpu = timed(loop)
        return wall / n, cpu / n

    return round_


class SdkClient:
    """The ``mcp`` SDK's own stdio client and session on an event loop thread of its own,
    open across rounds (as the broker's connection is)."""

    def __init__(self) -> None:
        from mcp.client.session import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        params = StdioServerParameters(command=SERVER[0], args=list(SERVER[1:]), cwd=str(ROOT))
        self.stop = asyncio.Event()
        opened: concurrent.futures.Future[Any] = concurrent.futures.Future()

        async def own() -> None:
            # One task enters and leaves the SDK's contexts (its cancel scopes demand it).
            async with stdio_client(params) as streams, ClientSession(*streams) as session:
                await session.initialize()
                await session.list_tools()
                opened.set_result(session)
                await self.stop.wait()

        self.owner = asyncio.run_coroutine_threadsafe(own(), self.loop)
        self.session = opened.result(timeout=120)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def side(self, n: int) -> Callable[[], tuple[float, float]]:
        """One round: ``n`` sequential ``call_tool`` on the session (one hop onto its loop
        per round, not per call), per call."""

        async def loop() -> None:
            for _ in range(n):
                result = await self.session.call_tool("add", ARGS)
                assert result.structured_content == {"result": 2}, result

        def round_() -> tuple[float, float]:
            wall, cpu = timed(lambda: self._run(loop()))
            return wall / n, cpu / n

        return round_

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.owner.result(timeout=60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


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
        host = turns(
            {
                "agent": agent_side(runtime, address, "add", HOST_CALLS),
                "direct": direct_side(HOST_CALLS),
            },
            ROUNDS,
        )
        sdk = SdkClient()
        try:
            mcp = turns(
                {
                    "agent": agent_side(runtime, address, "files.add", MCP_CALLS),
                    "client": client_side(runtime.broker.clients["files"], MCP_CALLS),
                    "sdk": sdk.side(MCP_CALLS),
                },
                ROUNDS,
            )
        finally:
            sdk.close()
    (host_wall, host_cpu), (direct_wall, direct_cpu) = host["agent"], host["direct"]
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
    (mcp_wall, mcp_cpu), (sdk_wall, sdk_cpu) = mcp["agent"], mcp["sdk"]
    client_wall, client_cpu = mcp["client"]
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
            "name": "McpClient.call, no agent / mcp SDK client",
            "absolute_us": round(client_wall * 1e6),
            "baseline_us": round(sdk_wall * 1e6),
            "ratio": round(client_wall / sdk_wall, 2),
            "cpu_us": f"client {client_cpu * 1e6:.0f}, sdk {sdk_cpu * 1e6:.0f}",
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
