"""Agent types, envelopes, events and the errors senders see."""

from __future__ import annotations

import enum
import itertools
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel

from mighty._errors import BadInput, GuestError, HostError, MightyError
from mighty.budget import Budget, CancelScope, RunContext
from mighty.engine import Component
from mighty.gate import Scope
from mighty.wasi import Policy

__all__ = [
    "AgentCrashed",
    "AgentError",
    "AgentEvent",
    "AgentState",
    "AgentType",
    "Ask",
    "AskCycle",
    "AskTimeout",
    "BadSpawn",
    "CircuitOpen",
    "CircuitOpenError",
    "Envelope",
    "Grants",
    "HandlerFailed",
    "MailboxFullError",
    "MailboxSettings",
    "MessageCancelled",
    "MessageDropped",
    "NoProc",
    "Refused",
    "RetryPolicy",
]


class AgentError(MightyError):
    """A send, ask or spawn did not happen; ``code`` is the WIT ``agent-error`` case.

    It groups the errors a sender sees by what the WIT interface reports, and is in neither
    family itself: each case is under exactly one of them, by its cause. The target's guest
    caused ``HandlerFailed``, ``AgentCrashed`` and ``CircuitOpen`` (GuestError); the host or
    the caller caused the others (HostError).
    """

    kind = "agent_error"
    code = "failed"


class NoProc(AgentError, HostError):
    """No live agent has that address."""

    code = "noproc"


class MailboxFullError(AgentError, HostError):
    """The target's mailbox is full and its policy is to fail (or blocking timed out)."""

    code = "mailbox-full"


class MessageDropped(MailboxFullError):
    """The target's mailbox is full and its policy is ``"drop"``: the message was dropped."""


class Refused(AgentError, HostError):
    """The target's protocol does not accept the message (unknown name or invalid body)."""

    code = "refused"


class HandlerFailed(AgentError, GuestError):
    """The handler returned an error for this message; the agent is still running."""

    code = "failed"


class AgentCrashed(AgentError, GuestError):
    """The agent crashed on this message (trap, budget); ``reason`` says how."""

    code = "failed"


class AskTimeout(AgentError, HostError):
    """No reply within the timeout."""

    code = "timeout"


class MessageCancelled(AgentError, HostError):
    """The message was cancelled (``Runtime.cancel``, or its asker's cancel or deadline)
    before its handler ran; the agent did not see it."""

    code = "failed"
    kind = "message_cancelled"


class AskCycle(AgentError, HostError):
    """The ask would wait on itself (A asks B which asks A)."""

    code = "cycle"


class CircuitOpen(AgentError, GuestError):
    """Calls fail fast: the callee failed too often lately, so its circuit breaker is open.

    Raised by a send or ask to an agent whose supervisor opened the breaker, and by
    ``CircuitBreaker.check``. ``name`` is the breaker's (or the agent's address);
    ``retry_after`` the seconds until a probe call is let through (0 when a probe is already
    out, or not known).
    """

    kind = "circuit_open"
    code = "circuit-open"

    def __init__(self, message: str, *, name: str = "", retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.name = name
        self.retry_after = retry_after


CircuitOpenError = CircuitOpen
"""The former name of :class:`CircuitOpen`: the same class, so old ``except`` clauses work."""


class BadSpawn(AgentError, HostError):
    """The agent type is unknown or its init failed."""

    code = "bad-spawn"


@dataclass(frozen=True, slots=True)
class MailboxSettings:
    """A mailbox's bound and what happens when it is full."""

    capacity: int = 1024
    on_full: Literal["block", "drop", "fail"] = "block"
    block_timeout: float = 1.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """What happens to a message whose handler crashed its agent (a trap, a budget run out;
    not a cancel): it is delivered again, after the agent's restart, ``backoff`` seconds later
    (doubling each time, at most ``max_backoff``), until it has run ``attempts`` times in all
    or its asker's deadline would pass; then its asker hears the crash, and ``dead_letter`` (an
    address or name), when set, is sent ``dead_letter`` with ``{to, name, body, sender,
    reason, attempts}``. A retried message goes to the back of the mailbox. A durable agent's
    message keeps its journal row until it ends, so a crash of the process during the backoff
    retries it after the restart."""

    attempts: int = 3
    backoff: float = 0.1
    max_backoff: float = 10.0
    dead_letter: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not 1 <= self.attempts <= 100:
            raise BadInput(f"retry attempts must be within 1 and 100, got {self.attempts!r}")
        if not 0 <= self.backoff <= self.max_backoff <= 3600:
            raise BadInput(
                "retry backoff must satisfy 0 <= backoff <= max_backoff <= 3600 s, got "
                f"{self.backoff!r} and {self.max_backoff!r}"
            )
        if self.dead_letter is not None and not (0 < len(self.dead_letter) <= 1024):
            raise BadInput("retry dead_letter must be an address or a name")

    def delay(self, attempt: int) -> float:
        """The backoff before run ``attempt + 1`` (``attempt`` runs crashed so far)."""
        return float(min(self.max_backoff, self.backoff * 2 ** min(attempt - 1, 60)))


@dataclass(frozen=True, slots=True)
class Grants:
    """What an agent of a type may do beyond itself. The host (the Python API, ``[[start]]``)
    and the owner of the control socket hold every grant; an agent holds only these.

    ``spawn``: the agent types it may spawn (``"*"``: any); none by default.
    ``message``: the agent types or registered names it may send to or ask (``"*"``: any, the
    default; a remote address ``node:type:pid`` is checked by its type).
    ``inspect``: the agent types whose message bodies it may read with ``ask(x, "__inspect")``
    when the runtime's introspect switch is on; none by default.
    ``tools``: the capabilities it may call (names in the runtime's
    :class:`mighty.capabilities.Capabilities`); none by default.
    """

    spawn: frozenset[str] = frozenset()
    message: frozenset[str] = frozenset({"*"})
    inspect: frozenset[str] = frozenset()
    tools: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for what in ("spawn", "message", "inspect", "tools"):
            value = getattr(self, what)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise BadInput(f"grants: {what} is a set of names, got {value!r}")
            object.__setattr__(self, what, frozenset(value))

    def may_spawn(self, agent_type: str) -> bool:
        return "*" in self.spawn or agent_type in self.spawn

    def may_message(self, agent_type: str | None, name: str | None) -> bool:
        allowed = self.message
        return "*" in allowed or agent_type in allowed or name in allowed

    def may_inspect(self, agent_type: str | None) -> bool:
        return "*" in self.inspect or agent_type in self.inspect


@dataclass(frozen=True)
class AgentType:
    """A kind of agent: its component, protocol, budgets, mailbox and grants.

    ``accepts`` maps message names to a pydantic model validating the decoded body (or None
    for any body); when ``accepts`` is None the guest decides what it accepts.
    ``budget`` applies to each message; ``lifetime_fuel`` caps the fuel of the agent's life.
    """

    name: str
    component: Component
    accepts: Mapping[str, type[BaseModel] | None] | None = None
    budget: Budget = field(default_factory=Budget)
    lifetime_fuel: int | None = None
    mailbox: MailboxSettings = field(default_factory=MailboxSettings)
    policy: Policy = field(default_factory=Policy)
    hibernate_after: float | None = None
    """Seconds idle before an agent is hibernated (None: only ``Runtime.hibernate``)."""
    durable: bool = False
    """Store the state after every handled message; it outlives the runtime (a state_dir)."""
    cancellable: bool = True
    """False: a message's handler runs to its own budget even when its asker stops waiting
    or is cancelled (for handlers that must finish, e.g. one that moves money). True (the
    default): the handler of an ask ends by the asker's deadline and is cancelled with it;
    the agent then crashes (its state since the last checkpoint is lost, as for any stop
    mid-handler) and is restarted by its supervisor. ``Runtime.cancel`` applies either way."""
    grants: Grants = field(default_factory=Grants)
    """What its agents may spawn, message, inspect and call (:class:`Grants`)."""
    retry: RetryPolicy | None = None
    """Deliver a message that crashed its agent again (:class:`RetryPolicy`); None: never
    (its asker hears the crash at once; the supervisor restarts the agent either way)."""

    def __post_init__(self) -> None:
        if not self.name or ":" in self.name:
            raise BadInput(f"agent type names are non-empty and have no ':', got {self.name!r}")
        if self.hibernate_after is not None and not self.hibernate_after > 0:
            raise BadInput(f"hibernate_after must be > 0 seconds, got {self.hibernate_after}")


class AgentState(enum.StrEnum):
    """Where an agent is in its life (``AgentProcess.state``; ``mty inspect``'s ``state``).

    starting -> idle <-> scheduled <-> running; idle <-> hibernated (its state in the store);
    idle -> swapping -> idle (a hot swap holds its mailbox); running -> crashed (reported to its
    supervisor) -> starting (revived) or stopped; any -> stopped (for good: buried, or the
    runtime shut down).
    """

    STARTING = "starting"
    """Made, its instance not yet running ``init`` through (or being revived)."""
    IDLE = "idle"
    SCHEDULED = "scheduled"
    """Messages wait and a worker (or an asker, in place) will run its turn."""
    RUNNING = "running"
    """A handler runs now (``inspect``'s ``in_flight``)."""
    HIBERNATED = "hibernated"
    SWAPPING = "swapping"
    CRASHED = "crashed"
    """It crashed; its supervisor has not yet revived, stopped or retired it."""
    STOPPED = "stopped"


class Ask(NamedTuple):
    """One ask, as data: what ``Runtime.request``, the one path of an ask that waits for its
    reply, takes. Host code (``Runtime.ask``), a guest's ``ask`` import and a manifest's
    ``[[start]]`` asks all make one.

    Immutable (a tuple: 0.3 us to make, where a frozen dataclass takes 1.6 us on every ask).
    """

    to: str
    name: str
    body: bytes
    sender: str = "host"
    timeout: float | None = None
    """How long the asker waits (None: the target's per-message budget plus a grace)."""
    chain: tuple[str, ...] = ()
    """The addresses waiting on this reply, innermost last (cycle detection)."""
    scope: Scope | None = None
    """What the asker waits through: the asking guest call's scope (its deadline, cancel and
    signals apply while it waits), or a host caller's own; None: a plain wait."""
    within: float | None = None
    """How long the target's turn may take when the asking thread runs it in place (default
    ``timeout``)."""
    cancel: CancelScope | None = None
    """A scope of the asker's own that cancels the message."""


@dataclass(eq=False, slots=True)
class Envelope:
    """One message in a mailbox. ``reply`` is set for asks."""

    sender: str
    name: str
    body: bytes
    reply: Future[bytes | None] | None = None
    asker_chain: tuple[str, ...] = ()
    """The addresses waiting on this reply, innermost last (for cycle detection)."""
    trace: Any = None
    """Trace context from the sender (mighty.telemetry), None when telemetry is off."""
    journal: int | None = None
    """Its row in a durable agent's journaled inbox (see mighty.agents._journal)."""
    id: int = field(default_factory=itertools.count(1).__next__)
    """Unique in this process: the message's context id is ``msg-ID`` (``Runtime.cancel``)."""
    parent: RunContext | None = None
    """The context of the work that sent it (an asking agent's message, a tool, a run)."""
    deadline: float | None = None
    """When the asker stops waiting (``time.monotonic()``), None for a send."""
    cancel: CancelScope | None = None
    """A scope of the asker's own that cancels the message (``Runtime.ask(cancel=...)``)."""
    context: RunContext | None = None
    """The message's own context, made when its handler starts."""
    cancelled: str | None = None
    """Why it was cancelled while it waited in the mailbox (``Runtime.cancel``)."""
    attempts: int = 0
    """How many times its handler crashed the agent (``RetryPolicy``)."""
    retrying: bool = False
    """Waiting for another attempt (its journal row is kept)."""
    key: str | None = None
    """The sender's own id of the message, when it has one that outlives this process (a
    cluster durable message's id): an import journal kept outside the process finds the
    message's log by it (mighty.cluster's journal)."""

    @property
    def context_id(self) -> str:
        return f"msg-{self.id}"


@dataclass(frozen=True, slots=True)
class AgentEvent:
    """Something that happened to an agent: ``kind`` e.g. ``budget.exhausted``, ``log``."""

    kind: str
    address: str
    data: Mapping[str, Any]
    time: float = field(default_factory=time.time)
