"""What the gate hands every host function besides its arguments: the call's scope and typed slots.

``ctx.scope`` is the call the host function serves. The gate only knows its shape (:class:`Scope`);
the budget layer, which sits above the gate, creates one for each guest call
(``mighty.budget.CallScope``) and puts it in the context for the length of the call. A host
function that waits, or that does slow work on the guest's behalf, goes through it:

- ``ctx.scope.checkpoint()`` raises the call's typed stop (``Cancelled``, ``DeadlineExceeded``)
  when it must stop;
- ``with ctx.scope.paused(): ...`` does host work whose time is not charged to the guest's
  wall clock (a sandbox tool);
- ``ctx.scope.wait(what, timeout)`` is the one way to block: in slices, checking the call
  between them.

Outside a call (a test calling a binding by hand, teardown) ``ctx.scope`` is :data:`UNSCOPED`:
nothing to stop, and waiting is refused, since no deadline would bound it.

State a provider keeps per instance lives in typed slots: a module-level ``Slot[T]`` is the key,
``ctx.slot(KEY)`` returns a ``T`` and ``ctx.put(KEY, value)`` takes one, so mypy checks both ends.
Rejected: the string-keyed ``ctx.state`` dict this replaces (any layer could read or overwrite
any other's entry, lambdas passed between layers through it, and every read was ``Any``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar

from mighty._errors import HostError

__all__ = ["UNSCOPED", "MissingSlot", "Scope", "Seed", "Slot", "Waitable"]

_T = TypeVar("_T")

Waitable = concurrent.futures.Future[Any] | threading.Event | Callable[[float], bool]
"""What :meth:`Scope.wait` can wait for: a future, an event, or ``block(seconds) -> ready``,
a function that blocks for at most ``seconds`` and says whether what it waits for is ready."""


class Scope(ABC):
    """The guest call a host function serves (``ctx.scope``); see the module docstring."""

    __slots__ = ()

    @abstractmethod
    def checkpoint(self) -> None:
        """Raise the call's typed stop if it must stop now (cancelled, interrupted, too late)."""

    @abstractmethod
    def paused(self) -> AbstractContextManager[None]:
        """A block whose wall time is not charged to the call's deadline (host work)."""

    @abstractmethod
    def wait(self, what: Waitable, timeout: float | None) -> bool:
        """Block until ``what`` is ready (True) or ``timeout`` seconds pass (False); the call's
        stop is raised as soon as it is noticed (between slices of the wait)."""

    # The call's outcome as the gate sees it, reported to the scope of the call it belongs to
    # (so it lives and dies with that call: nothing per call is left on the long-lived
    # context to reset). Only a guest call's scope keeps them; elsewhere there is no call to
    # end, and the gate's trap says what happened.

    def host_failed(self, exc: BaseException) -> None:
        """A host function raised instead of answering (the gate then traps the call)."""
        del exc

    def guest_exited(self, code: int) -> None:
        """The guest asked to exit with ``code`` (``wasi:cli/exit``; the gate then traps)."""
        del code


class _Unscoped(Scope):
    __slots__ = ()

    def checkpoint(self) -> None:
        return None

    def paused(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def wait(self, what: Waitable, timeout: float | None) -> bool:
        raise HostError("a host function tried to wait outside a guest call (no deadline)")

    def __repr__(self) -> str:
        return "UNSCOPED"


UNSCOPED: Scope = _Unscoped()
"""``ctx.scope`` while no guest call is in flight."""


class MissingSlot(HostError):
    """A host function read a slot its provider never filled (a host bookkeeping bug)."""


class Slot(Generic[_T]):
    """A typed key for one piece of per-instance state: ``ctx.slot(KEY)`` is a ``T``.

    Compared by identity: two slots with the same name are different keys. Define one per
    module, at module level.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def of(self, value: _T) -> Seed:
        """This slot filled with ``value``, to seed a new context (``Gate.context(seed=...)``)."""
        return Seed(self, value)

    def __repr__(self) -> str:
        return f"Slot({self.name!r})"


class Seed:
    """A slot and its value, made by :meth:`Slot.of` (which is where the type is checked)."""

    __slots__ = ("slot", "value")

    def __init__(self, slot: Slot[Any], value: Any) -> None:
        self.slot = slot
        self.value = value

    def __repr__(self) -> str:
        return f"{self.slot.name}={self.value!r}"
