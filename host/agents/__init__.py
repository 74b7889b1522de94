"""Agents: components as supervised actors with mailboxes that send and ask one another."""

from mighty.agents._compose import broadcast, pipe
from mighty.agents._introspect import INSPECT, SNAPSHOT_VERSION
from mighty.agents._mailbox import Mailbox, MailboxClosed, MailboxEmpty, MailboxFull
from mighty.agents._output import (
    LOG_LEVELS,
    AgentOutput,
    LineSplitter,
    OutputTail,
    level_number,
)
from mighty.agents._runtime import AgentProcess, AgentStats, Runtime, decode_body, encode_body
from mighty.agents._scheduler import Scheduler, WorkerStats
from mighty.agents._supervisor import (
    ChildSpec,
    CircuitBreaker,
    CircuitOpen,
    Supervisor,
    SupervisorEvent,
    SupervisorFailed,
    SupervisorStartFailed,
)
from mighty.agents._tree import AgentChild, BreakerSettings, SupervisorSpec, start_tree
from mighty.agents._types import (
    AgentCrashed,
    AgentError,
    AgentEvent,
    AgentType,
    AskCycle,
    AskTimeout,
    BadSpawn,
    CircuitOpenError,
    Envelope,
    HandlerFailed,
    MailboxFullError,
    MailboxSettings,
    NoProc,
    Refused,
)

__all__ = [
    "INSPECT",
    "LOG_LEVELS",
    "SNAPSHOT_VERSION",
    "AgentChild",
    "AgentCrashed",
    "AgentError",
    "AgentEvent",
    "AgentOutput",
    "AgentProcess",
    "AgentStats",
    "AgentType",
    "AskCycle",
    "AskTimeout",
    "BadSpawn",
    "BreakerSettings",
    "ChildSpec",
    "CircuitBreaker",
    "CircuitOpen",
    "CircuitOpenError",
    "Envelope",
    "HandlerFailed",
    "LineSplitter",
    "Mailbox",
    "MailboxClosed",
    "MailboxEmpty",
    "MailboxFull",
    "MailboxFullError",
    "MailboxSettings",
    "NoProc",
    "OutputTail",
    "Refused",
    "Runtime",
    "Scheduler",
    "Supervisor",
    "SupervisorEvent",
    "SupervisorFailed",
    "SupervisorSpec",
    "SupervisorStartFailed",
    "WorkerStats",
    "broadcast",
    "decode_body",
    "encode_body",
    "level_number",
    "pipe",
    "start_tree",
]
