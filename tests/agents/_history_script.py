"""A process running the durable worker of tests/agents/guests/journaled.py, for
tests/agents/test_history.py (killed with -9 in ``crash``).

``python -m tests.agents._history_script MODE WASM STATE_DIR COUNTER MARKER [NAME...]``. Tools:
``count(step)`` appends the step to COUNTER; ``pause()`` writes MARKER and waits to be killed
in ``crash``, returns at once otherwise. ``clean`` spawns ``w`` and asks it ``work`` twice;
``crash`` brings ``w`` back, sends ``work``, ``status``, ``work`` and waits in the first;
``status`` asks each agent NAME... (recovered, or brought back by name) its status and
prints them as one JSON object.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from mighty import Component
from mighty.agents import AgentType, Grants, NoProc, Runtime
from mighty.budget import Budget
from mighty.capabilities import Capabilities


def main() -> None:
    mode, wasm, state_dir, counter, marker = sys.argv[1:6]

    def count(step: int) -> int:
        """Note a step the outside world saw."""
        with open(counter, "a") as out:
            out.write(f"{step}\n")
        return step

    def pause() -> str:
        """Wait to be killed (crash), or go on."""
        if mode == "crash":
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
        if mode == "clean":
            address = runtime.spawn("worker", name="w")
            print(json.dumps([runtime.ask(address, "work", timeout=600) for _ in range(2)]))
        elif mode == "crash":
            address = runtime.spawn("worker", name="w")
            for message in ("work", "status", "work"):
                runtime.send(address, message)
            time.sleep(3600)
        else:
            found = {}
            for name in sys.argv[6:]:
                try:
                    found[name] = runtime.ask(name, "status", timeout=600)
                except NoProc:  # not recovered (no pending messages): brought back by name
                    runtime.spawn("worker", name=name)
                    found[name] = runtime.ask(name, "status", timeout=600)
            print(json.dumps(found))


if __name__ == "__main__":
    main()
