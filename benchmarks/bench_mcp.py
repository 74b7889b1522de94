"""`mty sandbox serve`: per-call latency over Streamable HTTP against stdio, in one run.

Both servers are real `mty sandbox serve` subprocesses (same tools, same limits, the same
shared sandbox with a warm pool), driven by the official MCP client: stdio with `stdio_client`,
HTTP with `streamable_http_client` on loopback with a bearer token. Each call is
`run_python` of `result = 1 + 1`, spaced 10 ms apart as an agent's are (back to back the pool
cannot refill and every call makes its own instance). The baseline is stdio, measured in the
same run; the ratio is HTTP / stdio. Also: the same call with a progress callback and ten
printed lines (output forwarded as progress notifications), and four HTTP clients at once.

    .venv/bin/python benchmarks/bench_mcp.py [--calls N] [--json]
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, median, p, report

TOKEN = "bench-token-" + "0123456789abcdef" * 2
MTY = str(Path(sys.executable).parent / "mty")
SERVE = ["sandbox", "serve", "--tools", "tests.sandbox_mcp.tools:TOOLS"]
CODE = "result = 1 + 1"
PRINTS = "for i in range(10): print('line', i)\nresult = 1 + 1"
GAP = 0.010


def _env() -> dict[str, str]:
    env = {"PATH": os.environ.get("PATH", "")}
    env.update({key: os.environ[key] for key in ("MTY_CACHE_DIR",) if key in os.environ})
    return env


@asynccontextmanager
async def stdio_session() -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=MTY, args=SERVE, env=_env(), cwd=ROOT)
    with open(os.devnull, "w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            yield session


@asynccontextmanager
async def http_server() -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "token"
        token_file.write_text(TOKEN)
        args = [*SERVE, "--http", "127.0.0.1:0", "--token-file", str(token_file)]
        process = subprocess.Popen(
            [MTY, *args], stderr=subprocess.PIPE, cwd=ROOT, env=_env(), text=True
        )
        try:
            assert process.stderr is not None
            url = None
            for line in process.stderr:
                found = re.search(r"on (http://\S+)", line)
                if found:
                    url = found.group(1)
                    break
            if url is None:
                raise SystemExit("the HTTP server did not start")
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)
            if process.stderr is not None:
                process.stderr.close()


@asynccontextmanager
async def http_session(url: str) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=600)) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def _timed(calls: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    await call()  # the first waits for the interpreter and the pool
    for _ in range(10):
        await call()
        await asyncio.sleep(GAP)
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        result = await call()
        out.append(time.perf_counter() - started)
        if result.is_error:
            raise SystemExit(f"a call failed: {result.content}")
        await asyncio.sleep(GAP)
    return out


def _call(session: ClientSession, code: str, progress: bool = False) -> Callable[[], Any]:
    async def ignore(done: float, total: float | None, message: str | None) -> None:
        pass

    def call() -> Any:
        return session.call_tool(
            "run_python", {"code": code}, 600.0, progress_callback=ignore if progress else None
        )

    return call


def _row(name: str, values: list[float], baseline: list[float] | None) -> dict[str, object]:
    row: dict[str, object] = {
        "name": name,
        "p50_ms": round(median(values) * 1000, 2),
        "p90_ms": round(p(values, 0.9) * 1000, 2),
        "n": len(values),
    }
    if baseline is not None:
        row["ratio_vs_stdio_p50"] = round(median(values) / median(baseline), 2)
    return row


async def main(calls: int) -> None:
    async with stdio_session() as session:
        stdio = await _timed(calls, _call(session, CODE))
        stdio_prints = await _timed(calls, _call(session, PRINTS, progress=True))
    async with http_server() as url:
        async with http_session(url) as session:
            http = await _timed(calls, _call(session, CODE))
            http_prints = await _timed(calls, _call(session, PRINTS, progress=True))
        async with (
            http_session(url) as a,
            http_session(url) as b,
            http_session(url) as c,
            http_session(url) as d,
        ):
            sessions = [a, b, c, d]
            rounds = max(1, calls // 4)
            await asyncio.gather(*(_call(s, CODE)() for s in sessions))
            started = time.perf_counter()
            for _ in range(rounds):
                await asyncio.gather(*(_call(s, CODE)() for s in sessions))
            both = time.perf_counter() - started
    rows = [
        _row("stdio: run_python 1+1 (baseline)", stdio, None),
        _row("http: run_python 1+1", http, stdio),
        _row("stdio: 10 prints, progress on", stdio_prints, None),
        _row("http: 10 prints, progress on", http_prints, stdio_prints),
        {
            "name": "http: 4 clients at once, per round",
            "ms": round(both / rounds * 1000, 2),
            "calls_per_s": round(4 * rounds / both, 1),
            "rounds": rounds,
        },
        {"name": "load average", "1min": round(os.getloadavg()[0], 2)},
    ]
    report(rows)


if __name__ == "__main__":
    count = 100
    if "--calls" in sys.argv:
        count = int(sys.argv[sys.argv.index("--calls") + 1])
    asyncio.run(main(count))
