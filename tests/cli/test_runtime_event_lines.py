"""`mty run`'s event lines: what an agent emit()s vs what the runtime did to it."""

from __future__ import annotations

import pytest

from mighty.agents import AgentEvent
from mighty.cli._run import _EventWriter


def test_runtime_events_do_not_pass_for_the_agents(capsys: pytest.CaptureFixture[str]) -> None:
    """A durable agent waking is the runtime's line; an emit() keeps the agent's prefix."""
    write = _EventWriter(0)
    write(AgentEvent("agent.woke", "quotes:1", {}))
    write(AgentEvent("agent.hibernated", "quotes:1", {}))
    write(AgentEvent("agent.woke", "quotes:1", {"body": {"n": 1}}))  # the guest's own "woke"
    assert capsys.readouterr().err.splitlines() == [
        "mty: quotes:1 woke",
        "mty: quotes:1 hibernated",
        '[quotes:1] event woke {"n": 1}',
    ]
