"""What an instance needs of a recorder: two protocols, so that the trace layer can sit above.

``mighty.trace.Recorder`` implements them; ``mighty.trace`` in turn builds on instances (its
replayer runs a component again). Rejected: the instance importing the recorder (the two
packages would import each other).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from mighty.engine import Component
from mighty.gate import CallHook
from mighty.wasi import Policy

__all__ = ["RecordSink", "Recording"]


class Recording(CallHook, Protocol):
    """The recording of one instance: a gate hook for its imports, and its export calls.

    As a hook it may also define ``watch_import`` and ``tap_import`` (see ``CallHook``):
    ``mighty.trace``'s recording does, so the gate serves the imports it taps in one frame."""

    fuel_limit: int

    def begin_export(self, name: str, args: Sequence[Any], budget: dict[str, Any]) -> None: ...

    def end_export(
        self,
        name: str,
        result: Any,
        error: BaseException | None,
        fuel: int | None,
        memory_peak: int | None,
    ) -> None: ...

    def close(self, stdout: bytes, stderr: bytes) -> None: ...


class RecordSink(Protocol):
    """Where an instance's recording goes (``Instance(record=...)``): a trace being written."""

    def attach(
        self,
        component: Component,
        budget: dict[str, Any],
        policy: Policy,
        *,
        agent: str | None = None,
        name: str | None = None,
    ) -> Recording: ...
