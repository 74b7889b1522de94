"""Code mode for agent hosts: tool-call overhead, concurrent tool calls, run_code vs Monty.

Figures, each beside a baseline measured in the same run:
- sync tool call overhead: a guest loop of N tool calls minus the same loop calling a guest
  function, per call; baselines: a direct Python call of the tool on the host, and the old
  design's hand-off (a new thread per call, started and joined);
- 10 concurrent tool calls of 50 ms each (`asyncio.gather` in the guest), async and sync tools,
  against the same 10 calls awaited one after the other (and the 50 ms ideal);
- `run_code` through a pydantic-ai agent (FunctionModel, one `run_code` call per agent run)
  against the same agent calling the tool directly, the same snippet through
  `Sandbox.run_async` with no agent (the sandbox's own share), and the same snippet on Monty
  (pydantic-monty, a fresh session from its worker pool, when it is installed); when
  pydantic-ai-harness is importable, also the same agent turn through its own code mode
  (``CodeMode``, the snippet on Monty), alternated with the others in one process: the
  like-for-like baseline (both pay pydantic-ai's machinery per awaited call). The harness pins
  its pydantic-ai version, so it is installed outside the venv with that version, both first on
  ``PYTHONPATH`` (benchmarks/README.md says how); the whole row then runs on that version.
  Beside them, pydantic-ai's own floor: the same toolset with the snippet run by the host's
  CPython (``exec``, no sandbox, no isolation; the same tool functions and ``ToolManager``).

`--quick` takes fewer samples; `--pydantic-ai` runs only the `run_code` part. The machine's
load average is printed: on 2 CPUs a load above ~2 means the figures share the CPUs with
something else.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import threading
import time
from typing import Any

from _common import p, report, samples

from mighty.sandbox import Limits, Sandbox

QUICK = "--quick" in sys.argv


def add(a: int, b: int) -> int:
    return a + b


async def slow(i: int) -> int:
    await asyncio.sleep(0.05)
    return i


def slow_sync(i: int) -> int:
    time.sleep(0.05)
    return i


def _thread_per_call(n: int) -> float:
    started = time.perf_counter()
    box: list[int] = []
    for i in range(n):
        thread = threading.Thread(target=lambda i=i: box.append(add(i, 1)))
        thread.start()
        thread.join()
    return (time.perf_counter() - started) / n


def _paired(
    first: Any, second: Any, repeat: int, clock: Any = time.perf_counter
) -> tuple[list[float], list[float]]:
    """Times of ``first`` and ``second`` taken in alternation (the load hits both alike)."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(repeat):
        for fn, into in ((first, a), (second, b)):
            started = clock()
            fn()
            into.append(clock() - started)
    return a, b


def tool_overhead(rows: list[dict[str, object]]) -> None:
    n = 500
    repeat = 15 if QUICK else 40
    calls_code = f"for i in range({n}):\n    add(i, 1)"
    plain_code = f"def add2(a, b):\n    return a + b\nfor i in range({n}):\n    add2(i, 1)"
    with Sandbox(tools=[add], limits=Limits(tool_calls=n), pool=2) as sandbox:
        for _ in range(3):
            sandbox.run(calls_code)
            sandbox.run(plain_code)
        calls, plain = _paired(
            lambda: sandbox.run(calls_code), lambda: sandbox.run(plain_code), repeat
        )
        # CPU time of the whole process (all threads): the work a call costs, without the time
        # spent waiting for a CPU, which dominates wall time on a loaded machine.
        cpu_calls, cpu_plain = _paired(
            lambda: sandbox.run(calls_code),
            lambda: sandbox.run(plain_code),
            repeat,
            time.process_time,
        )
    per_call = statistics.median(c - q for c, q in zip(calls, plain, strict=True)) / n
    cpu_per_call = statistics.median(c - q for c, q in zip(cpu_calls, cpu_plain, strict=True)) / n
    direct = samples(lambda: add(1, 2), repeat=2000, warmup=100)
    thread = statistics.median(_thread_per_call(200) for _ in range(5))
    rows.append(
        {
            "name": f"sync tool call overhead ({n} calls/run)",
            "per_call_us": round(per_call * 1e6, 1),
            "cpu_per_call_us": round(cpu_per_call * 1e6, 1),
            "direct_python_call_us": round(p(direct, 0.5) * 1e6, 3),
            "thread_per_call_us": round(thread * 1e6, 1),
            "ratio_vs_thread_per_call": round(per_call / thread, 2),
            "target_us": 60,
        }
    )


def concurrency(rows: list[dict[str, object]]) -> None:
    repeat = 5 if QUICK else 15
    with Sandbox(tools=[slow, slow_sync], pool=2) as sandbox:
        for tool in ("slow", "slow_sync"):
            together = f"import asyncio\nawait asyncio.gather(*[{tool}(i=i) for i in range(10)])"
            one_by_one = f"[await {tool}(i=i) for i in range(10)]"
            for code in (together, one_by_one):
                result = sandbox.run(code)
                assert result.ok and result.value == list(range(10)), result.error
            gathered = samples(lambda code=together: sandbox.run(code), repeat=repeat, warmup=1)
            sequential = samples(lambda code=one_by_one: sandbox.run(code), repeat=3, warmup=0)
            rows.append(
                {
                    "name": f"10 x 50 ms {'async' if tool == 'slow' else 'sync'} tools, gather",
                    "gather_p50_ms": round(p(gathered, 0.5) * 1e3, 1),
                    "one_by_one_p50_ms": round(p(sequential, 0.5) * 1e3, 1),
                    "ratio_gather_over_one_by_one": round(p(gathered, 0.5) / p(sequential, 0.5), 3),
                    "ratio_over_50ms_ideal": round(p(gathered, 0.5) / 0.05, 2),
                }
            )


def _native_code_toolset() -> type:
    """``MightyCodeToolset`` with the snippet run by the host's own CPython (``exec`` of the
    code compiled with top-level await, the same tool functions, the same ``ToolManager`` per
    ``run_code`` call): no sandbox, no isolation, a baseline only. Its cost over the direct
    turn is pydantic-ai's own share of a code-mode turn, what no sandbox can go below."""
    import ast

    from mighty.sandbox.integrations import pydantic_ai as integration

    class NativeCode(integration.MightyCodeToolset):
        async def call_tool(self, name: str, tool_args: Any, ctx: Any, tool: Any) -> Any:
            from pydantic_ai.tool_manager import ToolManager

            wrapped = await self.wrapped.get_tools(ctx)
            parent = ctx.tool_manager
            manager = ToolManager(
                toolset=self.wrapped,
                root_capability=parent.root_capability if parent is not None else None,
                ctx=ctx,
                tools=wrapped,
            )
            tree = ast.parse(tool_args["code"])
            last = tree.body[-1]
            if isinstance(last, ast.Expr):  # the last expression is the answer
                tree.body[-1] = ast.Assign([ast.Name("_answer", ast.Store())], last.value)
                ast.fix_missing_locations(tree)
            code = compile(tree, "<run_code>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            scope = {
                t.tool_def.name: integration._tool_function(t.tool_def.name, t.tool_def)
                for t in wrapped.values()
            }
            token = integration._CURRENT.set(integration._Call(manager, ctx.tool_call_id or "c"))
            try:
                pending = eval(code, scope)  # a baseline running its own snippet
                if pending is not None:
                    await pending
            finally:
                integration._CURRENT.reset(token)
            return scope.get("_answer")

    return NativeCode


def pydantic_ai(rows: list[dict[str, object]]) -> None:
    _NativeCode = _native_code_toolset()  # noqa: N806 - a class
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.toolsets import FunctionToolset

    from mighty.sandbox.integrations.pydantic_ai import MightyCodeToolset

    snippet = "total = 0\nfor i in range(5):\n    total = await add(a=total, b=i)\ntotal"

    def model_for(tool: str, args: dict[str, Any]) -> FunctionModel:
        def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            last = messages[-1]
            if isinstance(last, ModelRequest) and any(
                getattr(x, "tool_name", None) for x in last.parts
            ):
                return ModelResponse(parts=[TextPart("done")])
            return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id="c1")])

        return FunctionModel(model)

    tools: FunctionToolset[None] = FunctionToolset()
    tools.add_function(add, takes_ctx=False)
    code_mode = MightyCodeToolset(tools, limits=Limits(), pool=4)
    coded = Agent(model_for("run_code", {"code": snippet}), toolsets=[code_mode])
    direct = Agent(model_for("add", {"a": 1, "b": 2}), toolsets=[tools])
    native = Agent(model_for("run_code", {"code": snippet}), toolsets=[_NativeCode(tools)])
    agents: list[Agent[None, str]] = [coded, direct, native]
    try:
        from pydantic_ai_harness import CodeMode
    except ImportError:
        harness = None
    else:
        harness = Agent(
            model_for("run_code", {"code": snippet}), toolsets=[tools], capabilities=[CodeMode()]
        )
        agents.append(harness)
    repeat = 20 if QUICK else 60

    async def measure() -> list[list[float]]:
        async def once(agent: Agent[None, str]) -> None:
            await agent.run("go")
            await asyncio.sleep(0.005)  # spaced out, as a model's turns are: the pool refills

        out: list[list[float]] = [[] for _ in agents]
        for agent in agents:
            for _ in range(3):
                await once(agent)
        for _ in range(repeat):  # alternating, so the machine's load hits all alike
            for agent, times in zip(agents, out, strict=True):
                started = time.perf_counter()
                result = await agent.run("go")
                times.append(time.perf_counter() - started)
                await asyncio.sleep(0.005)
                if agent is not direct and "10" not in str(result.all_messages()[-2]):
                    raise AssertionError(f"run_code did not return 10: {result.all_messages()}")
        return out

    async def sandbox_only() -> list[float]:
        # The same snippet and tool through Sandbox.run_async with no agent around it: the
        # sandbox's own share of the turn (the rest is pydantic-ai's machinery per call).
        with Sandbox(tools=[add], limits=Limits(), pool=4) as box:
            for _ in range(10):
                await box.run_async(snippet)
            times = []
            for _ in range(repeat * 3):
                started = time.perf_counter()
                await box.run_async(snippet)
                times.append(time.perf_counter() - started)
                await asyncio.sleep(0.005)
            return times

    try:
        with_code, with_tool, with_native, *with_harness = asyncio.run(measure())
    finally:
        code_mode.close()
    alone = asyncio.run(sandbox_only())
    cost = statistics.median(c - t for c, t in zip(with_code, with_tool, strict=True))
    native_cost = statistics.median(c - t for c, t in zip(with_native, with_tool, strict=True))
    row: dict[str, object] = {
        "name": "run_code via pydantic-ai (5 awaited tool calls)",
        "agent_run_code_p50_ms": round(p(with_code, 0.5) * 1e3, 3),
        "agent_direct_tool_p50_ms": round(p(with_tool, 0.5) * 1e3, 3),
        "run_code_cost_p50_ms": round(cost * 1e3, 3),
        "sandbox_run_async_same_snippet_p50_ms": round(p(alone, 0.5) * 1e3, 3),
        "native_exec_run_code_p50_ms": round(p(with_native, 0.5) * 1e3, 3),
        "native_exec_run_code_cost_p50_ms": round(native_cost * 1e3, 3),
        "ratio_run_code_cost_over_native": round(cost / native_cost, 2),
    }
    if with_harness:
        import pydantic_ai

        harness_cost = statistics.median(
            c - t for c, t in zip(with_harness[0], with_tool, strict=True)
        )
        row["pydantic_ai_version"] = pydantic_ai.__version__
        row["harness_code_mode_p50_ms"] = round(p(with_harness[0], 0.5) * 1e3, 3)
        row["harness_run_code_cost_p50_ms"] = round(harness_cost * 1e3, 3)
        row["ratio_run_code_cost_over_harness"] = round(cost / harness_cost, 2)
    else:
        row["harness"] = "not installed"
    try:
        from pydantic_monty import Monty
    except ImportError:
        row["monty"] = "not installed"
    else:
        monty_snippet = snippet.replace("await ", "")
        with Monty(min_processes=1) as pool:

            def feed() -> None:
                with pool.checkout() as session:
                    session.feed_run(monty_snippet, external_lookup={"add": add})

            monty = samples(feed, repeat=repeat * 3, warmup=10)
        row["monty_same_snippet_p50_ms"] = round(p(monty, 0.5) * 1e3, 3)
        row["ratio_native_exec_cost_over_monty"] = round(native_cost / p(monty, 0.5), 1)
        row["ratio_run_code_cost_over_monty"] = round(cost / p(monty, 0.5), 1)
        row["ratio_sandbox_alone_over_monty"] = round(p(alone, 0.5) / p(monty, 0.5), 1)
    rows.append(row)


def main() -> None:
    print(f"load average: {os.getloadavg()[0]:.2f}")
    rows: list[dict[str, object]] = []
    if "--pydantic-ai" not in sys.argv:  # that part alone
        tool_overhead(rows)
        concurrency(rows)
    pydantic_ai(rows)
    report(rows)


if __name__ == "__main__":
    main()
