"""A process running the durable worker of tests/agents/guests/journaled.py for
tests/agents/test_crash_points.py, killed by one of its own tool calls when asked to.

``python -m tests.agents._crash_points_script WASM STATE_DIR LEDGER SENDS CRASH_AT PHASE``:
registers the worker type (which recovers what a crash left), brings ``w`` back by name or
spawns it, sends it SENDS ``work`` messages, then asks its status and prints
``{"status": N}``. Each ``work`` makes five tool calls: ``count(1)``, ``count(2)``,
``count(3)``, ``pause()``, ``count(4)``. Each tool appends ``NAME STEP KEY`` to LEDGER (one
``write`` of an ``O_APPEND`` file: it reaches the operating system before the call returns),
KEY being the idempotency key the host passed. The CRASH_AT-th tool call this process makes
(0: none) notes ``PHASE KEY`` in ``LEDGER.crash`` and kills the process with SIGKILL, before
its effect (PHASE ``before``) or after it (``after``): a crash with the call in flight.

Tool calls wait until every send has returned, so the test knows which messages were
accepted (a send returns once the message's inbox row is written).

With a seventh argument, BASE_URL, the agent is tests/agents/guests/fetching.py instead: each
``work`` makes three HTTP requests, ``POST BASE_URL/effect``, granted that origin only; the
test's server counts them, notes their ``Idempotency-Key`` and kills this process at the
chosen request (CRASH_AT and PHASE are not used here). After its sends the process tells the
server with ``GET BASE_URL/sent``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import urllib.request

from mighty import Component
from mighty.agents import AgentType, Grants, Runtime
from mighty.budget import Budget
from mighty.capabilities import Capabilities
from mighty.wasi import Policy


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def main() -> None:
    wasm, state_dir, ledger, sends, crash_at, phase = sys.argv[1:7]
    sent = threading.Event()
    lock = threading.Lock()
    calls = [0]

    def effect(name: str, step: int, key: str) -> None:
        """The outside world sees the call; the chosen one dies around its effect."""
        sent.wait()
        with lock:
            calls[0] += 1
            crash = calls[0] == int(crash_at)
        if crash and phase == "after":
            _append(ledger, f"{name} {step} {key}\n")
        if crash:
            _append(ledger + ".crash", f"{phase} {key}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        _append(ledger, f"{name} {step} {key}\n")

    def count(step: int, idempotency_key: str = "") -> int:
        """A step of the work, seen outside."""
        effect("count", step, idempotency_key)
        return step

    def pause(idempotency_key: str = "") -> str:
        """Another call with an effect, in the middle of the work."""
        effect("pause", 0, idempotency_key)
        return "go"

    base = sys.argv[7] if len(sys.argv) > 7 else None
    capabilities = Capabilities().with_tool("count", count).with_tool("pause", pause)
    worker = AgentType(
        "worker",
        Component.load(wasm),
        budget=Budget(timeout=3600.0),
        durable=True,
        grants=Grants(tools=frozenset({"count", "pause"})),
        policy=Policy() if base is None else Policy().with_http(base, methods=["POST"]),
    )
    with Runtime(workers=1, state_dir=state_dir, capabilities=capabilities) as runtime:
        runtime.register(worker)
        address = runtime.whereis("w") or runtime.spawn(
            "worker", None if base is None else {"base": base}, name="w"
        )
        for _ in range(int(sends)):
            runtime.send(address, "work")
        sent.set()
        if base is not None:
            with urllib.request.urlopen(f"{base}/sent", timeout=600) as answer:
                answer.read()
        status = runtime.ask(address, "status", timeout=600)
        print(json.dumps({"status": status}))


if __name__ == "__main__":
    main()
