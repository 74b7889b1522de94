"""A replay divergence names the part that differs, not two whole internal records."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mighty.trace import NondeterminismError, replay_trace
from mighty.trace._replay import _difference, _mismatch
from tests.trace.test_replay import random_sum, record


def test_changed_result_names_the_field(wat: Callable[[str], bytes], tmp_path: Path) -> None:
    """A build returning another value: the message says `res differs` with the two values."""
    trace = tmp_path / "t.bin"
    record(trace, random_sum(wat, tmp_path, "v1"), [("run", (2,))])
    with pytest.raises(NondeterminismError) as info:
        replay_trace(trace, substitute=random_sum(wat, tmp_path, "v3", xor=1))
    message = info.value.message
    assert "result of run: res differs: the trace has " in message
    assert "'ok'" not in message
    assert info.value.expected["ok"] is True  # the whole records are still on the error


def test_nested_difference_is_a_path() -> None:
    """Inside records and lists the path leads to the differing leaf."""
    want = {"ok": True, "res": {"words": ["a", "b", "c"], "total": 3}, "error": None}
    got = {"ok": True, "res": {"words": ["a", "B", "c"], "total": 3}, "error": None}
    error = _mismatch(1, 4, "result of stats", want, got)
    assert error.message == (
        "instance 1 step 4: result of stats: res.words[1] differs: the trace has 'b', "
        "the replay gave 'B'"
    )
    assert _difference([1, 2], [1, 2, 3]) == ("length", 2, 3)
    assert _difference({"a": 1}, {"b": 1}) == ("a", 1, "(absent)")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(_json, _json)
def test_difference_is_none_exactly_when_equal(a: object, b: object) -> None:
    """No difference is found for equal values, and one is found for unequal ones."""
    assert _difference(a, a) is None
    assert (_difference(a, b) is None) == (a == b)
