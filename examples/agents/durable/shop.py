"""The outside world of the orders agent: each tool appends what it did to ledger.txt.

`charge` takes the idempotency key the host passes (a payment API would be given it as a
header); `ship` waits to be killed when CRASH_IN_SHIP is set, to show a recovery.
"""

import os
import time
from pathlib import Path

LEDGER = Path(__file__).with_name("ledger.txt")


def _note(line: str) -> None:
    with LEDGER.open("a") as out:
        out.write(line + "\n")


def reserve(item: str) -> bool:
    """Reserve an item in the warehouse."""
    _note(f"reserve {item}")
    return True


def charge(item: str, cents: int, idempotency_key: str = "") -> bool:
    """Charge the customer's card."""
    _note(f"charge {item} {cents}")
    return True


def ship(item: str) -> bool:
    """Hand the item to the carrier."""
    if os.environ.get("CRASH_IN_SHIP"):
        Path(__file__).with_name("shipping").write_text("the process is about to be killed")
        time.sleep(3600)
    _note(f"ship {item}")
    return True
