"""The counted tool of tests/cluster/test_journal_kill.py: each call is a line of $COUNTS
(its step and the idempotency key the host passed); with $HOLD_AT the call of that step writes
$MARKER and waits (for the test to SIGKILL the node) until $MARKER.release exists."""

import os
import time
from pathlib import Path


def step(i: int, idempotency_key: str = "") -> int:
    """One step of the message: noted, then answered."""
    with open(os.environ["COUNTS"], "a") as out:
        out.write(f"{i} {idempotency_key}\n")
    if os.environ.get("HOLD_AT") == str(i):
        marker = Path(os.environ["MARKER"])
        marker.write_text("holding")
        deadline = time.monotonic() + 600
        while not marker.with_suffix(".release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return 10 * i + 1
