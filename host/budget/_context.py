"""The run context: who a piece of work runs for, until when, and how to stop it.

A :class:`RunContext` is made for every sandbox run, every tool call of a run and every agent
message. It is frozen data plus one cancel scope: an id, the id of the work it was started by
(``parent``), how deep it is nested (``depth``), the agent it runs as or for (``agent``), and
a :class:`~mighty.budget.CancelScope` whose deadline and cancellation it inherits from its
parent's (``CancelScope(parent=...)``). So one cancel, or one deadline, reaches everything
beneath it: a run's tools, a run a tool started, an agent an agent asked.

Work finds its context two ways. A tool asks for it by a parameter annotated ``RunContext``
(as pydantic-ai passes its ``RunContext``), and :func:`current_context` returns the context of
the work the calling code runs in (a ``contextvars`` variable: it follows threads the host
hands work to and asyncio tasks). Host code that starts nested work takes the current context
as the parent; there is nothing to thread through by hand.

``ctx.progress(message, done=..., total=...)`` reports progress to whoever started the work
(a sandbox run's ``on_output`` as the ``"progress"`` stream, an MCP client as progress
notifications): bounded text, and a listener that raises is dropped, never the work.

Rejected:
- putting the context in the gate's ``CallScope``: a call scope is one guest call's clock (it
  stops while the host works, see ``CallScope.paused``); a context spans the work of many
  calls and of the host between them (a tool's thread, an ask waiting in a mailbox).
- a mutable context whose deadline callers tighten: a child tightens its own scope's deadline
  when it is made (``CancelScope(parent=..., deadline=...)``); nothing loosens a parent's.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from mighty._errors import BadInput
from mighty.budget._scope import CancelledBy, CancelScope

__all__ = [
    "MAX_PROGRESS_TEXT",
    "ContextKind",
    "Progress",
    "ProgressSink",
    "RunContext",
    "current_context",
    "enter_context",
    "leave_context",
    "new_id",
    "using_context",
]

ContextKind = Literal["run", "tool", "message", "request"]
"""What a context is for: a sandbox run, a tool call, an agent message, an HTTP request."""

MAX_PROGRESS_TEXT = 1000
"""Longest progress message passed on (characters); longer ones are cut."""

_log = logging.getLogger("mighty.budget")
_CURRENT: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "mighty_run_context", default=None
)
_IDS = itertools.count(1)
_now = time.monotonic


def new_id(prefix: str) -> str:
    """A fresh id, unique in this process: ``prefix`` and a counter (``run-12``)."""
    return f"{prefix}-{next(_IDS)}"


@dataclass(frozen=True, slots=True)
class Progress:
    """One progress report: ``message``, and how far along (``done`` of ``total``) if known."""

    context: str
    """The id of the context that reported it."""
    message: str
    done: float | None = None
    total: float | None = None

    def to_json(self) -> dict[str, str | float | None]:
        return {
            "context": self.context,
            "message": self.message,
            "done": self.done,
            "total": self.total,
        }


ProgressSink = Callable[[Progress], None]
"""Who hears a context's progress (called on the reporting thread)."""


class RunContext:
    """Who a piece of work runs for, until when, and how to stop it (see the module docstring).

    ``ctx.cancelled`` says the work should stop (cancelled, or its deadline passed);
    ``ctx.check()`` raises the typed stop (``Cancelled``); ``ctx.remaining()`` is the time
    left; ``ctx.progress(...)`` reports progress. Read-only: every field is a property over a
    slot set once (rejected: a frozen dataclass, whose ``__init__`` costs 1.6 us against
    0.4 us here, paid for every agent message).
    """

    __slots__ = ("_agent", "_cancel", "_depth", "_id", "_kind", "_parent", "_progress")

    def __init__(
        self,
        id: str,
        cancel: CancelScope,
        kind: ContextKind = "run",
        parent: str | None = None,
        depth: int = 0,
        agent: str | None = None,
        on_progress: ProgressSink | None = None,
    ) -> None:
        self._id = id
        self._cancel = cancel
        self._kind: ContextKind = kind
        self._parent = parent
        self._depth = depth
        self._agent = agent
        self._progress = on_progress

    @property
    def id(self) -> str:
        return self._id

    @property
    def cancel(self) -> CancelScope:
        """The scope that stops this work (linked to the parent's)."""
        return self._cancel

    @property
    def kind(self) -> ContextKind:
        return self._kind

    @property
    def parent(self) -> str | None:
        """The id of the context this one was started in (None at the top)."""
        return self._parent

    @property
    def depth(self) -> int:
        """How many contexts enclose this one."""
        return self._depth

    @property
    def agent(self) -> str | None:
        """The agent this work runs as (a message) or for (a tool an agent called), if any."""
        return self._agent

    @property
    def on_progress(self) -> ProgressSink | None:
        return self._progress

    def __repr__(self) -> str:
        return (
            f"RunContext({self._id!r}, kind={self._kind!r}, parent={self._parent!r}, "
            f"depth={self._depth}, agent={self._agent!r}, cancelled={self.cancelled})"
        )

    @classmethod
    def top(
        cls,
        kind: ContextKind,
        *,
        cancel: CancelScope | None = None,
        timeout: float | None = None,
        agent: str | None = None,
        on_progress: ProgressSink | None = None,
    ) -> RunContext:
        """A context for new work: the child of the current context if there is one (so the
        caller's cancel and deadline reach it), else a top-level one. ``cancel`` is the
        caller's own scope (it is the parent of this context's scope); ``timeout`` tightens
        the deadline."""
        outer = _CURRENT.get()
        if outer is not None:
            return outer.child(
                kind, cancel=cancel, timeout=timeout, agent=agent, on_progress=on_progress
            )
        deadline = None if timeout is None else _now() + _checked_timeout(timeout)
        return cls(
            new_id(kind),
            CancelScope(deadline=deadline, parent=cancel),
            kind,
            None,
            0,
            agent,
            on_progress,
        )

    def child(
        self,
        kind: ContextKind,
        *,
        id: str | None = None,
        cancel: CancelScope | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        agent: str | None = None,
        on_progress: ProgressSink | None = None,
    ) -> RunContext:
        """Work started inside this one: cancelled with it, ending by its deadline at the
        latest. ``cancel``: a scope of the caller's that can cancel the child too (linked:
        cancelling it cancels the child, not this context); ``timeout``/``deadline`` tighten
        the child's deadline; progress goes to ``on_progress``, else to this context's."""
        if timeout is not None:
            until = _now() + _checked_timeout(timeout)
            deadline = until if deadline is None else min(deadline, until)
        if cancel is None or cancel is self.cancel:
            scope = CancelScope(deadline=deadline, parent=self.cancel)
        else:  # both must reach the child: this context, and the caller's own scope
            scope = CancelScope.within(self.cancel, cancel, deadline=deadline)
        return RunContext(
            id if id is not None else new_id(kind),
            scope,
            kind,
            self.id,
            self.depth + 1,
            agent if agent is not None else self.agent,
            on_progress if on_progress is not None else self.on_progress,
        )

    # -- reading it -------------------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """Whether the work should stop now: cancelled (here or above), or past its deadline."""
        return self.cancel.cancel_called

    @property
    def deadline(self) -> float | None:
        """When the work must be done (``time.monotonic()``), or None."""
        return self.cancel.deadline

    def remaining(self) -> float | None:
        """Seconds left until the deadline (0 once passed), or None without one."""
        return self.cancel.remaining()

    def check(self) -> None:
        """Raise ``Cancelled`` (who and why) if the work should stop; else nothing."""
        if self.cancel.cancel_called:
            raise self.cancel.error()

    def stop(self, reason: str, *, by: CancelledBy = "host") -> None:
        """Cancel this work and everything started in it (any thread)."""
        self.cancel.cancel(reason, by=by)

    def progress(
        self, message: str, *, done: float | None = None, total: float | None = None
    ) -> None:
        """Tell whoever started the work how far along it is (a no-op when nobody listens).

        ``message`` is cut to :data:`MAX_PROGRESS_TEXT` characters; ``done`` and ``total``
        must be finite numbers when given."""
        sink = self._progress
        if sink is None:
            return
        text = str(message)
        if len(text) > MAX_PROGRESS_TEXT:
            text = text[: MAX_PROGRESS_TEXT - 3] + "..."
        report = Progress(self.id, text, _finite(done, "done"), _finite(total, "total"))
        try:
            sink(report)
        except Exception:  # noqa: BLE001 -- a listener's bug must not stop the work
            _log.exception("a progress listener of %s raised; it is dropped", self.id)
            self._progress = None


def _checked_timeout(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput(f"a timeout is a number of seconds, got {type(value).__name__}")
    if not (value >= 0 and math.isfinite(value)):
        raise BadInput(f"a timeout is a finite number >= 0, got {value}")
    return float(value)


def _finite(value: float | None, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadInput(f"progress {what} must be a finite number, got {value!r}")
    return float(value)


def current_context() -> RunContext | None:
    """The context of the work the calling code runs in (None outside any)."""
    return _CURRENT.get()


def enter_context(ctx: RunContext | None) -> contextvars.Token[RunContext | None]:
    """Make ``ctx`` current; hand the token to :func:`leave_context` (the hot paths' form of
    :func:`using_context`, without a generator)."""
    return _CURRENT.set(ctx)


def leave_context(token: contextvars.Token[RunContext | None]) -> None:
    """Undo the :func:`enter_context` that returned ``token``."""
    _CURRENT.reset(token)


@contextmanager
def using_context(ctx: RunContext) -> Iterator[RunContext]:
    """Make ``ctx`` the current context for the block (for work started inside it)."""
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
