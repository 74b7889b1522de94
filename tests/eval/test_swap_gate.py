"""runtime.reload(..., verify=suite): the suite runs before anything pauses; a failure refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from mighty import Component
from mighty.agents import AgentChild, AgentType, Runtime, SupervisorSpec, start_tree
from mighty.eval import Case, Equal, Suite
from mighty.reload import ReloadRefused
from tests.eval.conftest import EXAMPLE


@pytest.mark.slow
def test_reload_verify_refuses_failing_cells_and_swaps_passing(
    example_wasm: dict[str, Path],
) -> None:
    """The regression is refused naming its cell (the old component stays); the refactor swaps."""
    suite = Suite([Case("traffic", EXAMPLE / "traces" / "assistant.bin")], [], [Equal()])
    with Runtime(workers=2) as rt:
        old = Component.load(example_wasm["assistant"])
        rt.register(AgentType("assistant", old))
        start_tree(rt, SupervisorSpec("root", [AgentChild("assistant", "assistant")]))
        with pytest.raises(ReloadRefused) as refused:
            rt.reload("assistant", example_wasm["assistant_regression"], verify=suite)
        assert refused.value.problems == ("traffic: fail: equal(result): result differs",)
        assert rt.agent_type("assistant").component.sha256 == old.sha256
        assert not list(rt.events_of("reload.rolled_back"))  # refused before any pause
        report = rt.reload("assistant", example_wasm["assistant_refactor"], verify=suite)
        assert report.agents == [rt.whereis("assistant")]
        assert rt.agent_type("assistant").component.sha256 == report.new_component
