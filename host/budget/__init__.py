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
from mighty.budget._context import (
    MAX_PROGRESS_TEXT,
    ContextKind,
    Progress,
    ProgressSink,
    RunContext,
    current_context,
    enter_context,
    leave_context,
    new_id,
    using_context,
)
from mighty.budget._scope import WAIT_SLICE, CallScope, CancelledBy, CancelScope, StopReason

__all__ = [
    "DEFAULT_FUEL",
    "DEFAULT_MEMORY",
    "DEFAULT_TIMEOUT",
    "MAX_PROGRESS_TEXT",
    "WAIT_SLICE",
    "Budget",
    "CallScope",
    "CancelScope",
    "CancelledBy",
    "ContextKind",
    "Meter",
    "Progress",
    "ProgressSink",
    "RunContext",
    "StopReason",
    "Usage",
    "current_context",
    "enter_context",
    "interrupting",
    "leave_context",
    "new_id",
    "split_wasmtime_error",
    "trap_code_of",
    "using_context",
]
