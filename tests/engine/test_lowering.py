"""The host memory a large ``list<u8>`` argument takes while wasmtime lowers it (~80 bytes a
byte) is charged to the call's memory budget: a restore that would take more is refused first.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty import Budget, Component, OutOfMemory
from mighty.agents import AgentType, NoProc, Runtime
from mighty.engine import LOWERED_BYTES_PER_BYTE, check_lowering

ROOT = Path(__file__).resolve().parents[2]


@given(size=st.integers(0, 1 << 40), limit=st.integers(1, 1 << 40))
def test_a_lowering_is_refused_exactly_when_it_costs_more_than_the_budget(
    size: int, limit: int
) -> None:
    """check_lowering refuses iff size x LOWERED_BYTES_PER_BYTE > limit, with the figures."""
    needed = size * LOWERED_BYTES_PER_BYTE
    if needed <= limit:
        check_lowering(size, limit, "restore")
        return
    with pytest.raises(OutOfMemory) as info:
        check_lowering(size, limit, "restore")
    assert (info.value.limit, info.value.requested) == (limit, needed)
    assert "\n" not in str(info.value) and f"{size} bytes" in str(info.value)


@pytest.mark.slow
def test_a_wake_whose_state_the_budget_cannot_lower_is_refused_before_lowering(
    tmp_path: Path,
) -> None:
    """A stored 4 MiB state for the counter agent with a 64 MiB memory budget (~320 MiB to
    lower) is refused at the wake, and the stored row and the runtime stay as they were; it
    used to be lowered whole."""
    from mighty.build import build_component

    wasm = tmp_path / "counter.wasm"
    build_component(
        ROOT / "examples" / "agents" / "counter.py",
        output=wasm,
        wit=ROOT / "wit" / "agent",
        python_path=[ROOT / "guests" / "sdk"],
    )
    counter = Component.load(wasm)
    budget = Budget(memory=64 << 20)
    with Runtime(workers=1, state_dir=tmp_path / "state") as rt:
        rt.register(AgentType("counter", counter, budget=budget))
        address = rt.spawn("counter")
        assert rt.ask(address, "incr", {"by": 2})["count"] == 2
        assert rt.hibernate(address)
        assert rt.hibernation is not None
        store = rt.hibernation.store
        row = store.get(address)
        assert row is not None
        store.put(dataclasses.replace(row, state=bytes(4 << 20)))
        with pytest.raises(NoProc, match="host memory"):
            rt.ask(address, "get")
        stored = store.get(address)
        assert stored is not None and len(stored.state) == 4 << 20
        other = rt.spawn("counter")
        assert rt.ask(other, "incr", {"by": 3})["count"] == 3
