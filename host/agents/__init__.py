"""Agents: components as supervised actors with mailboxes that send and ask one another.

What agent authors and applications use. The parts the layers above the runtime are built
from (mailboxes, the scheduler, the snapshot store, the manifest's pieces, output plumbing)
are in :mod:`mighty.agents.hosting`.
"""

from mighty.agents._application import Application, RunReport, StartReply, run_manifest
from mighty.agents._compose import broadcast, pipe
from mighty.agents._hibernate import HibernationStats
from mighty.agents._history import (
    AgentHistory,
    ForkRefused,
    HistoryEntry,
    JournalCorrupt,
    UnknownAgent,
    fork_agent,
    read_history,
)
from mighty.agents._introspect import INSPECT, SNAPSHOT_VERSION
from mighty.agents._manifest import Manifest, load_manifest
from mighty.agents._output import AgentOutput
from mighty.agents._process import AgentProcess, AgentStats, decode_body, encode_body
from mighty.agents._runtime import Runtime
from mighty.agents._store import (
    BadStateDir,
    SnapshotCorrupt,
    SnapshotRefused,
    StoreError,
    StoreUnavailable,
)
from mighty.agents._supervisor import (
    ChildSpec,
    CircuitBreaker,
    Supervisor,
    SupervisorEvent,
    SupervisorFailed,
    SupervisorStartFailed,
)
from mighty.agents._timers import BadTimer, Timer
from mighty.agents._tree import AgentChild, BreakerSettings, SupervisorSpec, start_tree
from mighty.agents._types import (
    AgentCrashed,
    AgentError,
    AgentEvent,
    AgentState,
    AgentType,
    AskCycle,
    AskTimeout,
    BadSpawn,
    CircuitOpen,
    CircuitOpenError,
    Grants,
    HandlerFailed,
    MailboxFullError,
    MailboxSettings,
    MessageCancelled,
    MessageDropped,
    NoProc,
    Refused,
    RetryPolicy,
)

__all__ = [
    "INSPECT",
    "SNAPSHOT_VERSION",
    "AgentChild",
    "AgentCrashed",
    "AgentError",
    "AgentEvent",
    "AgentHistory",
    "AgentOutput",
    "AgentProcess",
    "AgentState",
    "AgentStats",
    "AgentType",
    "Application",
    "AskCycle",
    "AskTimeout",
    "BadSpawn",
    "BadStateDir",
    "BadTimer",
    "BreakerSettings",
    "ChildSpec",
    "CircuitBreaker",
    "CircuitOpen",
    "CircuitOpenError",
    "ForkRefused",
    "Grants",
    "HandlerFailed",
    "HibernationStats",
    "HistoryEntry",
    "JournalCorrupt",
    "MailboxFullError",
    "MailboxSettings",
    "Manifest",
    "MessageCancelled",
    "MessageDropped",
    "NoProc",
    "Refused",
    "RetryPolicy",
    "RunReport",
    "Runtime",
    "SnapshotCorrupt",
    "SnapshotRefused",
    "StartReply",
    "StoreError",
    "StoreUnavailable",
    "Supervisor",
    "SupervisorEvent",
    "SupervisorFailed",
    "SupervisorSpec",
    "SupervisorStartFailed",
    "Timer",
    "UnknownAgent",
    "broadcast",
    "decode_body",
    "encode_body",
    "fork_agent",
    "load_manifest",
    "pipe",
    "read_history",
    "run_manifest",
    "start_tree",
]
