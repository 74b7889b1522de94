"""The one error root of mighty, split into the two families that matter to a caller.

``GuestError``: the guest failed (it trapped, exited, or ran out of a budget). The host is fine and
the caller decides what to do (retry, report, restart the agent).

``HostError``: the host could not do what was asked (bad input, a component that does not load,
a build that failed). Fix the input or the code; retrying the same thing will fail the same way.

Where a builtin was raised before, the typed error is that builtin too, so old ``except``
clauses keep working: ``BadInput`` and ``Closed`` are ``ValueError``, ``WrongType`` is a
``TypeError``, ``Misuse`` a ``RuntimeError``. ``tests/test_errors.py`` checks that every public
exception of mighty is in exactly one family.

Every error has a stable ``kind`` string: the JSON output of ``mty`` and the sandbox's
``RunResult`` use it, so renaming one is a breaking change.
"""

from __future__ import annotations

from collections.abc import Sequence

from mighty._usage import Usage

__all__ = [
    "ArgumentError",
    "BadInput",
    "BudgetExceeded",
    "BuildError",
    "Cancelled",
    "Closed",
    "CompileError",
    "DeadlineExceeded",
    "ExportNotFound",
    "GuestError",
    "GuestExit",
    "GuestTrap",
    "HostError",
    "InvalidComponent",
    "MightyError",
    "MissingImports",
    "Misuse",
    "OutOfFuel",
    "OutOfMemory",
    "WrongType",
]


class MightyError(Exception):
    """Root of every error mighty raises on purpose."""

    kind: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# -- the guest failed ---------------------------------------------------------------------------


class GuestError(MightyError):
    """The guest failed; the host is unharmed."""

    kind = "guest_error"
    usage: Usage | None = None
    """What the failed call used up to where it stopped, when the call got that far."""


class BudgetExceeded(GuestError):
    """A call ran out of one of its budgets and was stopped."""

    kind = "budget_exceeded"


class OutOfFuel(BudgetExceeded):
    """The call used all the fuel its budget allowed."""

    kind = "out_of_fuel"

    def __init__(self, message: str, *, fuel_limit: int) -> None:
        super().__init__(message)
        self.fuel_limit = fuel_limit


class OutOfMemory(BudgetExceeded):
    """The guest tried to grow its linear memory past the budget's ceiling."""

    kind = "out_of_memory"

    def __init__(self, message: str, *, limit: int, requested: int) -> None:
        super().__init__(message)
        self.limit = limit
        self.requested = requested


class DeadlineExceeded(BudgetExceeded):
    """The call was still running when its wall-clock deadline passed."""

    kind = "deadline_exceeded"

    def __init__(self, message: str, *, timeout: float) -> None:
        super().__init__(message)
        self.timeout = timeout


class Cancelled(BudgetExceeded):
    """The call was cancelled from outside: ``CancelScope.cancel``, its deadline, or a signal.

    Made only by the call's scope (``mighty.budget.CallScope``), so ``by`` is always true.
    """

    kind = "cancelled"

    def __init__(self, message: str, *, reason: str, by: str, signal: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.by = by
        """Who cancelled: ``"host"``, ``"supervisor"``, ``"deadline"`` (the cancel scope's own
        deadline) or ``"signal"`` (see ``mighty.budget.CancelledBy``)."""
        self.signal = signal
        """The signal that interrupted the call (reason ``"interrupted"``), else None."""


class GuestTrap(GuestError):
    """The guest trapped (``unreachable``, out-of-bounds access, stack overflow, ...)."""

    kind = "trap"

    def __init__(self, message: str, *, trap_code: str | None, wasm_backtrace: str) -> None:
        super().__init__(message)
        self.trap_code = trap_code
        self.wasm_backtrace = wasm_backtrace


class GuestExit(GuestError):
    """The guest called ``wasi:cli/exit``; ``code`` is its exit status."""

    kind = "guest_exit"

    def __init__(self, message: str, *, code: int) -> None:
        super().__init__(message)
        self.code = code


# -- the host could not do what was asked ------------------------------------------------------


class HostError(MightyError):
    """The host could not do what was asked; retrying the same thing fails the same way."""

    kind = "host_error"


class BadInput(HostError, ValueError):
    """Something given to mighty is not usable: a file, a name, an argument."""

    kind = "bad_input"


class WrongType(BadInput, TypeError):
    """A value given to mighty has the wrong Python type (also a ``TypeError``, for callers that
    catch the builtin)."""


class Closed(BadInput):
    """The object was closed (an instance, a sandbox); it cannot be used any more."""

    kind = "closed"


class InvalidComponent(BadInput):
    """The bytes are not a WebAssembly component this engine can load."""


class ExportNotFound(BadInput):
    """The component has no function export of that name."""

    def __init__(self, message: str, *, name: str, available: Sequence[str]) -> None:
        super().__init__(message)
        self.name = name
        self.available = tuple(available)


class ArgumentError(BadInput):
    """A value does not fit the WIT type it must be converted to or from.

    ``path`` locates the offending part, for example ``data[3]`` or ``config.retries``.
    """

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class MissingImports(BadInput):
    """The component imports things that nothing provides; ``missing`` names each one."""

    def __init__(self, message: str, *, missing: Sequence[str]) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


class CompileError(HostError):
    """wasmtime could not compile a component it was able to parse."""

    kind = "compile_error"


class Misuse(HostError, RuntimeError):
    """mighty was used in a way it does not support (one instance from two threads at once, a
    tool called outside its run); also a ``RuntimeError``, for callers that catch the builtin."""

    kind = "misuse"


class BuildError(HostError):
    """``mty build`` failed; the message carries the guest's own Python error when there is one.

    ``filename`` and ``lineno`` point at the handler source line when the failure is a Python
    error in the handler.
    """

    kind = "build_error"

    def __init__(
        self, message: str, *, filename: str | None = None, lineno: int | None = None
    ) -> None:
        super().__init__(message)
        self.filename = filename
        self.lineno = lineno
