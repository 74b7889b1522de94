"""mighty: run handlers compiled to WebAssembly components under hard budgets.

The names below are the public API; everything else lives in private ``_modules`` and may change.
"""

from mighty._errors import (
    ArgumentError,
    BadInput,
    BudgetExceeded,
    BuildError,
    Cancelled,
    Closed,
    CompileError,
    DeadlineExceeded,
    ExportNotFound,
    GuestError,
    GuestExit,
    GuestTrap,
    HostError,
    InvalidComponent,
    MightyError,
    MissingImports,
    Misuse,
    OutOfFuel,
    OutOfMemory,
    WrongType,
)
from mighty.abi import Err, Ok, Some, Variant
from mighty.budget import Budget, CancelScope, RunContext, Usage, current_context
from mighty.engine import Component
from mighty.instance import Instance, call_once

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "BadInput",
    "Budget",
    "BudgetExceeded",
    "BuildError",
    "CancelScope",
    "Cancelled",
    "Closed",
    "CompileError",
    "Component",
    "DeadlineExceeded",
    "Err",
    "ExportNotFound",
    "GuestError",
    "GuestExit",
    "GuestTrap",
    "HostError",
    "Instance",
    "InvalidComponent",
    "MightyError",
    "MissingImports",
    "Misuse",
    "Ok",
    "OutOfFuel",
    "OutOfMemory",
    "RunContext",
    "Some",
    "Usage",
    "Variant",
    "WrongType",
    "__version__",
    "call_once",
    "current_context",
]
