"""A hot swap hands the running agent's snapshot to the new version's ``restore``: a snapshot
whose lowering (~80 host bytes a byte) the agent's memory budget cannot afford is refused before
it is lowered, and the old version keeps serving."""

from __future__ import annotations

from pathlib import Path

import pytest

from mighty import Budget, Component
from mighty.agents import AgentType, Runtime
from mighty.reload import ReloadFailed
from tests.reload.conftest import ROOT, _build


@pytest.mark.slow
def test_a_snapshot_the_budget_cannot_lower_fails_the_swap_and_the_old_version_serves(
    tmp_path: Path,
) -> None:
    """A kvstore holding a 1 MB value (~80 MB to lower) under a 64 MiB budget: ReloadFailed
    naming the host memory, the value still served by the running version."""
    wasm = _build(ROOT / "examples" / "agents" / "kvstore.py", tmp_path)
    budget = Budget(memory=64 << 20)
    with Runtime(workers=1) as rt:
        rt.register(AgentType("kv", Component.load(wasm), budget=budget))
        address = rt.spawn("kv")
        value = "x" * 1_000_000
        assert rt.ask(address, "put", {"key": "k", "value": value}) == {"ok": True}
        with pytest.raises(ReloadFailed, match="host memory"):
            rt.reload("kv", wasm)
        assert rt.ask(address, "get", {"key": "k"}) == {"value": value}
