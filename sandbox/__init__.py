"""mighty.sandbox: code mode (untrusted Python in a fresh wasm interpreter per run).

```python
from mighty.sandbox import Limits, Sandbox

def add(a: int, b: int) -> int:
    '''Add two numbers.'''
    return a + b

with Sandbox(tools=[add], limits=Limits(timeout=2.0)) as sandbox:
    result = sandbox.run("total = add(1, 2)\\ntotal * 10")
    assert result.ok and result.value == 30
```

See docs/sandbox.md for limits, error kinds, tools and the threat model.
"""

from mighty.budget import CancelScope, Progress, RunContext, current_context
from mighty.sandbox._api import MAX_STARTED_RUNS, Busy, RunHandle, Sandbox
from mighty.sandbox._interpreter import interpreter_component
from mighty.sandbox._packages import PackageError
from mighty.sandbox._results import (
    ERROR_KINDS,
    Artifact,
    Limits,
    OutputListener,
    RunError,
    RunResult,
    RunUsage,
)
from mighty.sandbox._sessions import Session
from mighty.sandbox._snapshot import (
    SnapshotCorrupt,
    SnapshotError,
    SnapshotMismatch,
    SnapshotTooLarge,
)
from mighty.sandbox._tools import Tool, ToolHost
from mighty.wasi import DirGrant, MemoryDir

__all__ = [
    "ERROR_KINDS",
    "MAX_STARTED_RUNS",
    "Artifact",
    "Busy",
    "CancelScope",
    "DirGrant",
    "Limits",
    "MemoryDir",
    "OutputListener",
    "PackageError",
    "Progress",
    "RunContext",
    "RunError",
    "RunHandle",
    "RunResult",
    "RunUsage",
    "Sandbox",
    "Session",
    "SnapshotCorrupt",
    "SnapshotError",
    "SnapshotMismatch",
    "SnapshotTooLarge",
    "Tool",
    "ToolHost",
    "current_context",
    "interpreter_component",
]
