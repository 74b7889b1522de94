"""The public names of each package are explicit, resolve, and are pinned here."""

from __future__ import annotations

import importlib

import pytest

PINNED = {
    "mighty": {
        "ArgumentError", "BadInput", "Budget", "BudgetExceeded", "BuildError", "CancelScope",
        "Cancelled", "Closed", "CompileError", "Component", "DeadlineExceeded", "Err",
        "ExportNotFound", "GuestError", "GuestExit", "GuestTrap", "HostError", "Instance",
        "InvalidComponent", "MightyError", "MissingImports", "Misuse", "Ok", "OutOfFuel",
        "OutOfMemory", "RunContext", "Some", "Usage", "Variant", "WrongType", "__version__",
        "call_once", "current_context",
    },
    "mighty.agents": {
        "AgentChild", "AgentCrashed", "AgentError", "AgentEvent", "AgentHistory", "AgentOutput",
        "AgentProcess", "AgentState", "AgentStats", "AgentType", "Application", "AskCycle",
        "AskTimeout", "BadSpawn", "BadStateDir", "BadTimer", "BreakerSettings", "ChildSpec",
        "CircuitBreaker",
        "CircuitOpen", "CircuitOpenError", "ForkRefused", "Grants", "HandlerFailed",
        "HibernationStats", "HistoryEntry", "INSPECT", "JournalCorrupt", "MailboxFullError",
        "MailboxSettings", "Manifest", "MessageCancelled", "MessageDropped", "NoProc", "Refused", "RetryPolicy",
        "RunReport", "Runtime", "SNAPSHOT_VERSION", "SnapshotCorrupt", "SnapshotRefused",
        "StartReply", "StoreError", "StoreUnavailable", "Supervisor", "SupervisorEvent",
        "SupervisorFailed", "SupervisorSpec", "SupervisorStartFailed", "Timer", "UnknownAgent",
        "broadcast",
        "decode_body", "encode_body", "fork_agent", "load_manifest", "pipe", "read_history",
        "run_manifest", "start_tree",
    },
    "mighty.agents.hosting": {
        "Envelope", "Hibernator", "LOG_LEVELS", "LineSplitter", "Mailbox", "MailboxClosed",
        "MailboxEmpty", "MailboxFull", "OutputTail", "RemoteRouter", "Scheduler", "SnapshotStore",
        "StoredSnapshot", "WorkerStats", "agent_types", "capabilities", "export_trace", "jsonable",
        "level_number", "run_summary", "send_start_messages", "state_dir", "supervisor_spec",
        "telemetry_from",
    },
    "mighty.reload": {
        "Compatibility", "FieldInfo", "ReloadFailed", "ReloadRefused", "ReloadReport",
        "SchemaError", "StateSchema", "SwapVerifier", "check_compatible", "parse_schema",
    },
}  # fmt: skip

PACKAGES = [
    "mighty",
    "mighty.abi",
    "mighty.agents",
    "mighty.agents.hosting",
    "mighty.budget",
    "mighty.capabilities",
    "mighty.build",
    "mighty.cli",
    "mighty.cluster",
    "mighty.control",
    "mighty.engine",
    "mighty.eval",
    "mighty.gate",
    "mighty.instance",
    "mighty.reload",
    "mighty.sandbox",
    "mighty.sandbox.mcp",
    "mighty.serve",
    "mighty.telemetry",
    "mighty.trace",
    "mighty.wasi",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_resolves(name: str) -> None:
    """Each package declares __all__ and every name in it exists."""
    module = importlib.import_module(name)
    exported = module.__all__
    assert exported, name
    assert len(set(exported)) == len(exported)
    for item in exported:
        assert hasattr(module, item), f"{name}.{item}"


@pytest.mark.parametrize("name", sorted(PINNED))
def test_pinned_names(name: str) -> None:
    """The top-level API does not change by accident."""
    assert set(importlib.import_module(name).__all__) == PINNED[name]
