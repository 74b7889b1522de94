"""The parts of the agent runtime that the layers above it are built from: what
mighty.control, mighty.cluster, mighty.serve and the CLI use, and what an embedder assembling a
host of its own (a node of another cluster, a different front) may use too.

Mailboxes and their errors, the scheduler and its counters, an envelope as the runtime queues
it, the snapshot store and hibernator, the remote router protocol a cluster implements, output
plumbing (line splitting, the bounded tail, log levels), and the pieces of a manifest that an
application object puts together (its types, capabilities, supervisor spec, state directory,
start messages, summary, trace export).

Rejected: keeping them in ``mighty.agents.__all__`` (81 names, most of which an agent author
never needs: the package's surface should be what a user writes against) and leaving them
importable only from private modules (the layers above may not reach private modules of
another package).
"""

from __future__ import annotations

from mighty.agents._application import (
    run_summary,
    send_start_messages,
    telemetry_from,
)
from mighty.agents._hibernate import (
    Hibernator,
)
from mighty.agents._history import (
    export_trace,
)
from mighty.agents._introspect import (
    jsonable,
)
from mighty.agents._mailbox import (
    Mailbox,
    MailboxClosed,
    MailboxEmpty,
    MailboxFull,
)
from mighty.agents._manifest import (
    agent_types,
    capabilities,
    state_dir,
    supervisor_spec,
)
from mighty.agents._output import (
    LOG_LEVELS,
    LineSplitter,
    OutputTail,
    level_number,
)
from mighty.agents._runtime import (
    RemoteRouter,
)
from mighty.agents._scheduler import (
    Scheduler,
    WorkerStats,
)
from mighty.agents._store import (
    SnapshotStore,
    StoredSnapshot,
)
from mighty.agents._types import (
    Envelope,
)

__all__ = [
    "LOG_LEVELS",
    "Envelope",
    "Hibernator",
    "LineSplitter",
    "Mailbox",
    "MailboxClosed",
    "MailboxEmpty",
    "MailboxFull",
    "OutputTail",
    "RemoteRouter",
    "Scheduler",
    "SnapshotStore",
    "StoredSnapshot",
    "WorkerStats",
    "agent_types",
    "capabilities",
    "export_trace",
    "jsonable",
    "level_number",
    "run_summary",
    "send_start_messages",
    "state_dir",
    "supervisor_spec",
    "telemetry_from",
]
