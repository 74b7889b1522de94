"""What handing a large ``list<u8>`` to a guest costs the host, and the bound on it.

wasmtime's C API takes a component call's arguments as ``wasmtime_component_val_t`` values, one
32-byte value per element of a list, which it converts to its own ``Val`` (another 32-40 bytes
each) before it copies them into the guest's memory one by one: a ``list<u8>`` of N bytes holds
about 80 N bytes of host memory while it is handed over, and takes ~0.5 us a byte (measured by
``benchmarks/bench_restore.py``: 8 MiB, +648 MiB peak RSS and 4 s; 32 MiB, +2.6 GB and 28 s).
A stored snapshot under the store's 64 MiB limit took a waking runtime to 5 GB. The other way
is cheap (a 2 MiB ``snapshot`` result: +2 MiB, 0.4 s) but bounded by wasmtime itself: a result
list of ~3 MiB or more traps ("fuel allocated for hostcalls has been exhausted"), so states that
large reach ``restore`` only from a forged or older store row, a migration or a durable stream.

Until the agent world has a way to hand over bytes that is not a list of values, the host
charges that cost to the call's memory budget: :func:`check_lowering` refuses, as
``OutOfMemory`` and before anything is built, a ``list<u8>`` whose lowering would take more host
memory than the agent may use. Callers: the agent's ``restore`` (waking from the store, a
migration, a durable agent's recovery). Rejected: a fixed lower cap for everyone (an agent given
a large memory budget may restore a large state), and lowering in pieces (``restore`` takes one
list; a second export would change the agent world for every component).
"""

from __future__ import annotations

from mighty._errors import OutOfMemory

__all__ = ["LOWERED_BYTES_PER_BYTE", "check_lowering"]

LOWERED_BYTES_PER_BYTE = 80
"""Host bytes a ``list<u8>`` argument holds per element while wasmtime lowers it (measured)."""


def check_lowering(size: int, limit: int, what: str) -> None:
    """Refuse (``OutOfMemory``) handing ``size`` bytes to a guest as one ``list<u8>`` when the
    lowering would hold more than ``limit`` bytes of host memory (the call's memory budget)."""
    needed = size * LOWERED_BYTES_PER_BYTE
    if needed > limit:
        raise OutOfMemory(
            f"{what}: handing {size} bytes to the guest takes ~{needed} bytes of host memory "
            f"({LOWERED_BYTES_PER_BYTE} a byte), over the {limit}-byte memory budget",
            limit=limit,
            requested=needed,
        )
