"""What a hot swap checks against and reports: the verifier protocol, the report, the errors.

The swap itself is ``Runtime.reload`` (``mighty.agents``, which builds on this package).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mighty._errors import HostError
from mighty.engine import Component

__all__ = ["ReloadFailed", "ReloadRefused", "ReloadReport", "SwapVerifier"]


class SwapVerifier(Protocol):
    """Checks a new component before a swap (``mighty.eval.Suite`` is one): the cells that
    failed, as lines; empty when the component may take over."""

    def verify_swap(self, agent_type: str, component: Component) -> Sequence[str]: ...


class ReloadRefused(HostError):
    """The new version cannot take over the old state; ``problems`` names the fields at fault."""

    kind = "reload_refused"

    def __init__(self, message: str, *, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems


class ReloadFailed(HostError):
    """The swap started and was rolled back; every agent runs its old version."""

    kind = "reload_failed"


@dataclass
class ReloadReport:
    """A confirmed swap: what changed, how many agents, how long each was paused."""

    agent_type: str
    old_component: str
    new_component: str
    agents: list[str]
    migration: bool
    pauses: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "agent_type": self.agent_type,
            "old_component": self.old_component,
            "new_component": self.new_component,
            "agents": self.agents,
            "migration": self.migration,
            "max_pause_ms": round(max(self.pauses, default=0.0) * 1e3, 3),
        }
