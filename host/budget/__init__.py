"""The budget layer: fuel, memory and deadline scopes, cancellation, traps as typed errors."""

from mighty.budget._budget import (
    DEFAULT_FUEL,
    DEFAULT_MEMORY,
    DEFAULT_TIMEOUT,
    Budget,
    Meter,
    Usage,
    interrupting,
    split_wasmtime_error,
    trap_code_of,
)
from mighty.budget._scope import WAIT_SLICE, CallScope, CancelledBy, CancelScope, StopReason

__all__ = [
    "DEFAULT_FUEL",
    "DEFAULT_MEMORY",
    "DEFAULT_TIMEOUT",
    "WAIT_SLICE",
    "Budget",
    "CallScope",
    "CancelScope",
    "CancelledBy",
    "Meter",
    "StopReason",
    "Usage",
    "interrupting",
    "split_wasmtime_error",
    "trap_code_of",
]
