"""The gate: the one place host functions are registered; every guest import passes through it."""

from mighty.gate._gate import (
    Binding,
    CallHook,
    Gate,
    GuestContext,
    GuestExitRequest,
    GuestViolation,
    Handle,
    HostFunctionFailed,
    Provider,
    ResourceKind,
    StaleHandle,
    request_exit,
    resource_kind,
    unversioned,
)

__all__ = [
    "Binding",
    "CallHook",
    "Gate",
    "GuestContext",
    "GuestExitRequest",
    "GuestViolation",
    "Handle",
    "HostFunctionFailed",
    "Provider",
    "ResourceKind",
    "StaleHandle",
    "request_exit",
    "resource_kind",
    "unversioned",
]
