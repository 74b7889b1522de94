"""The gate: the one place host functions are registered; every guest import passes through it."""

from mighty.gate._context import (
    Binding,
    CallHook,
    Direct,
    GuestContext,
    GuestViolation,
    Handle,
    HostFunctionFailed,
    Provider,
    ResourceKind,
    StaleHandle,
    unversioned,
)
from mighty.gate._gate import Gate, GuestExitRequest, request_exit, resource_kind
from mighty.gate._scope import UNSCOPED, MissingSlot, Scope, Seed, Slot, Waitable

__all__ = [
    "UNSCOPED",
    "Binding",
    "CallHook",
    "Direct",
    "Gate",
    "GuestContext",
    "GuestExitRequest",
    "GuestViolation",
    "Handle",
    "HostFunctionFailed",
    "MissingSlot",
    "Provider",
    "ResourceKind",
    "Scope",
    "Seed",
    "Slot",
    "StaleHandle",
    "Waitable",
    "request_exit",
    "resource_kind",
    "unversioned",
]
