"""A process running one durable agent, for tests/agents/test_journal.py (killed with -9).

``python -m tests.agents._journal_script first|second WASM STATE_DIR COUNTER MARKER``. Its host
tools: ``count(step)`` appends the step to COUNTER (each call the outside world saw);
``pause()`` in ``first`` writes MARKER and then waits to be killed, in ``second`` returns;
each call notes its idempotency key in MARKER.keys.
``first`` sends one "work" message; ``second`` only registers the type (recovery runs the
journaled message) and prints the agent's status as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from mighty import Component
from mighty.agents import AgentType, Grants, Runtime
from mighty.budget import Budget
from mighty.capabilities import Capabilities


def main() -> None:
    mode, wasm, state_dir, counter, marker = sys.argv[1:6]

    def count(step: int) -> int:
        """Note a step the outside world saw."""
        with open(counter, "a") as out:
            out.write(f"{step}\n")
        return step

    def pause(idempotency_key: str = "") -> str:
        """Wait for the test to kill the process (first run), or go on (second); the key the
        host passed goes to MARKER.keys."""
        with open(marker + ".keys", "a") as out:
            out.write(f"{idempotency_key}\n")
        if mode == "first":
            Path(marker).write_text("paused")
            time.sleep(3600)
        return "go"

    capabilities = Capabilities().with_tool("count", count).with_tool("pause", pause)
    worker = AgentType(
        "worker",
        Component.load(wasm),
        budget=Budget(timeout=3600.0),
        durable=True,
        grants=Grants(tools=frozenset({"count", "pause"})),
    )
    with Runtime(workers=1, state_dir=state_dir, capabilities=capabilities) as runtime:
        runtime.register(worker)
        if mode == "first":
            address = runtime.spawn("worker", name="w")
            runtime.send(address, "work")
            time.sleep(3600)
        status = runtime.ask("worker:1", "status", timeout=600)
        print(json.dumps({"status": status, "events": [e.kind for e in runtime.events]}))


if __name__ == "__main__":
    main()
