"""Assertions shared by the sandbox tests."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from mighty.sandbox import RunResult, Sandbox


def json_values(size: int) -> st.SearchStrategy[Any]:
    """JSON-compatible values: what crosses into and out of the sandbox as data."""
    scalars = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text()
    )
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=size) | st.dictionaries(st.text(), children, max_size=size)
        ),
        max_leaves=size * 5,
    )


PROBE = "result = sorted(k for k in globals() if not k.startswith('__'))"


def failed(result: RunResult, kind: str) -> RunResult:
    """Assert ``result`` failed with ``kind``; return it."""
    assert not result.ok, result
    assert result.error is not None
    assert result.error.kind == kind, result.error
    assert result.value is None
    return result


def assert_clean(sandbox: Sandbox) -> None:
    """The next run works and sees nothing but its own fresh globals."""
    result = sandbox.run("result = 1 + 1")
    assert result.ok, result.error
    assert result.value == 2
    probe = sandbox.run(PROBE)
    assert probe.ok, probe.error
    assert probe.value == sorted(["ToolError", *sandbox.tools])
