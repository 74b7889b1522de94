"""Durable agents: the cost of the journal on the message path, recovery time, log size.

Run: .venv/bin/python benchmarks/bench_durable.py [--json] [--quick]

The agent is benchmarks/agents/durable_bench.py (a componentize-py CPython agent). Its `work`
message makes 10 imports (wall-clock reads).

1. message path: asks of `work` to a durable agent (snapshot after every message, the inbox row,
   the import log written with flush="record") against the same asks to the same agent type
   not durable, in turns in one runtime each; p50 per message and the ratio (target <= 1.5x).
   The baseline for the journal alone: the same durable agent with the journal switched off
   (the snapshot-per-message durability of before), so the table shows what the journal adds.
2. recovery: a process makes a `hold` message of 10,000 imports and is killed with -9 at its
   last import (a tool call that never returns); a new process registers the type and asks
   `status`, which answers once the recovered message has been re-run with the 10,000 answers
   from the log. Recovery time = register + the ask (target <= 1 s), against the same agent
   woken from its snapshot with nothing to recover (register + ask), measured the same way.
3. log size: bytes of the import log of a 10-import message and of the 10,000-import one (the
   log is deleted at each checkpoint, so this is all it ever holds).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, median, report

sys.path.insert(0, str(ROOT))

QUICK = "--quick" in sys.argv
ASKS = 30 if QUICK else 200
IMPORTS = 10
LOG_IMPORTS = 10_000


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _component() -> Path:
    from mighty.build import build_component

    out = Path(tempfile.gettempdir()) / "mty-bench-durable.wasm"
    build_component(
        ROOT / "benchmarks" / "agents" / "durable_bench.py",
        output=out,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    return out


def _runtime(state: Path, wasm: Path, durable: bool, journal: bool = True):  # type: ignore[no-untyped-def]
    from mighty import Component
    from mighty.agents import AgentType, Grants, Runtime
    from mighty.budget import Budget
    from mighty.capabilities import Capabilities

    def pause() -> str:
        """Never returns in the first process (the benchmark kills it)."""
        if os.environ.get("MTY_BENCH_HOLD"):
            Path(os.environ["MTY_BENCH_HOLD"]).write_text("held")
            time.sleep(3600)
        return "go"

    runtime = Runtime(
        workers=1, state_dir=state, capabilities=Capabilities().with_tool("pause", pause)
    )
    if not journal:
        runtime.journal = None
    agent_type = AgentType(
        "bench",
        Component.load(wasm),
        budget=Budget(timeout=600.0),
        durable=durable,
        grants=Grants(tools=frozenset({"pause"})),
    )
    return runtime, agent_type


def message_path(wasm: Path) -> list[dict[str, object]]:
    times: dict[str, list[float]] = {"durable": [], "journal off": [], "not durable": []}
    with tempfile.TemporaryDirectory() as tmp:
        setups = {
            "durable": _runtime(Path(tmp) / "a", wasm, True),
            "journal off": _runtime(Path(tmp) / "b", wasm, True, journal=False),
            "not durable": _runtime(Path(tmp) / "c", wasm, False),
        }
        addresses = {}
        for name, (runtime, agent_type) in setups.items():
            runtime.register(agent_type)
            addresses[name] = runtime.spawn("bench")
            for _ in range(5):
                runtime.ask(addresses[name], "work", {"imports": IMPORTS})
        log_bytes = 0
        for _ in range(ASKS):
            for name, (runtime, _t) in setups.items():
                started = time.perf_counter()
                runtime.ask(addresses[name], "work", {"imports": IMPORTS})
                times[name].append(time.perf_counter() - started)
        log = Path(tmp) / "a" / "journal" / "bench_1.trace"
        log_bytes = log.stat().st_size if log.exists() else 0
        for runtime, _t in setups.values():
            runtime.shutdown()
    p50 = {k: median(v) * 1e6 for k, v in times.items()}
    return [
        {
            "name": f"durable message, {IMPORTS} imports",
            "p50_us": round(p50["durable"]),
            "not_durable_p50_us": round(p50["not durable"]),
            "ratio": round(p50["durable"] / p50["not durable"], 2),
            "target_ratio": 1.5,
            "journal_off_p50_us": round(p50["journal off"]),
            "journal_adds_us": round(p50["durable"] - p50["journal off"]),
            "log_bytes_after_checkpoint": log_bytes,
            "load": load(),
        }
    ]


_SECOND = """
import json, sys, time
sys.path.insert(0, {bench!r})
sys.path.insert(0, {root!r})
from bench_durable import _runtime
from pathlib import Path
started = time.perf_counter()
runtime, agent_type = _runtime(Path({state!r}), Path({wasm!r}), True)
runtime.register(agent_type)
status = runtime.ask("bench:1", "status", timeout=600)
took = time.perf_counter() - started
runtime.shutdown()
print(json.dumps({{"status": status, "seconds": took}}))
"""

_FIRST = """
import sys, time
sys.path.insert(0, {bench!r})
sys.path.insert(0, {root!r})
from bench_durable import _runtime
from pathlib import Path
runtime, agent_type = _runtime(Path({state!r}), Path({wasm!r}), True)
runtime.register(agent_type)
address = runtime.spawn("bench")
runtime.ask(address, "work", {{"imports": 1}})
runtime.send(address, "hold", {{"imports": {imports}}}) if {hold} else None
time.sleep(3600)
"""


def _crash_and_recover(wasm: Path, tmp: Path, hold: bool) -> tuple[float, int]:
    state, marker = tmp / "state", tmp / "held"
    fmt = {
        "bench": str(ROOT / "benchmarks"),
        "root": str(ROOT),
        "state": str(state),
        "wasm": str(wasm),
        "imports": LOG_IMPORTS,
        "hold": hold,
    }
    env = {**os.environ, "MTY_BENCH_HOLD": str(marker)}
    first = subprocess.Popen([sys.executable, "-c", _FIRST.format(**fmt)], env=env)
    deadline = time.monotonic() + 600
    ready = (marker.exists) if hold else ((state / "mighty.db").exists)
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not hold:
        time.sleep(3.0)  # the first message's checkpoint is written
    log = state / "journal" / "bench_1.trace"
    size = log.stat().st_size if log.exists() else 0
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    done = subprocess.run(
        [sys.executable, "-c", _SECOND.format(**fmt)],
        env={k: v for k, v in os.environ.items() if k != "MTY_BENCH_HOLD"},
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["seconds"]), size


def recovery(wasm: Path) -> list[dict[str, object]]:
    rounds = 1 if QUICK else 3
    recovered, plain, sizes = [], [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            seconds, size = _crash_and_recover(wasm, Path(tmp), hold=True)
            recovered.append(seconds)
            sizes.append(size)
        with tempfile.TemporaryDirectory() as tmp:
            plain.append(_crash_and_recover(wasm, Path(tmp), hold=False)[0])
    return [
        {
            "name": f"recovery, {LOG_IMPORTS:,}-import log",
            "seconds": round(median(recovered), 3),
            "target_seconds": 1.0,
            "baseline_wake_seconds": round(median(plain), 3),
            "recovery_minus_wake_s": round(median(recovered) - median(plain), 3),
            "log_bytes": int(median([float(s) for s in sizes])),
            "bytes_per_import": round(median([float(s) for s in sizes]) / LOG_IMPORTS, 1),
            "load": load(),
        }
    ]


def main() -> None:
    wasm = _component()
    report([*message_path(wasm), *recovery(wasm)])


if __name__ == "__main__":
    main()
