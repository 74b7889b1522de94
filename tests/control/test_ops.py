"""The inspect and top ops over a real control socket and runtime; top's rates and sorting."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty import Component
from mighty._errors import BadInput
from mighty.agents import AgentType, Runtime
from mighty.control import (
    SORT_KEYS,
    ControlError,
    ControlServer,
    request,
    runtime_ops,
    sort_rows,
    top_rows,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(wat) -> Iterator[tuple[Runtime, Path]]:  # type: ignore[no-untyped-def]
    """A runtime with one echo agent, its inspect/top ops on a socket."""
    echo = Component.load(wat((ROOT / "tests" / "fixtures" / "echo_agent.wat").read_text()))
    with tempfile.TemporaryDirectory(prefix="mty-ops-", dir="/tmp") as name:
        os.chmod(name, 0o700)
        path = Path(name) / "c.sock"
        with Runtime(workers=1) as rt, ControlServer(path, runtime_ops(rt)):
            rt.register(AgentType("echo", echo))
            rt.spawn("echo", name="e")
            yield rt, path


def test_ops_answer_and_validate(served: tuple[Runtime, Path]) -> None:
    """inspect (one, all), top; bad arguments and unknown agents are typed error replies."""
    rt, path = served
    rt.ask("e", "x", 1)
    one = request(path, "inspect", {"agent": "e"})
    assert (one["version"], one["name"], one["handled"]) == (1, "e", 1)
    assert [a["name"] for a in request(path, "inspect")["agents"]] == ["e"]
    assert request(path, "top")["agents"][0]["handled"] == 1
    for args, kind in (
        ({"agent": 5}, "bad_input"),
        ({"agent": "x" * 300}, "bad_input"),
        ({"agent": ""}, "bad_input"),
        ({"agent": "e", "extra": 1}, "bad_input"),
        ({"agent": "nobody"}, "noproc"),
    ):
        with pytest.raises(ControlError) as caught:
            request(path, "inspect", args)
        assert caught.value.kind == kind, args
    with pytest.raises(ControlError, match="no arguments"):
        request(path, "top", {"sort": "x"})


_frame_agents = st.lists(
    st.fixed_dictionaries(
        {
            "handled": st.integers(0, 10**6),
            "failed": st.integers(0, 10**6),
            "fuel": st.integers(0, 10**12),
            "mailbox": st.integers(0, 1000),
            "memory": st.integers(0, 1 << 32),
            "restarts": st.integers(0, 10),
            "state": st.sampled_from(["idle", "running"]),
            "type": st.sampled_from(["a", "b"]),
        }
    ),
    max_size=6,
)


@given(_frame_agents, _frame_agents, st.floats(0.0, 10.0), st.sampled_from(SORT_KEYS))
def test_rates_are_never_negative_and_sorting_is_a_permutation(
    before: list[dict[str, object]], after: list[dict[str, object]], dt: float, key: str
) -> None:
    """Counters that went down (a restart) or no time passing never give negative rates."""
    first = {"time": 1.0, "agents": [{**a, "address": f"a:{i}"} for i, a in enumerate(before)]}
    second = {"time": 1.0 + dt, "agents": [{**a, "address": f"a:{i}"} for i, a in enumerate(after)]}
    rows = top_rows(first, second)
    assert len(rows) == len(after)
    assert all(r["msgs_per_s"] >= 0 and r["fuel_per_s"] >= 0 for r in rows)
    ordered = sort_rows(rows, key)
    assert sorted(r["address"] for r in ordered) == sorted(r["address"] for r in rows)
    with pytest.raises(BadInput):
        sort_rows(rows, "colour")
