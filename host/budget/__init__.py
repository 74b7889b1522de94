"""The budget layer: fuel, memory and deadline scopes, cancellation, traps as typed errors."""

from mighty.budget._budget import (
    DEFAULT_FUEL,
    DEFAULT_MEMORY,
    DEFAULT_TIMEOUT,
    Budget,
    CancelScope,
    Meter,
    Usage,
    split_wasmtime_error,
    trap_code_of,
)

__all__ = [
    "DEFAULT_FUEL",
    "DEFAULT_MEMORY",
    "DEFAULT_TIMEOUT",
    "Budget",
    "CancelScope",
    "Meter",
    "Usage",
    "split_wasmtime_error",
    "trap_code_of",
]
