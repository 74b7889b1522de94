"""What observability costs on the message path, each against a baseline in the same run.

Run: .venv/bin/python benchmarks/bench_telemetry.py [--json] [--quick]

The baseline, "hooks removed", is the agent runtime as it was before introspection and
telemetry existed (mighty/agents/_runtime.py at commit BASE, loaded from git into its own
module): no ``__inspect`` check, no ring buffer, no ``telemetry is None`` tests. Against it:

- off: today's runtime, ``telemetry=None`` (the default): targets <= 2% slower;
- on: ``Telemetry`` with the SDK's batch span/log processors and the OTLP/HTTP exporter,
  sending to a local receiver in a child process (so its parsing does not share our GIL):
  targets <= 15% slower; and the same with ``sampling = 0.1`` (parent-based: a whole trace is
  kept or dropped).

Two workloads: host ``ask`` to the one-page WAT echo agent (the per-message floor, where any
overhead shows most), and guest-to-guest ping-pong between two CPython agents (each round one
ask, two handles). Variants are interleaved round by round and the median of the rounds is
kept, so a noisy neighbour hits them all alike.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import FIXTURES, ROOT, median, report, wasm_tools

from mighty import Component
from mighty.agents import AgentType, Runtime
from mighty.build import build_component

BASE = "e78da0a"
"""The last commit before the observability hooks (the 'hooks removed' build)."""

_RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def _base_runtime() -> type[Any]:
    """Runtime from BASE, as module mighty.agents._runtime_base (same lower layers)."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{BASE}:host/agents/_runtime.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spec = importlib.util.spec_from_loader("mighty.agents._runtime_base", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    exec(compile(source, f"{BASE}:host/agents/_runtime.py", "exec"), module.__dict__)
    runtime: type[Any] = module.Runtime
    return runtime


def _echo() -> Component:
    done = subprocess.run(
        [wasm_tools(), "parse", str(FIXTURES / "echo_agent.wat"), "-o", "/dev/stdout"],
        capture_output=True,
        check=True,
    )
    return Component.load(done.stdout)


def _pingpong(tmp: Path) -> Component:
    out = tmp / "pingpong.wasm"
    build_component(
        ROOT / "examples" / "agents" / "pingpong.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return Component.load(out)


def _host_asks(make: Callable[[], Any], echo: Component, n: int) -> float:
    """Seconds per host ask to the echo agent."""
    with make() as rt:
        rt.register(AgentType("echo", echo))
        address = rt.spawn("echo")
        for i in range(200):
            rt.ask(address, "x", i)
        started = time.perf_counter()
        for i in range(n):
            rt.ask(address, "x", i)
        return (time.perf_counter() - started) / n


def _ping_pong(make: Callable[[], Any], pingpong: Component, rounds: int) -> float:
    """Seconds per guest-to-guest ask round."""
    with make() as rt:
        rt.register(AgentType("pp", pingpong))
        ponger, pinger = rt.spawn("pp"), rt.spawn("pp")
        rt.ask(pinger, "start", {"peer": ponger, "rounds": 20}, timeout=60)
        started = time.perf_counter()
        rt.ask(pinger, "start", {"peer": ponger, "rounds": rounds}, timeout=120)
        return (time.perf_counter() - started) / rounds


def main() -> None:
    quick = "--quick" in sys.argv
    from mighty.telemetry import Telemetry, TelemetryConfig

    base_runtime = _base_runtime()
    receiver = subprocess.Popen(
        [sys.executable, "-c", _RECEIVER], stdout=subprocess.PIPE, text=True
    )
    assert receiver.stdout is not None
    endpoint = f"http://127.0.0.1:{receiver.stdout.readline().strip()}"
    tels: list[Telemetry] = []

    def on(sampling: float) -> Callable[[], Runtime]:
        def make() -> Runtime:
            telemetry = Telemetry(TelemetryConfig(endpoint=endpoint, sampling=sampling))
            tels.append(telemetry)
            return Runtime(workers=2, telemetry=telemetry)

        return make

    variants: dict[str, Callable[[], Any]] = {
        "hooks removed": lambda: base_runtime(workers=2),
        "off": lambda: Runtime(workers=2),
        "on (batch OTLP/HTTP)": on(1.0),
        "on, 10% sampled": on(0.1),
    }
    try:
        echo = _echo()
        with tempfile.TemporaryDirectory() as tmp:
            pingpong = _pingpong(Path(tmp))
        rows: list[dict[str, object]] = []
        for name, work, n, rounds in (
            ("host ask, WAT echo agent", _host_asks, 2000 if quick else 5000, 5 if quick else 9),
            ("ping-pong, CPython agents", _ping_pong, 100 if quick else 300, 3 if quick else 7),
        ):
            component = echo if work is _host_asks else pingpong
            times: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(rounds):
                for variant, make in variants.items():
                    times[variant].append(work(make, component, n))  # type: ignore[operator]
            base = median(times["hooks removed"])
            for variant in variants:
                t = median(times[variant])
                rows.append(
                    {
                        "name": f"{name}: {variant}",
                        "us_per_msg": round(t * 1e6, 2),
                        "msgs_per_s": round(1 / t),
                        "ratio": round(t / base, 3),
                    }
                )
        for telemetry in tels:
            telemetry.shutdown(timeout=5)
        failures = sum(t.failures for t in tels)
        rows.append(
            {
                "name": "export failures (on)",
                "count": failures,
                "load_avg": round(os.getloadavg()[0], 2),
            }
        )
        report(rows)
    finally:
        receiver.terminate()
        receiver.wait(10)


if __name__ == "__main__":
    main()
